package sqllock

import (
	"context"
	"errors"
	"time"
)

// DoSlot takes one of the n slots of the counting semaphore name as
// [Client.AcquireSlot] does, waiting while all are held, then runs fn under
// the slot's kept-alive lease and releases it, as [Client.Do] does with a
// lock's: fn's context ends when the lease could lapse, and the errors are
// Do's. fn is given the slot's Lock, for its [Lock.Slot] and [Lock.Fence];
// it must not release it. opts are Do's.
func (c *Client) DoSlot(ctx context.Context, name string, n int, ttl time.Duration, fn func(ctx context.Context, l *Lock) error, opts ...DoOption) error {
	return c.doSlot(ctx, name, n, ttl, c.AcquireSlot, fn, opts)
}

// TryDoSlot is [Client.DoSlot] with one attempt to take a slot: when all n
// are held it returns an error wrapping [ErrNotAcquired] at once, without
// running fn.
func (c *Client) TryDoSlot(ctx context.Context, name string, n int, ttl time.Duration, fn func(ctx context.Context, l *Lock) error, opts ...DoOption) error {
	return c.doSlot(ctx, name, n, ttl, c.TryAcquireSlot, fn, opts)
}

func (c *Client) doSlot(ctx context.Context, name string, n int, ttl time.Duration,
	acquire func(context.Context, string, int, time.Duration) (*Lock, error),
	fn func(context.Context, *Lock) error, opts []DoOption) error {
	if err := checkSlotArgs(name, n, ttl); err != nil {
		return err
	}
	if fn == nil {
		return errors.New("sqllock: nil func")
	}
	cfg, err := newDoConfig(ttl, opts)
	if err != nil {
		return err
	}
	l, err := acquire(ctx, name, n, ttl)
	if err != nil {
		return err
	}
	return l.run(ctx, cfg, func(ctx context.Context) error { return fn(ctx, l) })
}
