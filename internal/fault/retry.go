package fault

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// MaxTransientAttempts bounds how often one operation sends its statement
// when the connection breaks: the server may be gone, and each attempt may
// wait for a connection.
const MaxTransientAttempts = 4

// MaxRetryBudget bounds how long one operation goes on sending its statement
// while the server rolls it back (deadlocks, cluster certification
// conflicts), when its context has no sooner deadline.
const MaxRetryBudget = 5 * time.Second

// A Budget is how long Retry goes on sending while the server rolls a
// statement back, and how long it waits between sends. The zero value is
// the library's: MaxRetryBudget and Backoff. A Client carries one, so that
// tests that only wait on it can make it short.
type Budget struct {
	Max     time.Duration                   // MaxRetryBudget when 0
	Backoff func(attempt int) time.Duration // Backoff when nil
}

func (b Budget) max() time.Duration {
	if b.Max > 0 {
		return b.Max
	}
	return MaxRetryBudget
}

func (b Budget) backoff(attempt int) time.Duration {
	if b.Backoff != nil {
		return b.Backoff(attempt)
	}
	return Backoff(attempt)
}

// Transient runs f, which changes nothing on the server (a prepare, a
// read), again while it fails with a broken connection or a rollback, as
// retry does.
func Transient(ctx context.Context, f func() error) error {
	return Budget{}.Retry(ctx, time.Time{}, f)
}

// Retry is [Budget.Retry] with the library's budget.
func Retry(ctx context.Context, until time.Time, f func() error) error {
	return Budget{}.Retry(ctx, until, f)
}

// Retry runs f again while it fails in a way the same statement may get
// past at once: a rollback (deadlock, lock wait timeout, cluster
// certification conflict) until the budget ends, a broken connection or the
// session guard's clock refusal (ClockGuard) up to MaxTransientAttempts
// times. The budget ends at ctx's deadline, at until
// if that is sooner and set, and at the latest b's Max from now; a
// pause that would end past it is not taken. A refusal (a read-only
// server, no server) is returned at once: a failover outlasts any pause
// here, and the loops that keep trying (Acquire, Elect, the keep-alive)
// pace themselves.
func (b Budget) Retry(ctx context.Context, until time.Time, f func() error) error {
	return b.retry(ctx, until, false, f)
}

// RetryRolledBack is [Budget.RetryRolledBack] with the library's budget.
func RetryRolledBack(ctx context.Context, f func() error) error {
	return Budget{}.RetryRolledBack(ctx, f)
}

// RetryRolledBack runs f, a statement on a connection of the caller's own
// (a proof's step), again only while the server rolls it back, within b's
// Max: any other failure, a broken connection too, is returned at once,
// for the caller to begin again on another connection.
func (b Budget) RetryRolledBack(ctx context.Context, f func() error) error {
	return b.retry(ctx, time.Time{}, true, f)
}

// retry is Retry, or RetryRolledBack when rolledBackOnly is set.
func (b Budget) retry(ctx context.Context, until time.Time, rolledBackOnly bool, f func() error) error {
	budget := time.Now().Add(b.max())
	if d, ok := ctx.Deadline(); ok && d.Before(budget) && !rolledBackOnly {
		budget = d
	}
	if !until.IsZero() && until.Before(budget) {
		budget = until
	}
	broken, late := 0, 0
	var last error // of the attempt before, for when ctx cuts this one
	for attempt := 1; ; attempt++ {
		err := f()
		if err == nil {
			return nil
		}
		if rolledBackOnly && Classify(err) != RolledBack {
			return err
		}
		switch Classify(err) {
		case Refused:
			// The session guard's clock test also refuses a statement that
			// only started late, which sent again may not: as a broken
			// connection, a few times.
			if ClockGuard(err) {
				if late++; late < MaxTransientAttempts {
					break
				}
			}
			fallthrough
		case Final:
			if last != nil && ctx.Err() != nil {
				return fmt.Errorf("%w (last error: %w)", err, last)
			}
			return err
		case Unknown:
			if broken++; broken >= MaxTransientAttempts {
				return err
			}
		}
		wait := b.backoff(attempt)
		if time.Now().Add(wait).After(budget) {
			return err
		}
		if werr := Sleep(ctx, wait); werr != nil {
			return fmt.Errorf("%w (last error: %w)", werr, err)
		}
		last = err
	}
}

// MaxBackoff caps the pause between attempts of one statement.
const MaxBackoff = 64 * time.Millisecond

// Backoff is the pause before sending a rolled-back or cut
// statement again: from about a millisecond, doubling up to
// MaxBackoff, each drawn at random from the upper half of its step,
// so that writers that conflicted (two sides of a deadlock, writers on
// several cluster nodes) spread out instead of colliding again.
func Backoff(attempt int) time.Duration {
	d := MaxBackoff
	if attempt < 7 {
		d = min(time.Millisecond<<attempt, d)
	}
	return d/2 + rand.N(d/2+1)
}

func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// CtxErr is ctx.Err, and DeadlineExceeded once ctx's deadline has passed
// though ctx has not yet ended: a dial or a read cut by that deadline fails
// with a timeout of its own a moment before ctx's timer fires.
func CtxErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

// errRowBusy ends the resends of an acquire whose row stayed locked past
// its bound (queries.sql, lock_wait_mariadb): another transaction writes
// it. The acquire was undone; Send returns the server's error (1205), and
// the attempt reports the name held.
var errRowBusy = errors.New("sqllock: the lease row stayed locked")

// A Sending says how Send sends one statement again.
type Sending struct {
	// Until, when set, ends the rollbacks' budget sooner (Retry): a
	// refresh's resends end when the lease could.
	Until time.Time
	// Budget is the resends' budget and backoff; the zero value is the
	// library's.
	Budget Budget
	// Acquire: the statement takes a lease; a lock wait timeout (1205)
	// ends it, not a resend: its row stayed locked past its bound.
	Acquire bool
	// Classify tells what an error says: Classify, with the caller's own
	// errors added.
	Classify func(error) Outcome
	// Retried is told each failed send that may be sent again.
	Retried func(err error)
	// Closed returns the error that ends the resends once the caller's
	// Client has closed its statements, and nil while it is open.
	Closed func() error
}

// Send runs do, which sends one statement, with Retry's resends, and counts
// the sends whose outcome is unknown: each may have committed, or may
// still. It is the one path by which every statement that writes a lease is
// sent again.
func Send(ctx context.Context, s Sending, do func() (sql.Result, error)) (res sql.Result, unknown int, err error) {
	var rowBusy error
	err = s.Budget.Retry(ctx, s.Until, func() error {
		var err error
		if res, err = do(); err == nil {
			return nil
		}
		if n, ok := Errno(err); ok && n == LockWaitTimeout && s.Acquire {
			rowBusy = err
			return errRowBusy
		}
		switch s.Classify(err) {
		case Unknown:
			unknown++
			s.Retried(err)
		case RolledBack:
			s.Retried(err)
		case Refused:
			if ClockGuard(err) {
				s.Retried(err)
			}
		case Final:
			if ctx.Err() != nil {
				// A context that ended while the statement was on its
				// way made the driver cut the connection: the outcome
				// is unknown. (Never reset: an earlier attempt may also
				// have been applied.)
				unknown++
			}
		}
		if cerr := s.Closed(); cerr != nil {
			return cerr // "sql: statement is closed", or a resend would say so
		}
		return err
	})
	if rowBusy != nil {
		return nil, unknown, rowBusy
	}
	if err != nil {
		return nil, unknown, err
	}
	return res, unknown, nil
}
