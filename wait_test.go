package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock/internal/engine"
	"github.com/sqllock/sqllock/internal/fault"
	"github.com/sqllock/sqllock/internal/sqltext"
)

// These tests run against a real server, through the counting proxy: what
// they prove is how many statements the waiters of one Client send.

// headAttempts returns how many refused attempts the first caller waiting
// for name has counted, or -1 when nobody waits.
func headAttempts(c *Client, name string) int {
	return c.wait.Peek(name).HeadAttempts
}

// 64 goroutines waiting for one name send no more statements per poll than
// one does: only the first in line polls. Counted per poll of the head, not
// per second, so that a loaded machine, which slows the polls, cannot
// change the comparison.
func TestClient_Acquire_sharedPoller(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		mustAcquire(t, e.client(t, e.db, table), "busy", time.Minute)
		const polls = 30
		sent := func(waiters int) int {
			c, p := e.proxiedClient(t, table, WithRetry(LinearBackoff(10*time.Millisecond)))
			ctx, cancel := context.WithCancel(testCtx(t))
			defer cancel()
			var wg sync.WaitGroup
			for range waiters {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, err := c.Acquire(ctx, "busy", time.Second)
					if !errors.Is(err, ErrNotAcquired) || !errors.Is(err, context.Canceled) {
						t.Errorf("Acquire: got %v, want ErrNotAcquired and context.Canceled", err)
					}
				}()
			}
			waitFor(t, time.Minute, "every caller waits", func() bool {
				return c.wait.Peek("busy").Waiting == waiters && headAttempts(c, "busy") > 0
			})
			p.ResetCounts()
			first := headAttempts(c, "busy")
			waitFor(t, time.Minute, fmt.Sprintf("%d polls", polls), func() bool { return headAttempts(c, "busy") >= first+polls })
			n := p.CommandCount()
			cancel()
			wg.Wait()
			if got := c.wait.Peek("busy").Waiting; got != 0 {
				t.Errorf("got %d callers still queued after they returned, want 0", got)
			}
			return n
		}
		one := sent(1)
		many := sent(64)
		t.Logf("statements in %d polls of the head: 1 waiter %d, 64 waiters %d", polls, one, many)
		if one < polls/2 {
			t.Fatalf("1 waiter sent %d statements in %d polls; the test cannot compare", one, polls)
		}
		if many*2 > one*3 {
			t.Fatalf("64 waiters sent %d statements, 1 waiter %d, in %d polls: want at most 1.5 times as many", many, one, polls)
		}
	})
}

// A Release in the same Client hands the name to the next waiter at once:
// with a strategy that polls every 10 s, each handoff costs exactly the
// release and the next waiter's one acquire.
func TestClient_Acquire_localReleaseWakesWaiter(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		const waiters = 4
		// The queue of one Client, without wake-up channels, whose
		// statements would count.
		c, p := e.proxiedClient(t, e.newTable(t), WithRetry(LinearBackoff(10*time.Second)), WithWakeups(0))
		ctx, cancel := context.WithTimeout(testCtx(t), 5*time.Second) // half a poll
		defer cancel()
		if err := mustAcquire(t, c, "warm", time.Second).Release(ctx); err != nil {
			t.Fatal(err) // prepares the release statement before counting
		}
		holder := mustAcquire(t, c, "x", time.Minute)

		var wg sync.WaitGroup
		fences := make(chan uint64, waiters)
		acquire := func() {
			wg.Add(1)
			go func() {
				defer wg.Done()
				l, err := c.Acquire(ctx, "x", time.Minute)
				if err != nil {
					t.Errorf("Acquire: got %v, want the lock before the next poll", err)
					return
				}
				fences <- l.Fence()
				if err := l.Release(ctx); err != nil {
					t.Errorf("Release: %v", err)
				}
			}()
		}
		// The first caller tries and is refused; the others queue behind it
		// without trying.
		acquire()
		waitFor(t, time.Minute, "the first waiter was refused", func() bool { return headAttempts(c, "x") == 1 })
		for range waiters - 1 {
			acquire()
		}
		waitFor(t, time.Minute, "every caller waits", func() bool { return c.wait.Peek("x").Waiting == waiters })
		noRecheck(c)
		// An acquire statement that has not answered within 100 ms (a
		// loaded machine) starts the frozen-holder watch, whose read of
		// the lease (internal/engine/frozen.go) is no handoff's: a CI run
		// counted it here. The watch is put off.
		c.eng.SetFrozenLook(time.Hour)
		p.ResetCounts()
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		close(fences)
		last := holder.Fence()
		for f := range fences {
			if f <= last {
				t.Errorf("got fence %d after %d, want fences increasing", f, last)
			}
			last = f
		}
		if got, want := p.Commands()[proxyComStmtExecute], 1+2*waiters; got != want || p.CommandCount() != want {
			t.Errorf("sent %v for %d handoffs, want exactly %d statements: each handoff a release and one acquire", p.Commands(), waiters, want)
		}
	})
}

