package sqllock

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// Issue 22, point 6. After every way a Lock holding its name's wake-up
// channel can end, and every way a wait on the channel can end, nothing is
// left behind: the Client holds no channel and counts none in use, its pool
// has no connection checked out, and the server named lock is free. Each
// case runs with wake-up channels as they are by default.
func TestWakeups_nothingLeftAfterEveryEnd(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipChannelsOnTiDB(t, e)
		ends := []struct {
			name string
			ttl  time.Duration
			// end ends l, a Lock of c that holds the channel of name.
			end func(t *testing.T, c *Client, l *Lock, table, name string)
		}{
			{"Release", wakeTTL, func(t *testing.T, c *Client, l *Lock, table, name string) {
				if err := l.Release(testCtx(t)); err != nil {
					t.Fatal(err)
				}
			}},
			{"Release after its context ended", wakeTTL, func(t *testing.T, c *Client, l *Lock, table, name string) {
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				if err := l.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}},
			{"lapse", 300 * time.Millisecond, func(t *testing.T, c *Client, l *Lock, table, name string) {
				time.Sleep(time.Until(l.ValidUntil()))
			}},
			{"loss", 300 * time.Millisecond, func(t *testing.T, c *Client, l *Lock, table, name string) {
				time.Sleep(time.Until(l.ValidUntil()))
				other := e.client(t, e.openDB(t), table, WithWakeups(0))
				// By the server's clock the lease may end a little later
				// than ValidUntil (the acquire ran after it was sent).
				pollAcquire(t, other, name, time.Minute)
				if err := l.Refresh(testCtx(t), time.Minute); !errors.Is(err, ErrNotHeld) {
					t.Fatalf("Refresh after a takeover: got %v, want ErrNotHeld", err)
				}
			}},
			{"Close", wakeTTL, func(t *testing.T, c *Client, l *Lock, table, name string) {
				if err := c.Close(); err != nil {
					t.Fatal(err)
				}
			}},
			{"killed channel connection", wakeTTL, func(t *testing.T, c *Client, l *Lock, table, name string) {
				skipFakeFor(t, e, "it KILLs the channel's connection")
				id := channelHolder(t, e.db, table, name)
				if _, err := e.db.Exec(fmt.Sprintf("KILL CONNECTION %d", id)); err != nil {
					t.Fatal(err)
				}
				if err := l.Release(testCtx(t)); err != nil {
					t.Fatalf("Release after its channel's connection was killed: %v", err)
				}
			}},
		}
		for _, end := range ends {
			t.Run(end.name, func(t *testing.T) {
				table := e.newTable(t)
				db := e.openDB(t)
				c := e.client(t, db, table)
				l := holdAfterWaitingFor(t, e, c, table, "n", end.ttl)
				end.end(t, c, l, table, "n")
				wantNothingLeft(t, e, c, table, "n")
			})
		}

		t.Run("cancelled Acquire waiting on the channel", func(t *testing.T) {
			table := e.newTable(t)
			h := e.client(t, e.openDB(t), table)
			hl := holdAfterWaiting(t, e, h, table, "n")
			c := e.client(t, e.openDB(t), table)
			ctx, cancel := context.WithCancel(testCtx(t))
			got := acquireAsync(ctx, c, "n")
			waitFor(t, time.Minute, "the waiter blocks on the channel", func() bool { return channelWaiters(t, e, table) == 1 })
			cancel()
			if r := <-got; !errors.Is(r.err, context.Canceled) {
				t.Fatalf("cancelled Acquire: got %v, want context.Canceled", r.err)
			}
			if err := hl.Release(testCtx(t)); err != nil {
				t.Fatal(err)
			}
			wantNothingLeft(t, e, c, table, "n")
			wantNothingLeft(t, e, h, table, "n")
		})

		t.Run("Acquire whose context ends as it takes the name", func(t *testing.T) {
			// Many tries, so that the end falls around the acquire in some.
			table := e.newTable(t)
			c := e.client(t, e.openDB(t), table)
			other := e.client(t, e.openDB(t), table, WithWakeups(0))
			for i := range 20 {
				name := fmt.Sprintf("c%d", i)
				first := mustAcquire(t, other, name, time.Minute)
				ctx, cancel := context.WithCancel(testCtx(t))
				got := acquireAsync(ctx, c, name)
				waitFor(t, time.Minute, "the Client waits", func() bool { return headAttempts(c, name) > 0 })
				if err := first.Release(testCtx(t)); err != nil {
					t.Fatal(err)
				}
				time.Sleep(time.Duration(i%5) * 200 * time.Microsecond)
				cancel()
				if r := <-got; r.err == nil {
					if err := r.l.Release(testCtx(t)); err != nil {
						t.Fatal(err)
					}
				}
				wantNothingLeft(t, e, c, table, name)
			}
		})
	})
}

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
