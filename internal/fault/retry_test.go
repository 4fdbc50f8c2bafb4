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
