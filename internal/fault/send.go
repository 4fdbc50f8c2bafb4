package fault

import (
	"context"
	"database/sql"
	"errors"
	"time"
)

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
