package sqllock

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// Issue 22, point 6. A Lock that took its name through the channel and is
// left to lapse, never released, lets go of the channel once its lease could
// have expired: the connection goes back, the server named lock is freed,
// and a process waiting for the name hears of it at once.
func TestWithWakeups_lapsedLockLetsGoOfChannel(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipChannelsOnTiDB(t, e)
		table := e.newTable(t)
		c := e.client(t, e.openDB(t), table)
		ctx := testCtx(t)
		first := mustAcquire(t, e.client(t, e.openDB(t), table), "n", time.Minute)
		got := make(chan acquired, 1)
		go func() {
			// Long enough that the check below comes before the lapse on a
			// loaded machine.
			l, err := c.Acquire(ctx, "n", time.Second)
			got <- acquired{l, err}
		}()
		waitFor(t, time.Minute, "the Client waits", func() bool { return headAttempts(c, "n") > 0 })
		if err := first.Release(ctx); err != nil {
			t.Fatal(err)
		}
		l := mustGet(t, got)
		if l.hold.Load() == nil || !c.wait.Peek("n").Holds {
			t.Fatal("a Lock taken after waiting holds no channel: the test did not make the case")
		}
		// Left to lapse: no Release, no Refresh.
		waitFor(t, 10*time.Second, "the channel is let go of after the lease lapsed", func() bool {
			return !c.wait.Peek("n").Holds && channelHolder(t, e.db, table, "n") == 0
		})
	})
}

// A process that took a name without waiting, and releases and acquires it
// again at once, queues behind the process that polls for it (which holds
// the channel): its release asks whether anyone waits.
func TestWithWakeups_holderThatNeverWaitedQueues(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		skipChannelsOnTiDB(t, e)
		table := e.newTable(t)
		ctx := testCtx(t)
		h := e.client(t, e.openDB(t), table)
		held, err := h.Acquire(ctx, "n", wakeTTL)
		if err != nil {
			t.Fatal(err)
		}
		w := e.client(t, e.openDB(t), table, WithRetry(LinearBackoff(200*time.Millisecond)))
		got := acquireAsync(ctx, w, "n")
		waitFor(t, time.Minute, "the waiter holds the channel and polls", func() bool {
			return headAttempts(w, "n") > 1 && w.wait.Peek("n").Holds
		})
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
		waiterFirst(t, got, acquireAsync(ctx, h, "n"))
	})
}

// A holder stuck with the channel (it neither releases nor refreshes) does
// not keep a waiter from the name once its lease lapses: the waiter's
// GET_LOCK times out and it polls. The stuck process is a lease that is
// never refreshed and a session that holds the channel and sends nothing
// more, so that nothing lets the channel go (a Client's own holder would,
// once its lease lapsed, and race the waiter's poll).
func TestWithWakeups_stuckHolderLapses(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipChannelsOnTiDB(t, e)
		table := e.newTable(t)
		ctx := testCtx(t)
		stuck := mustAcquire(t, e.client(t, e.openDB(t), table), "n", time.Second) // never refreshed
		channel, err := e.db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { channel.Close() })
		hex := "X'" + fmt.Sprintf("%x", "n") + "'"
		text := func(stmt string) string {
			q := strings.ReplaceAll(queries[stmt], "'sqllock'", "'"+table+"'")
			q = strings.Replace(q, "?", hex, 2)
			return strings.Replace(q, "?", "1", 1)
		}
		var wasFree, granted int
		if err := channel.QueryRowContext(ctx, text("wake_wait")).Scan(&wasFree, &granted); err != nil || granted != 1 {
			t.Fatalf("taking the channel by hand: got granted %d, %v; want 1", granted, err)
		}
		t.Cleanup(func() { _, _ = channel.ExecContext(context.Background(), text("wake_release")) })
		holder := channelHolder(t, e.db, table, "n")
		if holder == 0 {
			t.Fatal("the stuck holder: got no channel, want it held")
		}
		r := newEventRecorder()
		w := e.client(t, e.openDB(t), table, WithObserver(r.observer()))
		l, err := w.Acquire(ctx, "n", time.Second)
		if err != nil {
			t.Fatalf("Acquire behind a stuck holder: %v", err)
		}
		if l.Fence() <= stuck.Fence() {
			t.Errorf("fence: got %d, want more than %d", l.Fence(), stuck.Fence())
		}
		r.mu.Lock()
		timedOut := r.counts["wakeup n timed_out"]
		r.mu.Unlock()
		if timedOut == 0 {
			t.Errorf("the waiter's waits on the channel: got none timed out, want it to have waited there and polled")
		}
		if got := channelHolder(t, e.db, table, "n"); got != holder {
			t.Errorf("the stuck holder's channel: got held by session %d, want still by %d (the waiter polled past it)", got, holder)
		}
	})
}