// When the first in line leaves (here its context ends), the next caller
// takes over, and a later Release still wakes it at once.
func TestClient_Acquire_headLeaves(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		c := e.newClient(t, WithRetry(LinearBackoff(10*time.Second)), WithWakeups(0))
		ctx, cancel := context.WithTimeout(testCtx(t), 5*time.Second)
		defer cancel()
		holder := mustAcquire(t, c, "x", time.Minute)

		headCtx, headCancel := context.WithCancel(ctx)
		headErr := make(chan error, 1)
		go func() {
			_, err := c.Acquire(headCtx, "x", time.Minute)
			headErr <- err
		}()
		waitFor(t, time.Minute, "the first waiter was refused", func() bool { return headAttempts(c, "x") == 1 })
		next := make(chan error, 1)
		go func() {
			l, err := c.Acquire(ctx, "x", time.Minute)
			if err == nil {
				err = l.Release(ctx)
			}
			next <- err
		}()
		waitFor(t, time.Minute, "the second caller waits", func() bool { return c.wait.Peek("x").Waiting == 2 })
		headCancel()
		err := <-headErr
		wantErrIs(t, err, ErrNotAcquired)
		wantErrIs(t, err, context.Canceled)
		waitFor(t, time.Minute, "the first caller left", func() bool { return c.wait.Peek("x").Waiting == 1 })
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-next; err != nil {
			t.Fatalf("the caller that took over: got %v, want the lock before the next poll", err)
		}
	})
}

// Every refused statement counts as an attempt of each caller waiting for
// its answer, so LimitRetry ends queued callers as it ends a lone one, and
// they do not multiply the statements sent.
func TestClient_Acquire_queuedCallersCountAttempts(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		const callers, limit = 16, 3
		table := e.newTable(t)
		mustAcquire(t, e.client(t, e.db, table), "busy", time.Minute)
		c, p := e.proxiedClient(t, table, WithRetry(LimitRetry(LinearBackoff(20*time.Millisecond), limit)))
		mustAcquire(t, c, "warm", time.Second) // prepare before counting
		p.ResetCounts()
		ctx := testCtx(t)
		var wg sync.WaitGroup
		for range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := c.Acquire(ctx, "busy", time.Second)
				if !errors.Is(err, ErrNotAcquired) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("Acquire: got %v, want a plain ErrNotAcquired from a strategy that gave up", err)
				}
			}()
		}
		wg.Wait()
		n := p.CommandCount()
		t.Logf("%d callers limited to %d attempts each sent %d statements", callers, limit, n)
		// Callers that join after the first answer need up to limit more;
		// without the queue they would send callers*limit.
		if n < limit || n > callers*limit/4 {
			t.Fatalf("sent %d statements, want between %d and %d", n, limit, callers*limit/4)
		}
	})
}

// readOnlyDB opens a pool whose every session refuses writes (error 1792, a
// read-only transaction): a refusal that may pass, as a failover's read-only
// server's 1290 is, which a test cannot make without changing the server's
// globals.
func readOnlyDB(t *testing.T, e *testEnv) *sql.DB {
	t.Helper()
	variable := "transaction_read_only"
	if e.server.MariaDB {
		variable = "tx_read_only"
	}
	db := sql.OpenDB(e.quietConnector(t, func(c *mysql.Config) { setParam(c, variable, "1") }))
	t.Cleanup(func() { db.Close() })
	return db
}

// wantRefusal fails t unless err, the end of a waiting call whose context
// ended and that only ever met the server's refusal, says so: it wraps the
// context's error, ErrNotAcquired, and the refusal.
func wantRefusal(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("%s: got %v, want an error wrapping the context's deadline", what, err)
	}
	if me := (*mysql.MySQLError)(nil); !errors.As(err, &me) || me.Number != fault.ReadOnlyTx {
		t.Errorf("%s: got %v, want an error wrapping the server's refusal (1792)", what, err)
	}
	if !strings.Contains(err.Error(), "READ ONLY") {
		t.Errorf("%s: got %v, want the server's refusal named", what, err)
	}
}

