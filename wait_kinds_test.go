package sqllock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Sets and semaphores wait in Acquire's queue (internal/wait): fair across
// processes and within the Client's connection bound, as single names are.

// takeTurns runs four Clients, each on a *sql.DB of its own (four
// processes), default options, looping acquire, hold, release until they
// made rounds acquisitions in all. It fails t if two held at once, or if
// any got less than 15% of the acquisitions. Counted by acquisitions, not
// by time, so that a loaded machine only makes it slower.
func takeTurns(t *testing.T, e *testEnv, acquire func(ctx context.Context, c *Client) (*Lock, error)) {
	t.Helper()
	const clients, rounds, hold = 4, 200, 2 * time.Millisecond
	table := e.newTable(t)
	cs := make([]*Client, clients)
	for i := range cs {
		cs[i] = e.client(t, e.openDB(t), table, WithHolder(fmt.Sprintf("p%d", i)))
		// The first use's proofs run before the race.
		l, err := acquire(testCtx(t), cs[i])
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(testCtx(t)); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(testCtx(t), 3*time.Minute)
	defer cancel()
	var (
		inside, total atomic.Int64
		per           [clients]atomic.Int64
		wg            sync.WaitGroup
	)
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				l, err := acquire(ctx, c)
				if err != nil {
					if ctx.Err() == nil {
						t.Errorf("client %d: %v", i, err)
						cancel()
					}
					return
				}
				if n := inside.Add(1); n != 1 {
					t.Errorf("client %d acquired while %d other held", i, n-1)
				}
				per[i].Add(1)
				time.Sleep(hold)
				inside.Add(-1)
				if err := l.Release(context.Background()); err != nil {
					t.Errorf("client %d: Release: %v", i, err)
				}
				if total.Add(1) >= rounds {
					cancel() // the others' waits end
				}
			}
		}()
	}
	wg.Wait()
	if total.Load() < rounds {
		t.Fatalf("%d acquisitions before the test's deadline, want %d", total.Load(), rounds)
	}
	got := make([]int64, clients)
	for i := range per {
		got[i] = per[i].Load()
	}
	t.Logf("acquisitions of each of %d processes: %v", clients, got)
	for i, n := range got {
		if n*100 < total.Load()*15 {
			t.Errorf("client %d got %d of %d acquisitions (%v), want at least 15%%", i, n, total.Load(), got)
		}
	}
}

// Four processes looping AcquireSet on one set take turns: before sets
// waited in Acquire's queue and on its channel, a process that released
// took the set back before the others polled (99 and 936 sets in 20 s).
func TestClient_AcquireSet_fairAcrossProcesses(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipSetsOnVitess(t, e)
		skipChannelsOnTiDB(t, e)
		takeTurns(t, e, func(ctx context.Context, c *Client) (*Lock, error) {
			return c.AcquireSet(ctx, []string{"a", "b"}, time.Minute)
		})
	})
}

// Four processes looping Semaphore.Acquire on a semaphore of one slot take turns.
func TestSemaphore_Acquire_fairAcrossProcesses(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		slotServer(t, e)
		takeTurns(t, e, func(ctx context.Context, c *Client) (*Lock, error) {
			return c.Semaphore("sem", 1).Acquire(ctx, time.Minute)
		})
	})
}

