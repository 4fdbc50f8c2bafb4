package sqllock

import (
	"testing"
	"time"
)

// holdAfterWaitingFor is holdAfterWaiting with a lease of ttl.
func holdAfterWaitingFor(t *testing.T, e *testEnv, c *Client, table, name string, ttl time.Duration) *Lock {
	t.Helper()
	ctx := testCtx(t)
	first := mustAcquire(t, e.client(t, e.openDB(t), table, WithWakeups(0)), name, wakeTTL)
	got := make(chan acquired, 1)
	go func() {
		l, err := c.Acquire(ctx, name, ttl)
		got <- acquired{l, err}
	}()
	waitFor(t, time.Minute, "the Client waits", func() bool { return headAttempts(c, name) > 0 })
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l := mustGet(t, got)
	l.mu.Lock()
	wake := l.wake
	l.mu.Unlock()
	if !wake || !c.wait.Channels.Holds(name) {
		t.Fatal("a Lock taken after waiting holds no channel: the test did not make the case")
	}
	return l
}

// wantNothingLeft waits, a few seconds at most, until c holds no channel
// and counts none in use, its pool has no connection checked out, and the
// server named lock of name is free.
func wantNothingLeft(t *testing.T, e *testEnv, c *Client, table, name string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		held, used, inUse := c.wait.Channels.Has(name), c.wait.Channels.InUse(), c.db.Stats().InUse
		holder := channelHolder(t, e.db, table, name)
		if !held && used == 0 && inUse == 0 && holder == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("left behind: channel in the Client %v, channels counted in use %d, pool connections in use %d, server named lock held by connection %d; want none",
				held, used, inUse, holder)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}
