package sqllocktest_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/sqllocktest"
)

// A set (TryAcquireSet) on the fake: all or nothing, one fence for every
// name, refreshed, checked and released whole; a Check's transaction holds
// the set's lease rows against a takeover, as InnoDB does.
func TestServer_sets(t *testing.T) {
	srv := sqllocktest.New(t)
	a := newClient(t, srv, sqllock.WithHolder("a"))
	b := newClient(t, srv, sqllock.WithHolder("b"))
	ctx := ctxFor(t)

	single, err := a.TryAcquire(ctx, "y", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := single.Release(ctx); err != nil {
		t.Fatal(err)
	}
	la, err := a.TryAcquireSet(ctx, []string{"y", "x"}, time.Minute)
	if err != nil {
		t.Fatalf("TryAcquireSet: %v", err)
	}
	f := la.Fences()
	if !slices.Equal(la.Names(), []string{"x", "y"}) || f[0] != f[1] || la.Fence() != f[0] || f[1] <= single.Fence() {
		t.Fatalf("set: names %q, fences %d (Fence %d), want [x y] with one fence above y's last, %d", la.Names(), f, la.Fence(), single.Fence())
	}

	// Refused whole: z stays free, and the error names y.
	_, err = b.TryAcquireSet(ctx, []string{"z", "y"}, time.Minute)
	var held *sqllock.HeldError
	if !errors.As(err, &held) || !slices.Equal(held.Names, []string{"y"}) || !errors.Is(err, sqllock.ErrNotAcquired) {
		t.Fatalf("overlapping set: got %v, want a HeldError naming y", err)
	}
	if info, err := b.Inspect(ctx, "z"); err != nil || info.Held {
		t.Fatalf("Inspect(z) after a refused set: got %+v, %v, want it free", info, err)
	}

	if err := la.Refresh(ctx, time.Minute); err != nil {
		t.Fatalf("Refresh: %v", err)
	}
	tx := checkedTx(t, ctx, srv, la)
	// The Check's transaction holds the set's lease rows: a takeover of
	// one of them waits for it.
	if err := srv.Expire("x"); err != nil {
		t.Fatal(err)
	}
	var lb *sqllock.Lock
	if err := waitsForCommit(t, tx, func() (err error) {
		lb, err = b.TryAcquireSet(ctx, []string{"x", "w"}, time.Minute)
		return err
	}); err != nil {
		t.Fatalf("takeover after commit: %v", err)
	}
	if lb.Fence() <= la.Fence() {
		t.Fatalf("fence after the takeover: got %d, want more than %d", lb.Fence(), la.Fence())
	}

	// a's set is half lost: its refresh fails, its release lets go of y.
	if err := la.Refresh(ctx, time.Minute); !errors.Is(err, sqllock.ErrNotHeld) {
		t.Fatalf("Refresh of a set half taken over: got %v, want ErrNotHeld", err)
	}
	_ = la.Release(ctx)
	if l, err := b.TryAcquire(ctx, "y", time.Minute); err != nil || l.Fence() <= la.Fence() {
		t.Fatalf("y after a's release: got %v, want it taken with a greater fence", err)
	}
	// The longest set a call takes.
	many := make([]string, sqllock.MaxNames)
	for i := range many {
		many[i] = fmt.Sprintf("n%02d", i)
	}
	lm, err := a.TryAcquireSet(ctx, many, time.Minute)
	if err != nil {
		t.Fatalf("TryAcquireSet of %d names: %v", len(many), err)
	}
	if list, err := b.List(ctx); err != nil || len(list) != len(many)+3 {
		t.Fatalf("List: got %d leases, %v, want %d", len(list), err, len(many)+3)
	}
	if err := lm.Release(ctx); err != nil {
		t.Fatalf("Release of %d names: %v", len(many), err)
	}
	// Each Client's first set proves the set statements first, with two of
	// each, and a third refresh once the leases are gone (the library's
	// internal/engine/later.go).
	for name, want := range map[string]int{"all_acquire": 4 + 2*2, "all_check": 1 + 2*2, "all_refresh": 2 + 2*3} {
		if got := srv.Count(name); got != want {
			t.Errorf("Count(%q): got %d, want %d", name, got, want)
		}
	}
}

// Faults on the set statements, by name: the library sends a statement
// again after a deadlock, and an acquire applied but whose reply was lost
// is settled by the retry, which finds the leases its own.
func TestServer_setFaults(t *testing.T) {
	srv := sqllocktest.New(t)
	c := newClient(t, srv)
	other := newClient(t, srv)
	ctx := ctxFor(t)
	for _, f := range []sqllocktest.Fault{
		{Statement: "all_acquire", Err: sqllocktest.Deadlock},
		{Statement: "all_acquire", Err: sqllocktest.ErrLostConnection, Applied: true},
		{Statement: "all_refresh", Err: sqllocktest.LockWaitTimeout},
	} {
		if err := srv.Inject(f); err != nil {
			t.Fatal(err)
		}
	}
	l, err := c.TryAcquireSet(ctx, []string{"p", "q"}, time.Minute)
	if err != nil {
		t.Fatalf("TryAcquireSet under faults: %v", err)
	}
	if err := l.Refresh(ctx, time.Minute); err != nil {
		t.Fatalf("Refresh under a fault: %v", err)
	}
	if n := srv.Pending(); n != 0 {
		t.Fatalf("faults left: %d", n)
	}
	if _, err := other.TryAcquire(ctx, "q", time.Minute); !errors.Is(err, sqllock.ErrNotAcquired) {
		t.Fatalf("q while the set holds it: got %v, want ErrNotAcquired", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	l, err = other.AcquireSet(ctx, []string{"p", "q"}, time.Minute)
	if err != nil {
		t.Fatalf("AcquireSet after the release: %v", err)
	}
	if err := l.Do(ctx, func(context.Context, *sqllock.Lock) error { return nil }); err != nil {
		t.Fatalf("Do after the release: %v", err)
	}
}
