package sqllock

import (
	"context"
	"errors"
	"testing"
	"time"
)

// evictedFirst is TestClient_ForceRelease_lockDelayStopsTheHolderFirst for
// a lock or a slot of a semaphore of one slot: a holds it, ops forces it
// free, b takes it.
func evictedFirst(t *testing.T, kind string, a, b, ops *Client) {
	ctx := testCtx(t)
	acquire := func(c *Client, ttl time.Duration) (*Lock, error) {
		if kind == "slot" {
			return c.Semaphore("job", 1).TryAcquire(ctx, ttl)
		}
		return c.TryAcquire(ctx, "job", ttl)
	}
	force := func() (Info, error) {
		if kind == "slot" {
			return ops.Semaphore("job", 1).ForceRelease(ctx, 1)
		}
		return ops.ForceRelease(ctx, "job")
	}
	// Renewals every 2 s: the forced release comes 1 s after one.
	const ttl = 6 * time.Second
	evicted, err := acquire(a, ttl)
	if err != nil {
		t.Fatal(err)
	}
	lost, done := make(chan time.Time, 1), make(chan error, 1)
	go func() {
		done <- evicted.Do(ctx, func(ctx context.Context, l *Lock) error {
			<-ctx.Done()
			lost <- time.Now()
			return context.Cause(ctx)
		})
	}()
	time.Sleep(ttl / 2)
	forced := time.Now()
	was, err := force()
	if err != nil {
		t.Fatalf("ForceRelease: %v", err)
	}
	// The lease left when the lock-delay was written: what the read saw,
	// less the time since (the first write's proof comes between).
	if hi, lo := defaultLockDelay(was.TTL), defaultLockDelay(was.TTL-time.Since(forced)); was.LockDelay > hi || was.LockDelay < lo {
		t.Errorf("LockDelay: got %v, want the default, %v to %v, for %v left at the read", was.LockDelay, lo, hi, was.TTL)
	}
	var next *Lock
	for next == nil {
		next, err = acquire(b, time.Minute)
		if err != nil && !errors.Is(err, ErrNotAcquired) {
			t.Fatalf("acquire: %v", err)
		}
		time.Sleep(2 * time.Millisecond)
	}
	taken := time.Now()
	var lostAt time.Time
	select {
	case lostAt = <-lost:
	default:
		t.Fatalf("the second Client took the %s %v after the forced release (lock-delay %v), while the evicted holder still worked",
			kind, taken.Sub(forced), was.LockDelay)
	}
	t.Logf("%s: lock-delay %v (%v left): the evicted holder saw the loss %v after the forced release, the next holder started %v after it",
		kind, was.LockDelay, was.TTL, lostAt.Sub(forced).Round(time.Millisecond), taken.Sub(forced).Round(time.Millisecond))
	if err := <-done; !errors.Is(err, ErrLockLost) || !errors.Is(err, ErrNotHeld) {
		t.Errorf("Do: got %v, want ErrLockLost from a renewal that found the lease not held", err)
	}
	if was.Fence != evicted.Fence() || next.Fence() <= was.Fence || next.Slot() != evicted.Slot() {
		t.Errorf("fences: got %d forced out (the Lock's %d), %d next (slot %d), want the next above, on the same slot", was.Fence, evicted.Fence(), next.Fence(), next.Slot())
	}
}