// A Client whose goroutines wait in a mix of Acquire, AcquireSet and
// Semaphore.Acquire, each for a name, set or semaphore of its own that another
// process holds, holds no more connections than the bound of internal/wait/look.go
// (13, and the pool's two idle ones: 16, as for single names in
// TestWithWakeups_manyNamesBoundedConnections); and when the holder lets go,
// every call acquires. Before sets and semaphores waited in Acquire's
// path, each of their calls sent its own attempts: 40 connections.
func TestClient_waitingKindsBoundedConnections(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		slotServer(t, e)
		const each = 14 // of each kind: 42 calls
		table := e.newTable(t)
		holder := e.client(t, e.openDB(t), table, WithHolder("holder"))
		ctx := testCtx(t)
		var held []*Lock
		for i := range each {
			held = append(held,
				mustAcquire(t, holder, fmt.Sprintf("n%02d", i), time.Minute),
				mustAcquire(t, holder, fmt.Sprintf("s%02d", i), time.Minute),
				mustSlot(t, holder, fmt.Sprintf("sem%02d", i), 1, time.Minute))
		}
		db, cc := e.countedDB(t)
		c := e.client(t, db, table, WithHolder("waiter"))
		// The first use's proofs, which take connections of their own,
		// run before the waits.
		for _, l := range []*Lock{
			mustAcquire(t, c, "warm", time.Minute),
			mustAcquireSet(t, c, time.Minute, "warm1", "warm2"),
			mustSlot(t, c, "warm", 1, time.Minute),
		} {
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		cc.most.Store(cc.open.Load())

		got := make(chan acquired, 3*each)
		for i := range each {
			for _, f := range []func() (*Lock, error){
				func() (*Lock, error) { return c.Acquire(ctx, fmt.Sprintf("n%02d", i), time.Minute) },
				func() (*Lock, error) {
					return c.AcquireSet(ctx, []string{fmt.Sprintf("s%02d", i), fmt.Sprintf("t%02d", i)}, time.Minute)
				},
				func() (*Lock, error) { return c.Semaphore(fmt.Sprintf("sem%02d", i), 1).Acquire(ctx, time.Minute) },
			} {
				go func() {
					l, err := f()
					got <- acquired{l, err}
				}()
			}
		}
		// Several polls of every key. A machine too loaded to make them
		// makes fewer attempts, which can only lower the count.
		time.Sleep(3 * time.Second)
		waiting := cc.most.Load()
		for _, l := range held {
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		for range 3 * each {
			r := <-got
			if r.err != nil {
				t.Fatalf("waiting call: %v", r.err)
			}
			defer r.l.Release(context.Background())
		}
		t.Logf("%d calls of three kinds: at most %d connections while waiting", 3*each, waiting)
		if waiting > 16 {
			t.Errorf("connections open at once while waiting: got %d, want at most 16", waiting)
		}
	})
}

// The release of any slot of a semaphore in the Client makes the
// semaphore's first waiter try at once, not at its next poll: with a
// strategy that polls every 10 s, the waiter has the slot well before.
func TestSemaphore_Acquire_localReleaseWakesWaiter(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		slotServer(t, e)
		c, p := e.proxiedClient(t, e.newTable(t), WithRetry(LinearBackoff(10*time.Second)), WithWakeups(0))
		ctx, cancel := context.WithTimeout(testCtx(t), 5*time.Second) // half a poll
		defer cancel()
		first, second := mustSlot(t, c, "sem", 2, time.Minute), mustSlot(t, c, "sem", 2, time.Minute)
		p.ResetCounts()
		got := make(chan acquired, 1)
		go func() {
			l, err := c.Semaphore("sem", 2).Acquire(ctx, time.Minute)
			got <- acquired{l, err}
		}()
		waitFor(t, time.Minute, "the waiter's first attempt", func() bool { return p.Commands()[proxyComStmtExecute] >= 1 })
		time.Sleep(100 * time.Millisecond) // its answer: refused
		if err := second.Release(ctx); err != nil {
			t.Fatal(err)
		}
		r := <-got
		if r.err != nil || r.l.Slot() != second.Slot() {
			t.Fatalf("Semaphore.Acquire after slot %d's release: got %v, %v, want that slot before the next poll", second.Slot(), r.l, r.err)
		}
		_ = r.l.Release(ctx)
		_ = first.Release(ctx)
	})
}

// A strategy that gives up ends a waiting AcquireSet with the set's
// refusal, a *HeldError naming the held names, and Semaphore.Acquire with its
// own, as their Try calls answer; ErrSlotCount ends Semaphore.Acquire at once.
func TestClient_waitingKinds_strategyGivesUp(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		slotServer(t, e)
		table := e.newTable(t)
		holder := e.client(t, e.openDB(t), table)
		c := e.client(t, e.openDB(t), table, WithRetry(LimitRetry(LinearBackoff(10*time.Millisecond), 3)))
		ctx := testCtx(t)
		mustAcquire(t, holder, "b", time.Minute)
		mustSlot(t, holder, "sem", 1, time.Minute)
		_, err := c.AcquireSet(ctx, []string{"a", "b"}, time.Minute)
		wantHeld(t, err, "b")
		_, err = c.Semaphore("sem", 1).Acquire(ctx, time.Minute)
		if !errors.Is(err, ErrNotAcquired) || errors.Is(err, ErrSlotCount) {
			t.Errorf("Semaphore.Acquire: got %v, want ErrNotAcquired alone", err)
		}
		_, err = c.Semaphore("sem", 2).Acquire(ctx, time.Minute)
		if !errors.Is(err, ErrSlotCount) {
			t.Errorf("Semaphore.Acquire with another n: got %v, want ErrSlotCount", err)
		}
	})
}
