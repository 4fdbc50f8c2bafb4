package sqllock

import (
	"database/sql"
	"testing"
	"time"
)

// A statement sent again with the same token (an exec retry after a lost
// reply) takes its own slot again, or an earlier free one and keeps its
// own (a late send must not free the slot a later send returned); the call
// then gives back every slot of the token but the one it reports.
func TestSlotCall_retrySameToken_holdsOne(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		slotServer(t, e)
		table := e.newTable(t)
		c := e.client(t, e.db, table)
		other := e.client(t, e.openDB(t), table)
		ctx := testCtx(t)
		first := mustSlot(t, other, "r", 3, time.Minute)
		s, err := c.newSlotCall("r", 3, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		l1, err := s.attempt(ctx)
		if err != nil || l1.Slot() != 2 {
			t.Fatalf("first send: got %v, %v, want slot 2", l1, err)
		}
		l2, err := s.attempt(ctx) // the same token again
		if err != nil || l2.Slot() != 2 || l2.Fence() <= l1.Fence() {
			t.Fatalf("same token again: got %v, %v, want slot 2 with a higher fence", l2, err)
		}
		if err := first.Release(ctx); err != nil {
			t.Fatal(err)
		}
		l3, err := s.attempt(ctx)
		if err != nil || l3.Slot() != 1 {
			t.Fatalf("same token, slot 1 free: got %v, %v, want slot 1", l3, err)
		}
		// The token's slot rows, read with the lease statement, which the
		// fake runs too.
		tokenRows := func(live bool) (n int) {
			for i := 1; i <= 3; i++ {
				var owner, holder string
				var fence uint64
				var isLive, attached bool
				var left int64
				err := e.db.QueryRowContext(ctx, c.eng.Forms().SQL[qLease], slotName("r", i)).Scan(&owner, &holder, &fence, &isLive, &left, &attached)
				switch {
				case err == sql.ErrNoRows:
				case err != nil:
					t.Fatalf("lease of slot %d: %v", i, err)
				case owner == s.token && (isLive || !live):
					n++
				}
			}
			return n
		}
		if n := tokenRows(true); n != 2 {
			t.Fatalf("live rows of the token after the statement: got %d, want 2 (slot 2 kept)", n)
		}
		s.releaseOthers(ctx, l3.Slot())
		if n := tokenRows(false); n != 1 {
			t.Fatalf("rows of the token after releaseOthers: got %d, want 1", n)
		}
		info, err := c.Semaphore("r", 3).Inspect(ctx)
		if held := heldSlots(info); err != nil || len(held) != 1 || held[0].Slot != 1 {
			t.Fatalf("Inspect: got %+v, %v, want slot 1 held alone", info, err)
		}
	})
}
