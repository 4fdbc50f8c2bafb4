package sqllock

import (
	"context"
	"errors"
	"time"

	"github.com/sqllock/sqllock/internal/engine"
)

// ReleaseTimeout bounds a release ([Lock.Release], and the one that ends
// [Lock.Do], [Client.Once] or a lead in [Client.Elect]), which runs on a
// context of its own so that it happens even when the caller's has ended.
const ReleaseTimeout = 5 * time.Second

func newDoConfig(ttl time.Duration, fn func(context.Context, *Lock) error, opts []DoOption) (doConfig, error) {
	var c doConfig
	if fn == nil {
		return doConfig{}, errorf("nil func")
	}
	for _, opt := range opts {
		if err := opt(&c); err != nil {
			return doConfig{}, err
		}
	}
	if !c.marginSet {
		c.margin = defaultSafetyMargin(ttl)
	}
	if c.margin >= ttl {
		return doConfig{}, errorf("safety margin %v is not below the ttl %v", c.margin, ttl)
	}
	return c, nil
}

// Do acquires the lease on name for ttl as [Client.Acquire] does, returning
// its error if that fails, and runs fn under the lease as [Lock.Do] does. For
// one attempt, a set or a semaphore, acquire the Lock and call [Lock.Do].
func (c *Client) Do(ctx context.Context, name string, ttl time.Duration, fn func(ctx context.Context, l *Lock) error, opts ...DoOption) error {
	if err := checkName(name); err != nil {
		return err
	}
	// In TryAcquire's order, so a bad ttl is named as such, not through the
	// safety margin derived from it.
	if err := checkTTL(ttl); err != nil {
		return err
	}
	cfg, err := newDoConfig(ttl, fn, opts)
	if err != nil {
		return err
	}
	l, err := c.Acquire(ctx, name, ttl)
	if err != nil {
		return err
	}
	return l.run(ctx, cfg, fn)
}

// Do runs fn while a keep-alive renews the lease, and releases it when fn
// returns or panics (the panic then goes on), even after ctx has ended. fn
// gets l, for its [Lock.Fence], and a context cancelled, with cause
// [ErrLockLost], as soon as the lease can no longer be known to be held
// ([WithSafetyMargin]); fn must not release l. Do returns fn's error, joined
// with [ErrLockLost] when the lease was lost, [ErrClosed] when [Client.Close]
// released it, and a failed release's error. When l is no longer held, or on
// bad input (which releases l), it returns an error without running fn.
func (l *Lock) Do(ctx context.Context, fn func(ctx context.Context, l *Lock) error, opts ...DoOption) error {
	cfg, err := newDoConfig(l.ttl, fn, opts)
	if err != nil {
		// Do owns l from its call: bad input leaves no lease behind.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.c.releaseTimeout)
		defer cancel()
		return joinErrors(err, l.Release(rctx))
	}
	return l.run(ctx, cfg, fn)
}

// run runs fn under l's keep-alive and releases l when fn returns or
// panics. Errors are those Lock.Do documents.
func (l *Lock) run(ctx context.Context, cfg doConfig, fn func(context.Context, *Lock) error) (err error) {
	kctx := l.keepAlive(ctx, cfg.margin)
	if kctx.Err() != nil && ctx.Err() == nil {
		// Released, lost or closed before the work began: nothing to run
		// and nothing to release.
		return context.Cause(kctx)
	}
	defer func() {
		// Not recovered: a panic goes on, with its stack, after this.
		err = joinErrors(err, l.finish(ctx, kctx, cfg.minHold))
	}()
	return fn(kctx, l)
}

// finish releases l after work under kctx and reports what the work must
// know: that the lease was lost or taken by Close, or that the release failed.
func (l *Lock) finish(ctx, kctx context.Context, minHold time.Duration) error {
	// Read before releasing, which ends kctx with a cause of its own.
	cause := context.Cause(kctx)
	ended := errors.Is(cause, ErrLockLost) || errors.Is(cause, ErrClosed)
	if !ended {
		cause = nil
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.c.releaseTimeout)
	defer cancel()
	err := l.release(rctx, minHold, nil)
	switch {
	case err == nil:
	case errors.Is(err, ErrNotHeld) && ended:
		err = nil // already said by cause
	case errors.Is(err, ErrNotHeld):
		// Taken over between the last renewal and the release.
		err = errorf("%w: %w", ErrLockLost, err)
	}
	return joinErrors(cause, err)
}

// releaseAtLeast sends the release of [WithMinHold]: the lease is kept until
// acquired_at + minHold. ours reports whether the lease row was ours.
func (l *Lock) releaseAtLeast(ctx context.Context, minHold time.Duration) (ours, maybeApplied bool, err error) {
	res, unknown, err := l.c.eng.Exec(ctx, engine.Send{Stmt: qReleaseAtLeast, Args: []any{minHold.Microseconds(), l.name, l.token}})
	maybeApplied = unknown > 0
	if err != nil {
		return false, maybeApplied, err
	}
	id, err := res.LastInsertId()
	if err != nil {
		return false, maybeApplied, err
	}
	return id != 0, maybeApplied, nil // 1, or the fence plus one on TiDB (queries.sql)
}
