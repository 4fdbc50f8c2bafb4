package sqllock

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/wait"
)

// Issue 22, point 6. A Lock that took its name through the channel and is
// left to lapse, never released, lets go of the channel once its lease could
// have expired: the connection goes back, the server named lock is freed,
// and a process waiting for the name hears of it at once.
func TestWakeups_lapsedLockLetsGoOfChannel(t *testing.T) {
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
		l.mu.Lock()
		wake := l.wake
		l.mu.Unlock()
		if !wake || !c.wait.Channels.Holds("n") {
			t.Fatal("a Lock taken after waiting holds no channel: the test did not make the case")
		}
		// Left to lapse: no Release, no Refresh.
		waitFor(t, 10*time.Second, "the channel is let go of after the lease lapsed", func() bool {
			return !c.wait.Channels.Holds("n") && channelHolder(t, e.db, table, "n") == 0
		})
	})
}

// Issue 22, point 6. An Acquire whose context ends just as its acquire
// succeeds still gives its Lock the channel the queue held, so that the
// Lock's release lets go of it. Ten names: a hand-over that depended on the
// caller's context would fail about half of them.
func TestWakeups_handOverAfterContextEnded(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipChannelsOnTiDB(t, e)
		table := e.newTable(t)
		c := e.client(t, e.openDB(t), table)
		ctx := testCtx(t)
		ended, cancel := context.WithCancel(context.Background())
		cancel()
		for i := range 10 {
			name := fmt.Sprintf("h%d", i)
			if st, _, err := c.wait.Channels.Wait(ctx, name, time.Second); err != nil || st != wait.Granted {
				t.Fatalf("waitWake(%s): got %v, %v, want granted", name, st, err)
			}
			l := mustAcquire(t, c, name, time.Minute)
			c.wait.Channels.HandTo(ended, name, l, l.holdChannel)
			l.mu.Lock()
			wake := l.wake
			l.mu.Unlock()
			if !wake {
				t.Errorf("%s: the Lock did not get the channel", name)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			wantChannelFree(t, e.db, table, name, "after Release")
		}
	})
}
