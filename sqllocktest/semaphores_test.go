package sqllocktest_test

import (
	"errors"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/sqllocktest"
)

// A counting semaphore (Client.Semaphore) on the fake: its slots fill in
// order, the n+1st holder is refused, another n is refused while a slot is
// held and taken as a resize once none is, a lapsed slot is taken over on
// the server's clock, and a Check's transaction holds its slot's row
// against a takeover, as InnoDB does.
func TestServer_semaphores(t *testing.T) {
	srv := sqllocktest.New(t, sqllocktest.WithFrozenClock(time.Time{}))
	a := newClient(t, srv, sqllock.WithHolder("a"))
	b := newClient(t, srv, sqllock.WithHolder("b"))
	c := newClient(t, srv, sqllock.WithHolder("c"))
	ctx := ctxFor(t)

	la, err := a.Semaphore("pool", 2).TryAcquire(ctx, time.Minute)
	if err != nil || la.Slot() != 1 {
		t.Fatalf("first slot: got %v, %v, want slot 1", la, err)
	}
	lb, err := b.Semaphore("pool", 2).TryAcquire(ctx, time.Minute)
	if err != nil || lb.Slot() != 2 || lb.Fence() <= la.Fence() {
		t.Fatalf("second slot: got %v, %v, want slot 2 with a fence above %d", lb, err, la.Fence())
	}
	if _, err := c.Semaphore("pool", 2).TryAcquire(ctx, time.Minute); !errors.Is(err, sqllock.ErrNotAcquired) || errors.Is(err, sqllock.ErrSlotCount) {
		t.Fatalf("a full semaphore: got %v, want ErrNotAcquired", err)
	}
	if _, err := c.Semaphore("pool", 3).TryAcquire(ctx, time.Minute); !errors.Is(err, sqllock.ErrSlotCount) {
		t.Fatalf("another count while held: got %v, want ErrSlotCount", err)
	}
	infos, err := c.Semaphore("pool", 2).Inspect(ctx)
	if err != nil || len(infos) != 2 || !infos[0].Held || infos[0].Holder != "a" || !infos[1].Held || infos[1].Holder != "b" || infos[1].Fence != lb.Fence() {
		t.Fatalf("Inspect: got %+v, %v, want 2 slots held by a and b, fence %d", infos, err, lb.Fence())
	}

	// b renews; a's lease lapses on the server's clock, and c takes its
	// slot over.
	if err := srv.Advance(50 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := lb.Refresh(ctx, time.Minute); err != nil {
		t.Fatalf("Refresh: %v", err)
	}
	if err := srv.Advance(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	lc, err := c.Semaphore("pool", 2).TryAcquire(ctx, time.Minute)
	if err != nil || lc.Slot() != 1 || lc.Fence() <= lb.Fence() {
		t.Fatalf("after a's lease lapsed: got %v, %v, want slot 1 with a higher fence", lc, err)
	}
	if err := la.Refresh(ctx, time.Minute); !errors.Is(err, sqllock.ErrNotHeld) {
		t.Fatalf("Refresh of the lapsed slot: got %v, want ErrNotHeld", err)
	}

	// The Check's transaction holds slot 1's row: a takeover of it, once
	// it has lapsed, waits for the transaction.
	tx := checkedTx(t, ctx, srv, lc)
	if err := lb.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := srv.Advance(2 * time.Minute); err != nil {
		t.Fatal(err)
	}
	var la2 *sqllock.Lock
	err = waitsForCommit(t, tx, func() (err error) {
		la2, err = a.Semaphore("pool", 3).TryAcquire(ctx, time.Minute) // every slot free: a resize
		return err
	})
	if err != nil || la2.Slot() != 1 {
		t.Fatalf("after the commit: got %v, %v, want slot 1", la2, err)
	}
	if infos, err := c.Semaphore("pool", 3).Inspect(ctx); err != nil || len(infos) != 3 || held(infos) != 1 {
		t.Fatalf("Inspect after the resize: got %+v, %v, want 3 slots, one held", infos, err)
	}
}

// The semaphore statement fails as a server's would: a deadlock is sent
// again, and a reply lost after the slot was taken is settled by sending
// again with the same token, which finds the slot its own: one slot held.
func TestServer_semaphoreFaults(t *testing.T) {
	srv := sqllocktest.New(t)
	c := newClient(t, srv)
	ctx := ctxFor(t)
	if err := srv.Inject(
		sqllocktest.Fault{Statement: "slot_acquire", Err: sqllocktest.Deadlock},
		sqllocktest.Fault{Statement: "slot_acquire", Err: sqllocktest.ErrLostConnection, Applied: true},
	); err != nil {
		t.Fatal(err)
	}
	before := srv.Count("slot_acquire")
	pool := c.Semaphore("pool", 2)
	l, err := pool.TryAcquire(ctx, time.Minute)
	if err != nil || l.Slot() != 1 {
		t.Fatalf("TryAcquire through faults: got %v, %v, want slot 1", l, err)
	}
	if got := srv.Count("slot_acquire") - before; got < 3 {
		t.Fatalf("slot acquires sent: got %d, want 3 or more (a deadlock, a lost reply, a retry)", got)
	}
	infos, err := pool.Inspect(ctx)
	if err != nil || held(infos) != 1 || !infos[0].Held || infos[0].Fence != l.Fence() {
		t.Fatalf("Inspect: got %+v, %v, want slot 1 alone held, fence %d", infos, err, l.Fence())
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if infos, err := pool.Inspect(ctx); err != nil || held(infos) != 0 {
		t.Fatalf("Inspect after Release: got %+v, %v, want none held", infos, err)
	}
}

// held counts the slots held.
func held(infos []sqllock.Info) (n int) {
	for _, i := range infos {
		if i.Held {
			n++
		}
	}
	return n
}
