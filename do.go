package sqllock

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ReleaseTimeout bounds a release: [Lock.Release], and the release that ends
// a [Client.Do], a [Client.Once] or a lead in [Client.Elect]. Each runs on a
// context of its own, which ends this long after the release starts: the
// caller's context may have ended, and the name must still be given back.
// Letting go of the Lock's wake-up channel is within the bound: one cut
// short discards the channel's connection, with which its named lock dies.
const ReleaseTimeout = 5 * time.Second

// A DoOption changes how [Client.Do] and [Client.TryDo] hold the lease.
type DoOption func(*doConfig) error

type doConfig struct {
	minHold   time.Duration
	margin    time.Duration
	marginSet bool
}

// WithMinHold keeps the lease, after fn returns, until d after it was
// acquired, if that is later (ShedLock's lockAtLeastFor): a job that takes
// a second is not run again by a host whose trigger fires a few seconds
// late. The release is then one token-guarded UPDATE that sets the expiry to
// acquired-at + d, by the server's clock, instead of a DELETE; when that time
// has passed it leaves an expired lease, which blocks nobody. d may exceed
// the ttl. d must be between 0 and [MaxTTL]; 0 releases at once.
func WithMinHold(d time.Duration) DoOption {
	return func(c *doConfig) error {
		if d < 0 || d > MaxTTL {
			return fmt.Errorf("sqllock: minimum hold %v is outside [0, %v]", d, MaxTTL)
		}
		c.minHold = d
		return nil
	}
}

// WithSafetyMargin sets how long before the lease could expire fn's context
// is cancelled when renewals keep failing (see [Lock.KeepAlive]): the time fn
// needs to notice and stop, plus how far the client's clock may run slow of
// the server's over one ttl. The default is min(ttl/10,
// [MaxDefaultSafetyMargin]). d must be at least 0 and below the ttl.
func WithSafetyMargin(d time.Duration) DoOption {
	return func(c *doConfig) error {
		if d < 0 {
			return fmt.Errorf("sqllock: safety margin %v is negative", d)
		}
		c.margin, c.marginSet = d, true
		return nil
	}
}

func newDoConfig(ttl time.Duration, opts []DoOption) (doConfig, error) {
	var c doConfig
	for _, opt := range opts {
		if err := opt(&c); err != nil {
			return doConfig{}, err
		}
	}
	if !c.marginSet {
		c.margin = defaultSafetyMargin(ttl)
	}
	if c.margin >= ttl {
		return doConfig{}, fmt.Errorf("sqllock: safety margin %v is not below the ttl %v", c.margin, ttl)
	}
	return c, nil
}

// Do acquires the lease on name for ttl, waiting as [Client.Acquire] does,
// runs fn while a keep-alive renews the lease (see [Lock.KeepAlive]), and
// releases the lease when fn returns or panics; a panic goes on after the
// release. fn's context is derived from ctx and is also cancelled as soon as
// the lease can no longer be known to be held: a safety margin (see
// [WithSafetyMargin]) before it could expire, or when a renewal finds it
// taken over.
//
// Do returns the acquire's error if it did not acquire, and otherwise fn's
// error. When the lease was lost while fn ran, or found lost at release,
// the error also wraps [ErrLockLost]; when [Client.Close] released it, it
// wraps [ErrClosed]. The release runs on a fresh context with a short
// timeout, so it happens even when ctx has ended; if it fails (a network
// error) its error is joined too, and the lease expires by itself.
func (c *Client) Do(ctx context.Context, name string, ttl time.Duration, fn func(ctx context.Context) error, opts ...DoOption) error {
	return c.do(ctx, name, ttl, c.Acquire, fn, opts)
}

// TryDo is [Client.Do] with one attempt to acquire: when another owner's
// lease is live it returns an error wrapping [ErrNotAcquired] at once,
// without running fn.
func (c *Client) TryDo(ctx context.Context, name string, ttl time.Duration, fn func(ctx context.Context) error, opts ...DoOption) error {
	return c.do(ctx, name, ttl, c.TryAcquire, fn, opts)
}

// DoAll is [Client.Do] for a set of names, taken all or nothing by
// [Client.AcquireAll]: fn's context ends when any lease of the set could
// lapse.
func (c *Client) DoAll(ctx context.Context, names []string, ttl time.Duration, fn func(ctx context.Context) error, opts ...DoOption) error {
	if _, err := checkNames(names); err != nil {
		return err
	}
	return c.doWith(ctx, ttl, func(ctx context.Context) (*Lock, error) { return c.AcquireAll(ctx, names, ttl) }, fn, opts)
}

// TryDoAll is [Client.DoAll] with one attempt to acquire, as [Client.TryDo].
func (c *Client) TryDoAll(ctx context.Context, names []string, ttl time.Duration, fn func(ctx context.Context) error, opts ...DoOption) error {
	if _, err := checkNames(names); err != nil {
		return err
	}
	return c.doWith(ctx, ttl, func(ctx context.Context) (*Lock, error) { return c.TryAcquireAll(ctx, names, ttl) }, fn, opts)
}

type acquireFunc func(ctx context.Context, name string, ttl time.Duration) (*Lock, error)

func (c *Client) do(ctx context.Context, name string, ttl time.Duration, acquire acquireFunc, fn func(context.Context) error, opts []DoOption) error {
	if err := checkName(name); err != nil {
		return err
	}
	return c.doWith(ctx, ttl, func(ctx context.Context) (*Lock, error) { return acquire(ctx, name, ttl) }, fn, opts)
}

// doWith runs fn under the Lock acquire takes, its names checked already.
func (c *Client) doWith(ctx context.Context, ttl time.Duration, acquire func(context.Context) (*Lock, error), fn func(context.Context) error, opts []DoOption) error {
	// In TryAcquire's order, so a bad ttl is named as such, not through the
	// safety margin derived from it.
	if err := checkTTL(ttl); err != nil {
		return err
	}
	if fn == nil {
		return errors.New("sqllock: nil func")
	}
	cfg, err := newDoConfig(ttl, opts)
	if err != nil {
		return err
	}
	l, err := acquire(ctx)
	if err != nil {
		return err
	}
	return l.run(ctx, cfg, fn)
}

// run runs fn under l's keep-alive and releases l when fn returns or
// panics. Errors are those Do documents.
func (l *Lock) run(ctx context.Context, cfg doConfig, fn func(context.Context) error) (err error) {
	kctx := l.keepAlive(ctx, cfg.margin)
	defer func() {
		// Not recovered: a panic goes on, with its stack, after this.
		err = errors.Join(err, l.finish(ctx, kctx, cfg.minHold))
	}()
	return fn(kctx)
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
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ReleaseTimeout)
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
	return errors.Join(cause, err)
}

// releaseAtLeast sends the release of [WithMinHold]: the lease is kept until
// acquired_at + minHold. ours reports whether the lease row was ours.
func (l *Lock) releaseAtLeast(ctx context.Context, minHold time.Duration) (ours, maybeApplied bool, err error) {
	res, maybeApplied, err := l.c.exec(ctx, qReleaseAtLeast, minHold.Microseconds(), l.name, l.token)
	if err != nil {
		return false, maybeApplied, err
	}
	id, err := res.LastInsertId()
	if err != nil {
		return false, maybeApplied, err
	}
	return id != 0, maybeApplied, nil // 1, or the fence plus one on TiDB (queries.sql)
}
