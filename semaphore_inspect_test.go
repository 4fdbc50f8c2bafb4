package sqllock

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
)

// A slot of a semaphore is forced free as a name is: by default it stays
// taken by a lock-delay, which the semaphore's acquire counts as held (it
// takes no slot, and no resize, while every slot is held or under a
// lock-delay) and takes over once it has passed, with the next fence; the
// evicted holder's renewal fails; Inspect and List show the lock-delay with
// the semaphore's fence.
func TestSemaphore_ForceRelease(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		slotServer(t, e)
		table := e.newTable(t)
		a := e.client(t, e.db, table, WithHolder("a"))
		b := e.client(t, e.openDB(t), table, WithHolder("b"))
		ops := e.client(t, e.openDB(t), table, WithHolder("ops"))
		soon := e.client(t, e.openDB(t), table, WithHolder("ops"), WithLockDelay(time.Second))
		ctx := testCtx(t)
		// b's acquires below run within a 1 s lock-delay.
		warm(t, b, soon)
		s1, s2 := mustSlot(t, a, "pool", 2, time.Minute), mustSlot(t, a, "pool", 2, time.Minute)
		fence := s2.Fence()

		was, err := ops.Semaphore("pool", 2).ForceRelease(ctx, 2)
		if err != nil || was.Name != "pool" || was.Slot != 2 || was.Holder != "a" || !was.Held || was.Fence != fence {
			t.Fatalf("ForceRelease(2): got %+v, %v, want a's slot 2 with the semaphore's fence %d", was, err, fence)
		}
		if want := defaultLockDelay(was.TTL); was.LockDelay > want || was.LockDelay < want-time.Second {
			t.Fatalf("ForceRelease(2): got LockDelay %v, want the default %v for %v left", was.LockDelay, want, was.TTL)
		}
		wantErrIs(t, s2.Refresh(ctx, time.Minute), ErrNotHeld)
		const delayed = "lock-delay after a forced release of a"
		infos, err := ops.Semaphore("pool", 2).Inspect(ctx)
		if err != nil || len(infos) != 2 || !infos[1].Held || infos[1].Holder != delayed || infos[1].TTL > was.LockDelay || infos[1].Fence != fence {
			t.Fatalf("Inspect: got %+v, %v, want slot 2 under the lock-delay", infos, err)
		}
		list, err := ops.List(ctx)
		if err != nil || len(list) != 2 || list[1].Slot != 2 || list[1].Holder != delayed || list[1].Fence != fence || list[0].Fence != fence {
			t.Fatalf("List: got %+v, %v, want both slots, slot 2 under the lock-delay, with the fence %d", list, err, fence)
		}
		again, err := ops.Semaphore("pool", 2).ForceRelease(ctx, 2)
		if err != nil || again.Holder != delayed || again.LockDelay != again.TTL || again.Slot != 2 {
			t.Fatalf("a second ForceRelease(2): got %+v, %v, want the lock-delay left as it is", again, err)
		}

		forced := time.Now()
		was1, err := soon.Semaphore("pool", 2).ForceRelease(ctx, 1)
		if err != nil || was1.Slot != 1 || was1.LockDelay != time.Second || was1.Fence != fence {
			t.Fatalf("ForceRelease(1) with WithLockDelay(1s): got %+v, %v", was1, err)
		}
		// No holder is left, but both slots are under a lock-delay.
		_, err = b.Semaphore("pool", 2).TryAcquire(ctx, time.Minute)
		wantErrIs(t, err, ErrNotAcquired)
		_, err = b.Semaphore("pool", 3).TryAcquire(ctx, time.Minute)
		wantErrIs(t, err, ErrSlotCount)
		next, err := b.Semaphore("pool", 2).Acquire(ctx, time.Minute)
		if err != nil || next.Slot() != 1 || next.Fence() <= fence {
			t.Fatalf("Acquire: got %v, %v, want slot 1 with a fence above %d", next, err, fence)
		}
		if waited := time.Since(forced); waited < time.Second {
			t.Errorf("slot 1 taken %v after its forced release, want its 1s lock-delay first", waited)
		}
		wantErrIs(t, s1.Release(ctx), ErrNotHeld)

		_, err = ops.Semaphore("pool", 2).ForceRelease(ctx, 7)
		wantErrIs(t, err, ErrNotHeld)
		if err == nil || !strings.Contains(err.Error(), `slot 7 of the semaphore "pool" has no lease`) {
			t.Errorf("ForceRelease(7): got %v, want it to name the slot", err)
		}
	})
}

// Bad input is refused before anything is sent.
func TestSemaphore_ForceRelease_badInput(t *testing.T) {
	e := newMockEnv(t)
	ctx := context.Background()
	for _, c := range []struct {
		name string
		slot int
	}{{"pool", 0}, {"pool", MaxSlots + 1}, {"", 1}, {"pool" + slotMark, 1}} {
		if _, err := e.c.Semaphore(c.name, 2).ForceRelease(ctx, c.slot); err == nil {
			t.Errorf("Semaphore(%q).ForceRelease(%d): got nil, want an error", c.name, c.slot)
		}
	}
	e.assertNothingPrepared()
}

// Semaphore.Inspect, a read, needs no proof of the statements, as
// Client.Inspect needs none: an operator's account that may only read the
// table inspects a semaphore (sqllock inspect asks every name).
func TestSemaphore_Inspect_provesNothing(t *testing.T) {
	e := newMockEnv(t)
	e.expectPrepare("inspect")
	e.mock.ExpectQuery(e.sql("slot_list")).WithArgs(slotRows("pool"), slotRowsEnd("pool")).
		WillReturnRows(sqlmock.NewRows([]string{"name", "kind", "text", "fence", "live", "us"}).
			AddRow(slotRows("pool"), "F", "2", 77, false, -1).
			AddRow(slotName("pool", 2), "L", "h", 0, true, 5_000_000))
	infos, err := e.c.Semaphore("pool", 1).Inspect(context.Background())
	if err != nil || len(infos) != 2 || infos[0].Held || !infos[1].Held || infos[1].Holder != "h" || infos[1].Fence != 77 {
		t.Fatalf("got %+v, %v, want 2 slots, the second held by h, fence 77", infos, err)
	}
	e.done()
}
