package sqllock

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqllock/sqllock/observe"
)

// A set's acquire takes its lease rows one by one, in name order, and fails
// at the first held live by another owner: it does not wait for a later
// row that a holder's Check keeps locked, on any server or on the fake.
func TestLock_set_refusedAtALiveLeaseBeforeALockedRow(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipSetsOnVitess(t, e)
		a, b := e.twoClients(t)
		ctx := testCtx(t)
		mustAcquire(t, a, "r1", time.Minute)
		l := mustAcquire(t, a, "r2", time.Minute)
		tx := checkedTx(t, a, l)
		short, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := b.TryAcquireSet(short, []string{"r2", "r1", "r0"}, time.Minute)
		if errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("TryAcquireSet: got %v: it waited for r2's row, locked by the Check, past r1, held", err)
		}
		wantHeld(t, err, "r1", "r2")
		tx.Rollback()
		if info := inspect(t, b, "r0"); info.Held {
			t.Fatalf("r0 after the refused set: got %+v, want it free", info)
		}
	})
}

// A set's refresh locks its lease rows alone, in name order, as an acquire
// takes them: never a fence row. A transaction that holds a lease row of
// the set, as another set's acquire does before it writes the name's fence
// row, and then writes that fence row, waits for no refresh blocked behind
// it: neither is rolled back as a deadlock. (A refresh that read the fence
// rows, joined to the lease rows, held the fence row's shared lock while it
// waited: a deadlock, which CI saw between sets' refreshes and acquires.)
func TestLock_Refresh_setLocksNoFenceRow(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipSetsOnVitess(t, e)
		skipFakeFor(t, e, "it locks rows with its own SQL (SELECT ... FOR UPDATE) and reads the processlist")
		if e.oneRow() {
			t.Skip("the one-row forms keep no fence row")
		}
		var retries atomic.Int32
		table := e.newTable(t)
		a := e.client(t, e.db, table, WithHolder("a"), WithObserver(observe.Observer{Retried: func(ev observe.RetryEvent) {
			t.Logf("retried: %s: %v", ev.Statement, ev.Err)
			if ev.Outcome == observe.OutcomeRolledBack {
				retries.Add(1)
			}
		}}))
		ctx := testCtx(t)
		l := mustAcquireSet(t, a, time.Minute, "d1", "d2")

		other := e.openDB(t)
		tx, err := other.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, "SELECT owner FROM `"+table+"` WHERE name = 'd2' AND kind = 'L' FOR UPDATE"); err != nil {
			t.Fatal(err)
		}
		refreshed := make(chan error, 1)
		go func() { refreshed <- l.Refresh(ctx, 2*time.Minute) }()

		// Wait until the refresh waits for d2's lease row.
		for deadline := time.Now().Add(20 * time.Second); ; {
			var n int
			if err := scanProcesslist(ctx, other, "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE 'UPDATE %' AND INFO LIKE ? AND ID <> CONNECTION_ID()", []any{"%" + table + "%"}, &n); err != nil {
				t.Fatal(err)
			}
			if n > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the refresh never showed in the processlist")
			}
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(100 * time.Millisecond) // into its wait for the row
		if _, err := tx.ExecContext(ctx, "UPDATE `"+table+"` SET holder = holder WHERE name = 'd2' AND kind = 'F'"); err != nil {
			t.Fatalf("the fence row's write, after the refresh began to wait: %v", err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if err := <-refreshed; err != nil {
			t.Fatalf("Refresh: %v", err)
		}
		if n := retries.Load(); n != 0 {
			t.Fatalf("the refresh was rolled back %d times", n)
		}
	})
}

