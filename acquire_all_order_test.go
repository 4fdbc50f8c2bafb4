package sqllock

import (
	"context"
	"errors"
	"testing"
	"time"
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
		tx, err := a.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if err := l.Check(ctx, tx); err != nil {
			t.Fatalf("Check: %v", err)
		}
		short, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err = b.TryAcquireAll(short, []string{"r2", "r1", "r0"}, time.Minute)
		if errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("TryAcquireAll: got %v: it waited for r2's row, locked by the Check, past r1, held", err)
		}
		wantHeld(t, err, "r1", "r2")
		tx.Rollback()
		if info := inspect(t, b, "r0"); info.Held {
			t.Fatalf("r0 after the refused set: got %+v, want it free", info)
		}
	})
}