// Every caller of a waiting call that only ever met a refusal ends with it
// wrapped, not with a bare deadline: followers in a queue, whose head met
// it, too (before, 12 of 16 waiting Acquire calls in 4 Clients said only
// "not acquired: context deadline exceeded"); and AcquireSet, Semaphore.Acquire and
// Elect.
func TestClient_Acquire_onlyRefused(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipFakeFor(t, e, "it needs a session that refuses writes")
		if e.server.TiDB {
			t.Skip("TiDB has no read-only transactions: transaction_read_only is a no-op function it refuses (1235)")
		}
		skipOnVitess(t, e, vitessNoReadOnly)
		table := e.newTable(t)
		var wg sync.WaitGroup
		var mu sync.Mutex
		errs := map[string]error{}
		run := func(what string, f func(ctx context.Context) error) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
				defer cancel()
				err := f(ctx)
				mu.Lock()
				errs[what] = err
				mu.Unlock()
			}()
		}
		for i := range 2 {
			c := e.client(t, readOnlyDB(t, e), table, WithRetry(LinearBackoff(50*time.Millisecond)))
			for j := range 4 {
				run(fmt.Sprintf("Acquire %d.%d", i, j), func(ctx context.Context) error {
					_, err := c.Acquire(ctx, "x", time.Minute)
					return err
				})
			}
			if e.oneRow() {
				continue
			}
			run(fmt.Sprintf("AcquireSet %d", i), func(ctx context.Context) error {
				_, err := c.AcquireSet(ctx, []string{"a", "b"}, time.Minute)
				return err
			})
			run(fmt.Sprintf("Semaphore.Acquire %d", i), func(ctx context.Context) error {
				_, err := c.Semaphore("sem", 2).Acquire(ctx, time.Minute)
				return err
			})
			run(fmt.Sprintf("Elect %d", i), func(ctx context.Context) error {
				return c.Elect(ctx, "leader", time.Minute, Callbacks{OnStartedLeading: func(_ context.Context, _ *Lock) error { return nil }})
			})
		}
		wg.Wait()
		for what, err := range errs {
			if !strings.HasPrefix(what, "Elect") && !errors.Is(err, ErrNotAcquired) {
				t.Errorf("%s: got %v, want ErrNotAcquired", what, err)
			}
			wantRefusal(t, what, err)
		}
	})
}

// A head about to wait on the wake-up channel sends the table's recheck
// (internal/engine/tablecheck.go) first when it comes due within half its period, so that
// the acquire after a wake-up follows it at once instead of after the
// recheck's round trip. Here the head polls once an hour: without the
// early recheck, no statement of its own would ever run it.
func TestClient_Acquire_recheckBeforeWait(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		h := e.client(t, e.openDB(t), table)
		c := e.client(t, e.openDB(t), table, WithRetry(retryFunc(func(int) (time.Duration, bool) { return time.Hour, true })))
		ctx, cancel := context.WithCancel(testCtx(t))
		defer cancel()
		mustAcquire(t, h, "n", time.Minute)
		warm := mustAcquire(t, c, "warm", time.Minute) // the first use, and its check
		if err := warm.Release(ctx); err != nil {
			t.Fatal(err)
		}
		due := time.Now().Add(engine.TableRecheckEvery / 2).Add(-20 * time.Millisecond).UnixNano()
		c.eng.SetRecheckDue(due)
		done := make(chan error, 1)
		go func() {
			_, err := c.Acquire(ctx, "n", time.Minute)
			done <- err
		}()
		waitFor(t, time.Minute, "the head waits", func() bool { return headAttempts(c, "n") >= 1 })
		waitFor(t, 10*time.Second, "the recheck before the wait", func() bool { return c.eng.RecheckDue() > due })
		cancel()
		wantErrIs(t, <-done, context.Canceled)
	})
}

// The look statement answers for many names at once, as the acquire would
// decide: held while a live lease stands, free when the name was never
// taken, was released, or its lease expired. 150 names in one statement
// (internal/wait's own tests prove how the heads' looks batch).
func TestClient_Acquire_look_answersForEveryName(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		holder := e.client(t, e.openDB(t), table)
		c := e.client(t, e.openDB(t), table)
		warm(t, c) // a Client looks only after an acquire, its forms chosen (tidb_look on Vitess)
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
		lits := make([]string, n)
		for i := range n {
			lits[i] = sqltext.Hex(fmt.Sprintf("k%03d\x00ü", i))
		}
		got, err := c.wait.Holders(ctx, strings.Join(lits, ", "))
		if err != nil {
			t.Fatal(err)
		}
		held := make(map[string]bool, len(got))
		for _, name := range got {
			held[name] = true
		}
		if !maps.Equal(held, want) {
			t.Errorf("names held: got %q, want %d of them", got, len(want))
		}
	})
}

// Close racing a Client that waits for many names (its heads polling with
// looks) ends every wait with ErrClosed, and no look is left running: the
// sender goroutine has returned when Close does.
func TestClient_Acquire_look_closeRacesManyWaiters(t *testing.T) {
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
				return c.wait.Peek("").Keys == names
			})
			time.Sleep(time.Duration(round) * 7 * time.Millisecond)
			if err := within(t, "Close", c.Close); err != nil {
				t.Fatal(err)
			}
			if c.wait.Peek("").Sending {
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
