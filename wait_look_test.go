package sqllock

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// countingConnector connects to the environment's server and counts the
// connections open at once, and the most there ever were.
type countingConnector struct {
	driver.Connector
	open, most, dials atomic.Int64
}

func (cc *countingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	c, err := cc.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	cc.dials.Add(1)
	n := cc.open.Add(1)
	for m := cc.most.Load(); n > m && !cc.most.CompareAndSwap(m, n); m = cc.most.Load() {
	}
	return &countedConn{passConn: passConn{c}, cc: cc}, nil
}

type countedConn struct {
	passConn
	cc     *countingConnector
	closed atomic.Bool
}

func (c *countedConn) Close() error {
	if !c.closed.Swap(true) {
		c.cc.open.Add(-1)
	}
	return c.Conn.Close()
}

func (c *countedConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	return c.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, query)
}

func (c *countedConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	return c.Conn.(driver.QueryerContext).QueryContext(ctx, query, args)
}

func (c *countedConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	return c.Conn.(driver.ExecerContext).ExecContext(ctx, query, args)
}

// countedDB opens the environment's server with database/sql's default
// pool (no limit on open connections, two kept idle), counting connections.
func (e *testEnv) countedDB(t *testing.T) (*sql.DB, *countingConnector) {
	t.Helper()
	cc := &countingConnector{Connector: e.quietConnector(t, func(*mysql.Config) {})}
	db := sql.OpenDB(cc)
	t.Cleanup(func() { db.Close() })
	return db, cc
}

// Issue 22, point 1. A Client with default options, on a pool left
// unlimited, whose goroutines wait for 100 names another process holds,
// holds at most 16 connections at once (defaultWakeups channels, the
// waiting calls' acquire slots and one look: 13), and once the names are
// released, hands every one of them over. Without the bound, every name's
// queue polled on its own, and such a Client opened 75 connections.
func TestWakeups_manyNamesBoundedConnections(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		const names = 100
		table := e.newTable(t)
		holder := e.client(t, e.openDB(t), table, WithHolder("holder"))
		ctx := testCtx(t)
		var held []*Lock
		for i := range names {
			held = append(held, mustAcquire(t, holder, fmt.Sprintf("n%03d", i), time.Minute))
		}
		db, cc := e.countedDB(t)
		c := e.client(t, db, table, WithHolder("waiter"))
		var mostChannels atomic.Int64
		stop := make(chan struct{})
		sampled := make(chan struct{})
		go func() { // the channels in use, sampled
			defer close(sampled)
			for {
				if n := int64(c.wait.Channels.InUse()); n > mostChannels.Load() {
					mostChannels.Store(n)
				}
				select {
				case <-stop:
					return
				case <-time.After(time.Millisecond):
				}
			}
		}()
		got := make(chan acquired, names)
		for i := range names {
			go func() {
				l, err := c.Acquire(ctx, fmt.Sprintf("n%03d", i), time.Minute)
				got <- acquired{l, err}
			}()
		}
		waitFor(t, time.Minute, "every name is waited for", func() bool {
			for i := range names {
				if headAttempts(c, fmt.Sprintf("n%03d", i)) < 1 {
					return false
				}
			}
			return true
		})
		time.Sleep(2 * time.Second) // several polls of every name
		waiting := cc.most.Load()
		released := time.Now()
		for _, l := range held {
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		var last time.Time
		for range names {
			r := <-got
			if r.err != nil {
				t.Fatalf("Acquire: %v", r.err)
			}
			last = time.Now()
			defer r.l.Release(context.Background())
		}
		close(stop)
		<-sampled
		t.Logf("100 names: at most %d connections while waiting, %d in all, %d dials; at most %d channels; the last name taken %v after the releases began",
			waiting, cc.most.Load(), cc.dials.Load(), mostChannels.Load(), last.Sub(released).Round(time.Millisecond))
		if most := cc.most.Load(); most > 16 {
			t.Errorf("connections open at once: got %d, want at most 16", most)
		}
		if n := mostChannels.Load(); n > defaultWakeups {
			t.Errorf("wake-up channels at once: got %d, want at most %d", n, defaultWakeups)
		}
	})
}

// The look statement answers for many names at once, as the acquire would
// decide: held while a live lease stands, free when the name was never
// taken, was released, or its lease expired. 150 names, asked at once, go
// in more than one statement.
func TestLook_answersForEveryName(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		holder := e.client(t, e.openDB(t), table)
		c := e.client(t, e.openDB(t), table)
		ctx := testCtx(t)
		const n = 150
		want := make(map[string]bool)
		var lapsing []*Lock
		for i := range n {
			name := fmt.Sprintf("k%03d\x00ü", i) // any bytes
			switch i % 4 {
			case 0: // live
				mustAcquire(t, holder, name, time.Minute)
				want[name] = true
			case 1: // released
				if err := mustAcquire(t, holder, name, time.Minute).Release(ctx); err != nil {
					t.Fatal(err)
				}
			case 2: // expires
				lapsing = append(lapsing, mustAcquire(t, holder, name, 50*time.Millisecond))
			} // 3: never taken
		}
		time.Sleep(100 * time.Millisecond)
		for _, l := range lapsing {
			if l.ValidUntil().After(time.Now()) {
				t.Fatal("a lease meant to expire is still valid")
			}
		}
		var wg sync.WaitGroup
		for i := range n {
			name := fmt.Sprintf("k%03d\x00ü", i)
			wg.Add(1)
			go func() {
				defer wg.Done()
				got, err := c.wait.Looks.Held(ctx, name)
				if err != nil || got != want[name] {
					t.Errorf("lookHeld(%q): got %v, %v, want %v", name, got, err, want[name])
				}
			}()
		}
		wg.Wait()
	})
}

// A look asked after Close started ends with ErrClosed, and Close waits for
// the look under way, which ends with it.
func TestLook_close(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		c := e.newClient(t)
		ctx := testCtx(t)
		if _, err := c.wait.Looks.Held(ctx, "x"); err != nil {
			t.Fatalf("lookHeld before Close: %v", err)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := c.wait.Looks.Held(ctx, "x"); !errors.Is(err, ErrClosed) {
			t.Errorf("lookHeld after Close: got %v, want ErrClosed", err)
		}
	})
}

// Close racing a Client that waits for many names (its heads polling with
// looks) ends every wait with ErrClosed, and no look is left running: the
// sender goroutine has returned when Close does.
func TestLook_closeRacesManyWaiters(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		const names = 40
		table := e.newTable(t)
		holder := e.client(t, e.openDB(t), table)
		for i := range names {
			mustAcquire(t, holder, fmt.Sprintf("n%02d", i), time.Minute)
		}
		for round := range 3 {
			c, err := New(e.openDB(t), WithTable(table), WithRetry(LinearBackoff(time.Millisecond)))
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan error, names)
			for i := range names {
				go func() {
					_, err := c.Acquire(testCtx(t), fmt.Sprintf("n%02d", i), time.Minute)
					got <- err
				}()
			}
			waitFor(t, time.Minute, "every name is waited for", func() bool {
				return c.wait.Queues.Len() == names
			})
			time.Sleep(time.Duration(round) * 7 * time.Millisecond)
			if err := within(t, "Close", c.Close); err != nil {
				t.Fatal(err)
			}
			if c.wait.Looks.Sending() {
				t.Error("a look sender still runs after Close returned")
			}
			for range names {
				if err := <-got; !errors.Is(err, ErrClosed) {
					t.Errorf("Acquire when Close ended its wait: got %v, want ErrClosed", err)
				}
			}
		}
	})
}
