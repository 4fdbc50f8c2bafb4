package sqllock

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/sqllock/sqllock/internal/wait"
)

// Issue 20, point 4. Close lets go of every channel its Client holds, even a
// free one it reaches after its own time is up: the server named lock would
// otherwise stay held, on a connection checked out of the pool, until the
// server drops the idle session. Ten channels, so that a pass that skipped
// each with even odds would leave some.
func TestWakeups_closeAfterItsTimeFreesEveryChannel(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipChannelsOnTiDB(t, e)
		table := e.newTable(t)
		c := e.client(t, e.openDB(t), table, WithWakeups(10))
		ctx := testCtx(t)
		var names []string
		for i := range 10 {
			name := fmt.Sprintf("n%d", i)
			// Nobody holds the channel: the wait is granted at once, and
			// the name's queue keeps it, idle.
			st, _, err := c.wait.Channels.Wait(ctx, name, time.Second)
			if err != nil || st != wait.Granted {
				t.Fatalf("waitWake(%s): got %v, %v, want granted", name, st, err)
			}
			names = append(names, name)
		}
		ended, cancel := context.WithCancel(context.Background())
		cancel()
		c.wait.Channels.Stop()
		c.wait.Channels.CloseAll(ended)
		for _, name := range names {
			wantChannelFree(t, e.db, table, name, "after Close")
		}
	})
}

// Issue 20, point 5. A wait on a channel whose connection went silent (a
// NAT or a load balancer dropped it; here a proxy that holds all traffic)
// ends on the client a little after the server's GET_LOCK timeout, not when
// TCP gives up minutes later.
func TestWakeups_silentConnectionWaitEnds(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipChannelsOnTiDB(t, e)
		table := e.newTable(t)
		c, p := e.proxiedClient(t, table)
		mustAcquire(t, c, "warm", time.Second).Release(testCtx(t))
		p.Stall(true)
		t.Cleanup(func() { p.Stall(false) })
		done := make(chan wait.State, 1)
		go func() {
			st, _, _ := c.wait.Channels.Wait(context.Background(), "silent", time.Second)
			done <- st
		}()
		// The bound: GET_LOCK's second plus wakeWaitSlack; a minute is
		// what TCP would take, at the least.
		select {
		case st := <-done:
			if st != wait.Failed {
				t.Errorf("wait on a silent connection: got state %v, want failed (poll)", st)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the wait on a silent connection did not end within 30s")
		}
	})
}

// Issue 20, point 5. A DSN readTimeout shorter than a channel's wait cuts
// every wait: the Client notices after two cut alike, says so once, and
// waits less from then on.
func TestWakeups_readTimeoutShortensWaits(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipChannelsOnTiDB(t, e)
		table := e.newTable(t)
		rec, logOpt := newRecorder()
		db := e.openDBWith(t, func(c *mysql.Config) { c.ReadTimeout = 3 * time.Second })
		c := e.client(t, db, table, logOpt)
		holder := holdAfterWaiting(t, e, e.client(t, e.openDB(t), table), table, "n")
		defer holder.Release(testCtx(t))
		for i := range 2 {
			st, _, err := c.wait.Channels.Wait(testCtx(t), "n", time.Minute)
			if err != nil || st != wait.Failed {
				t.Fatalf("wait %d: got %v, %v, want failed (cut by the read timeout)", i, st, err)
			}
		}
		if got := c.wait.Channels.MaxWait(); got != 2*time.Second {
			t.Errorf("longest wait after two cut at 3s: got %v, want 2s", got)
		}
		warned := slices.ContainsFunc(rec.atLeast(slog.LevelWarn), func(s string) bool { return strings.Contains(s, "readTimeout") })
		if !warned {
			t.Errorf("no warning about readTimeout; logged: %v", rec.atLeast(slog.LevelWarn))
		}
		// Now shorter than the read timeout, a wait times out on the server.
		if st, _, err := c.wait.Channels.Wait(testCtx(t), "n", time.Minute); err != nil || st != wait.TimedOut {
			t.Errorf("wait after the change: got %v, %v, want timed out", st, err)
		}
	})
}

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

// Issue 22, point 3. A channel's connection that the server drops after it
// idled (a short wait_timeout) wedges nobody: the Lock holding it releases
// without error, and a process waiting for the name gets it.
func TestWakeups_channelDroppedByWaitTimeout(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipChannelsOnTiDB(t, e)
		table := e.newTable(t)
		short := e.openDBWith(t, func(c *mysql.Config) { setParam(c, "wait_timeout", "1") })
		c := e.client(t, short, table)
		l := holdAfterWaiting(t, e, c, table, "n")
		// The idle channel connection outlives the server's patience.
		waitFor(t, 10*time.Second, "the server drops the idle channel", func() bool {
			return channelHolder(t, e.db, table, "n") == 0
		})
		ctx := testCtx(t)
		other := e.client(t, e.openDB(t), table, WithRetry(LinearBackoff(20*time.Millisecond)))
		got := acquireAsync(ctx, other, "n")
		waitFor(t, time.Minute, "the other process waits", func() bool { return headAttempts(other, "n") > 0 })
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release of a Lock whose channel the server dropped: %v", err)
		}
		w := mustGet(t, got)
		if err := w.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// wantChannelFree checks that nobody holds the channel of name in table. A
// discarded connection's named lock is freed once the server has seen the
// disconnect, a moment later: it waits for that, up to a few seconds.
func wantChannelFree(t *testing.T, db *sql.DB, table, name, when string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		id := channelHolder(t, db, table, name)
		if id == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("channel of %s %s: held by connection %d, want free", name, when, id)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}