// The set's Refresh, Check and Release succeed only while every lease of
// the set is ours: one name taken from it fails each.
func TestLock_set_RefreshCheckRelease(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		skipSetsOnVitess(t, e)
		a, b := e.twoClients(t, WithLockDelay(0)) // b takes q at once after forcing it free
		ctx := testCtx(t)
		const first = 5 * time.Second
		l := mustAcquireSet(t, a, first, "p", "q", "r")
		if err := l.Refresh(ctx, time.Minute); err != nil {
			t.Fatalf("Refresh: %v", err)
		}
		// The server's clock, not a sleep: every name's lease now runs
		// past the first ttl.
		for _, n := range []string{"p", "q", "r"} {
			if got := inspect(t, b, n); !got.Held || got.TTL <= first {
				t.Fatalf("Inspect(%q) after the set's Refresh: got %+v, want more than %v left", n, got, first)
			}
			if _, err := b.TryAcquire(ctx, n, time.Second); !errors.Is(err, ErrNotAcquired) {
				t.Fatalf("TryAcquire(%q) after the set's Refresh: got %v, want ErrNotAcquired", n, err)
			}
		}
		tx, err := a.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Check(ctx, tx); err != nil {
			t.Fatalf("Check: %v", err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}

		// Another process forces q free and takes it.
		if _, err := b.ForceRelease(ctx, "q"); err != nil {
			t.Fatalf("ForceRelease: %v", err)
		}
		mustAcquire(t, b, "q", time.Minute)

		tx, err = a.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		wantErrIs(t, l.Check(ctx, tx), ErrNotHeld)
		tx.Rollback()
		wantErrIs(t, l.Refresh(ctx, 10*time.Second), ErrNotHeld)
		wantErrIs(t, l.Release(ctx), ErrNotHeld)
		// The release freed what was still the set's.
		mustAcquireSet(t, b, time.Minute, "p", "r")
	})
}

// A holder's Check keeps its lease row locked until its transaction ends:
// a set that includes the name waits for the row, and is then refused
// whole, within a second on MariaDB (lock_wait_mariadb, as for one name),
// or when its context ends on MySQL; the set's other names stay free.
func TestLock_set_acquireWaitsForCheck(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipSetsOnVitess(t, e)
		a, b := e.twoClients(t)
		ctx := testCtx(t)
		l := mustAcquire(t, a, "c1", time.Minute)
		tx := checkedTx(t, a, l)
		short, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		_, err := b.TryAcquireSet(short, []string{"c2", "c1"}, time.Minute)
		wantErrIs(t, err, ErrNotAcquired)
		if e.server.MariaDB {
			wantHeld(t, err, "c1")
		}
		tx.Rollback()
		if info := inspect(t, b, "c2"); info.Held {
			t.Fatalf("c2 after the refused set: got %+v, want it free", info)
		}
	})
}

// A set's Refresh is all or nothing: when one of its names was taken by
// another Client, or its lease row is gone (a forced release deleted it,
// and nobody took it), the Refresh reports the set lost and extends none of
// the others.
func TestLock_set_RefreshAllOrNothing(t *testing.T) {
	for _, taken := range []bool{true, false} {
		t.Run(map[bool]string{true: "taken", false: "gone"}[taken], func(t *testing.T) {
			eachEnv(t, func(t *testing.T, e *testEnv) {
				skipSetsOnVitess(t, e)
				// b's forced release deletes the lease row: no lock-delay.
				a, b := e.twoClients(t, WithLockDelay(0))
				l := mustAcquireSet(t, a, 20*time.Second, "p1", "p2")
				if _, err := b.ForceRelease(testCtx(t), "p1"); err != nil {
					t.Fatalf("ForceRelease: %v", err)
				}
				var other *Lock
				if taken {
					other = mustAcquire(t, b, "p1", time.Minute)
				}
				err := l.Refresh(testCtx(t), time.Hour)
				wantErrIs(t, err, ErrNotHeld)
				if got := inspect(t, b, "p2"); got.TTL > 20*time.Second {
					t.Fatalf("p2 after the refused Refresh(1h): got %+v, want its 20s lease unchanged", got)
				}
				got := inspect(t, b, "p1")
				switch {
				case !taken && (got.Held || got.Fence == 0):
					t.Fatalf("p1 after the refused Refresh: got %+v, want free, its fence kept", got)
				case taken && (!got.Held || got.Fence != other.Fence()):
					t.Fatalf("p1 after the refused Refresh: got %+v, want the other Client's lease", got)
				case taken && got.TTL > time.Minute:
					// The other Client's lease was not extended either.
					t.Fatalf("p1's lease: got %v left, want at most 1m", got.TTL)
				}
			})
		})
	}
}
