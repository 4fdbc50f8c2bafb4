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
			retries.Add(1)
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
			if err := other.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE 'UPDATE %' AND INFO LIKE ? AND ID <> CONNECTION_ID()", "%"+table+"%").Scan(&n); err != nil {
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
			t.Fatalf("the refresh was sent %d times more: it was rolled back", n)
		}
	})
}
