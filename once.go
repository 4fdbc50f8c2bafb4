package sqllock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sqllock/sqllock/internal/engine"
	"github.com/sqllock/sqllock/internal/fault"
)

// onceTTL is the lease [Client.Once] holds on its name while fn runs,
// renewed by a keep-alive. A runner whose process dies keeps the others
// waiting for at most this long before one of them takes over.
const onceTTL = 15 * time.Second

// errOnceDone stops Once's work when the completion record is found under
// the lease.
var errOnceDone = errorf("already done")

// Once runs fn so that it succeeds at most once for name across every
// replica and restart that share the table, and reports whether this call ran
// it. The caller that takes the lease on name (15s, kept alive) runs fn as
// [Client.Do] does and records a success before releasing; the others wait,
// and after a success return false and nil. A failure, or a crash before the
// record is written, lets the next caller run fn again, so fn must be safe to
// repeat. Once returns fn's error (with ran true), or an error from waiting,
// as [Client.Acquire]'s, or from the record; when the lease was lost while fn
// ran, the error wraps [ErrLockLost] and nothing is recorded.
func (c *Client) Once(ctx context.Context, name string, fn func(ctx context.Context, l *Lock) error) (ran bool, err error) {
	if fn == nil {
		return false, errorf("nil func")
	}
	if err := checkName(name); err != nil {
		return false, err
	}
	// Most calls come after the record is written: answer them without
	// waiting for the lease.
	if done, err := c.onceDoneRetrying(ctx, name); err != nil || done {
		return false, err
	}
	l, err := c.Acquire(ctx, name, onceTTL)
	if err != nil {
		return false, err
	}
	// Once's statements are proven before fn first runs (internal/engine/later.go).
	if err := c.eng.ProveOnceRecords(ctx); err != nil {
		_ = l.Release(ctx)
		return false, c.serverError(fmt.Sprintf("once %q", name), err)
	}
	var recorded bool
	err = l.run(ctx, doConfig{margin: defaultSafetyMargin(onceTTL)}, func(ctx context.Context, l *Lock) error {
		// The runner before us may have written the record, then released.
		// A read that fails comes back joined with what ended the lease, if
		// that is what cut it (Close, a loss).
		done, err := c.onceDoneRetrying(ctx, name)
		if err != nil {
			return err
		}
		if done {
			return errOnceDone
		}
		ran = true
		if err := fn(ctx, l); err != nil {
			return err
		}
		if err := l.recordOnce(ctx); err != nil {
			return err
		}
		recorded = true
		return nil
	})
	switch {
	case errors.Is(err, errOnceDone):
		return false, nil
	case recorded:
		// The token-guarded record proves nobody took the lease over while
		// fn ran, even if the keep-alive gave up on it in the meantime; a
		// failed release only leaves the lease to expire.
		return true, nil
	}
	return ran, err
}

// onceDone reports whether name has a completion record.
func (c *Client) onceDone(ctx context.Context, name string) (bool, error) {
	op := fmt.Sprintf("once %q", name)
	st, err := c.eng.Stmt(ctx, qOnceDone)
	if err != nil {
		return false, c.serverError(op, err)
	}
	rows, err := st.QueryContext(ctx, name)
	if err != nil {
		return false, c.serverError(op, err)
	}
	defer rows.Close()
	done := rows.Next()
	if err := rows.Err(); err != nil {
		return false, c.serverError(op, err)
	}
	return done, nil
}

// onceDoneRetrying is onceDone, tried again while its error may pass (a
// failover, a restart), paced by the Client's RetryStrategy as Acquire's
// polling is, until ctx ends or the strategy gives up.
func (c *Client) onceDoneRetrying(ctx context.Context, name string) (bool, error) {
	for attempt := 1; ; attempt++ {
		done, err := c.onceDone(ctx, name)
		if err == nil || !passable(err) || ctx.Err() != nil {
			return done, err
		}
		wait, ok := c.retry.Backoff(attempt)
		if !ok {
			return false, err
		}
		if werr := fault.Sleep(ctx, wait); werr != nil {
			return false, errorf("once %q: %w (last error: %w)", name, werr, err)
		}
	}
}

// recordOnce writes name's completion record, only while the lease row is
// still ours. It uses a context of its own: fn succeeded, and a caller's
// context that ended just after must not make it run again.
func (l *Lock) recordOnce(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.c.releaseTimeout)
	defer cancel()
	op := fmt.Sprintf("once %q: record completion", l.name)
	res, _, err := l.c.eng.Exec(ctx, engine.Send{Stmt: qOnceRecord, Args: []any{l.name, l.token}})
	if n, _ := fault.Errno(err); n == fault.DupEntry {
		// Written by an earlier attempt whose reply was lost: the insert
		// found our lease row, or it would have had nothing to insert.
		return nil
	}
	if err != nil {
		return l.c.serverError(op, err)
	}
	id, err := l.c.eng.Forms().OnceRecorded(res)
	if err != nil {
		return errorf("%s: %w", op, err)
	}
	if id == 0 { // else 1, or the fence plus one on TiDB (queries.sql)
		return errorf("%w: %w: the lease on %q was taken over before fn's success was recorded", ErrLockLost, ErrNotHeld, l.name)
	}
	return nil
}
