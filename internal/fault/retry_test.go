package fault

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock/internal/mysqlerr"
)

// Retry sends again after a rollback until the call succeeds, after a
// broken connection or the session guard's clock refusal at most
// MaxTransientAttempts times in all, and never after a final error or
// another refusal; until ends the rollbacks' budget.
func TestRetry(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		errs  []error // what each send returns; nil once it succeeds
		until time.Duration
		sends int
		want  error
	}{
		{"rolled back twice", []error{mysqlerr.Deadlock, mysqlerr.LockWait, nil}, 0, 3, nil},
		{"broken every time", []error{mysql.ErrInvalidConn, mysql.ErrInvalidConn, mysql.ErrInvalidConn, mysql.ErrInvalidConn, mysql.ErrInvalidConn}, 0, MaxTransientAttempts, mysql.ErrInvalidConn},
		{"final", []error{mysqlerr.Syntax, nil}, 0, 1, mysqlerr.Syntax},
		{"refused", []error{mysqlerr.ReadOnly, nil}, 0, 1, mysqlerr.ReadOnly},
		{"started late twice", []error{mysqlerr.GuardClock, mysqlerr.GuardClock, nil}, 0, 3, nil},
		{"a clock of the session's own", []error{mysqlerr.GuardClock, mysqlerr.GuardClock, mysqlerr.GuardClock, mysqlerr.GuardClock, nil}, 0, MaxTransientAttempts, mysqlerr.GuardClock},
		{"autocommit off", []error{mysqlerr.GuardAutocommit, nil}, 0, 1, mysqlerr.GuardAutocommit},
		{"rolled back past until", []error{mysqlerr.Deadlock, mysqlerr.Deadlock, mysqlerr.Deadlock, mysqlerr.Deadlock, mysqlerr.Deadlock, mysqlerr.Deadlock, mysqlerr.Deadlock, mysqlerr.Deadlock, mysqlerr.Deadlock, nil}, time.Millisecond, 1, mysqlerr.Deadlock},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var until time.Time
			if tc.until > 0 {
				until = time.Now().Add(tc.until)
			}
			sends := 0
			err := Retry(ctx, until, func() error {
				e := tc.errs[sends]
				sends++
				return e
			})
			if sends != tc.sends || !errors.Is(err, tc.want) && err != tc.want {
				t.Errorf("got %d sends and %v, want %d and %v", sends, err, tc.sends, tc.want)
			}
		})
	}
}

// Backoff draws each pause from the upper half of its step, doubling from
// about a millisecond up to MaxBackoff.
func TestBackoff(t *testing.T) {
	for attempt := 1; attempt < 12; attempt++ {
		step := min(time.Millisecond<<attempt, MaxBackoff)
		for range 50 {
			if d := Backoff(attempt); d < step/2 || d > step {
				t.Fatalf("Backoff(%d): got %v, want %v to %v", attempt, d, step/2, step)
			}
		}
	}
}

// A Budget's Max ends the rollbacks' resends, its Backoff paces them, a
// context's sooner deadline ends them too, and the zero Budget is the
// library's.
func TestBudget_Retry(t *testing.T) {
	deadlocks := func(sends *int) func() error {
		return func() error { *sends++; return mysqlerr.Deadlock }
	}
	t.Run("max", func(t *testing.T) {
		var pauses []int
		b := Budget{Max: 50 * time.Millisecond, Backoff: func(attempt int) time.Duration {
			pauses = append(pauses, attempt)
			return 10 * time.Millisecond
		}}
		sends := 0
		start := time.Now()
		err := b.Retry(context.Background(), time.Time{}, deadlocks(&sends))
		if took := time.Since(start); !errors.Is(err, mysqlerr.Deadlock) || took > 2*time.Second {
			t.Fatalf("got %v after %v, want %v within the 50ms budget", err, took, mysqlerr.Deadlock)
		}
		// Each pause that fits is taken: 10ms each, within 50ms.
		if sends < 2 || sends > 6 || len(pauses) != sends {
			t.Errorf("got %d sends and pauses for attempts %v, want 2 to 6 sends, each but the last followed by a pause asked for", sends, pauses)
		}
		for i, a := range pauses {
			if a != i+1 {
				t.Fatalf("pauses asked for attempts %v, want 1, 2, ...", pauses)
			}
		}
	})
	t.Run("context deadline", func(t *testing.T) {
		b := Budget{Backoff: func(int) time.Duration { return time.Millisecond }}
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		sends := 0
		start := time.Now()
		err := b.Retry(ctx, time.Time{}, deadlocks(&sends))
		if took := time.Since(start); !errors.Is(err, mysqlerr.Deadlock) || took > 2*time.Second || sends < 2 {
			t.Fatalf("got %v after %v and %d sends, want %v within the deadline after several", err, took, sends, mysqlerr.Deadlock)
		}
	})
	t.Run("zero", func(t *testing.T) {
		var b Budget
		if b.max() != MaxRetryBudget {
			t.Errorf("max: got %v, want %v", b.max(), MaxRetryBudget)
		}
		for attempt := 1; attempt < 8; attempt++ {
			step := min(time.Millisecond<<attempt, MaxBackoff)
			if d := b.backoff(attempt); d < step/2 || d > step {
				t.Fatalf("backoff(%d): got %v, want %v to %v", attempt, d, step/2, step)
			}
		}
	})
}
