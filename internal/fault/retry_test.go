package fault

import (
	"context"
	"database/sql"
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

// rows is a statement's result: n rows affected.
type rows int64

func (r rows) LastInsertId() (int64, error) { return 0, nil }
func (r rows) RowsAffected() (int64, error) { return int64(r), nil }

var quick = Budget{Backoff: func(int) time.Duration { return time.Millisecond }}

// Send resends what Retry would, counts each send whose outcome is unknown,
// tells Retried each failed send that may go again, returns the first
// success's result, and ends on the row-busy rule and on Closed.
func TestSend(t *testing.T) {
	errClosed := errors.New("closed")
	for _, tc := range []struct {
		name    string
		acquire bool
		closed  bool          // Closed returns errClosed
		until   time.Duration // Sending.Until from now, when set
		replies []error       // each send's error; nil sends the result
		sends   int           // how many sends are made
		unknown int           // how many of them may have committed
		retried int           // failed sends told to Retried
		want    error         // Send's error
	}{
		{"at once", false, false, 0, []error{nil}, 1, 0, 0, nil},
		{"lost, then applied", false, false, 0, []error{mysql.ErrInvalidConn, nil}, 2, 1, 1, nil},
		{"lost every time", false, false, 0, []error{mysql.ErrInvalidConn, mysql.ErrInvalidConn, mysql.ErrInvalidConn, mysql.ErrInvalidConn, nil}, MaxTransientAttempts, MaxTransientAttempts, MaxTransientAttempts, mysql.ErrInvalidConn},
		{"rolled back, then applied", false, false, 0, []error{mysqlerr.Deadlock, mysqlerr.Deadlock, nil}, 3, 0, 2, nil},
		{"rolled back past until", false, false, time.Millisecond, []error{mysqlerr.Deadlock, mysqlerr.Deadlock, nil}, 1, 0, 1, mysqlerr.Deadlock},
		{"late by the session's clock, then applied", false, false, 0, []error{mysqlerr.GuardClock, nil}, 2, 0, 1, nil},
		{"final", false, false, 0, []error{mysqlerr.Syntax, nil}, 1, 0, 0, mysqlerr.Syntax},
		{"refused", false, false, 0, []error{mysqlerr.ReadOnly, nil}, 1, 0, 0, mysqlerr.ReadOnly},
		// An acquire whose row stayed locked past its bound is not sent
		// again: it returns the server's 1205.
		{"acquire's row busy", true, false, 0, []error{mysqlerr.LockWait, nil}, 1, 0, 0, mysqlerr.LockWait},
		{"another statement's lock wait", false, false, 0, []error{mysqlerr.LockWait, nil}, 2, 0, 1, nil},
		{"closed", false, true, 0, []error{mysql.ErrInvalidConn, nil}, 1, 1, 1, errClosed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := Sending{Budget: quick, Acquire: tc.acquire, Classify: Classify}
			if tc.until > 0 {
				s.Until = time.Now().Add(tc.until)
			}
			retried := 0
			s.Retried = func(error) { retried++ }
			s.Closed = func() error {
				if tc.closed {
					return errClosed
				}
				return nil
			}
			sends := 0
			res, unknown, err := Send(context.Background(), s, func() (sql.Result, error) {
				e := tc.replies[sends]
				sends++
				if e != nil {
					return nil, e
				}
				return rows(1), nil
			})
			if !errors.Is(err, tc.want) && err != tc.want {
				t.Fatalf("err: got %v, want %v", err, tc.want)
			}
			if sends != tc.sends || unknown != tc.unknown || retried != tc.retried {
				t.Errorf("sends, unknown, retried: got %d, %d, %d, want %d, %d, %d", sends, unknown, retried, tc.sends, tc.unknown, tc.retried)
			}
			if (err == nil) != (res != nil) {
				t.Errorf("result: got %v with error %v, want a result exactly when there is no error", res, err)
			}
		})
	}
}

// A context that ends while a statement is on its way makes the driver cut
// the connection: that send's outcome is unknown, and Send stops.
func TestSend_contextEnded(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	s := Sending{Budget: quick, Classify: Classify, Retried: func(error) {}, Closed: func() error { return nil }}
	sends := 0
	_, unknown, err := Send(ctx, s, func() (sql.Result, error) {
		sends++
		cancel()
		return nil, context.Canceled
	})
	if !errors.Is(err, context.Canceled) || sends != 1 || unknown != 1 {
		t.Errorf("got %v after %d sends, %d unknown; want %v after 1, 1 unknown", err, sends, unknown, context.Canceled)
	}
}
