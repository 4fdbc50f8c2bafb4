package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock/internal/fault"
)

// These tests run against a real server: Clients on *sql.DBs of their own
// stand for processes, and the counting proxy shows what a waiting one sends.

// wakeTTL is the lease these tests take: long, so that a waiter's GET_LOCK
// waits its longest (wakeRecheckMax) before it polls.
const wakeTTL = time.Minute

type acquired struct {
	l   *Lock
	err error
}

// acquireAsync runs c.Acquire of name on a goroutine of its own.
func acquireAsync(ctx context.Context, c *Client, name string) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		l, err := c.Acquire(ctx, name, wakeTTL)
		ch <- acquired{l, err}
	}()
	return ch
}

func mustGet(t *testing.T, ch <-chan acquired) *Lock {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("Acquire: %v", r.err)
		}
		return r.l
	case <-time.After(time.Minute):
		t.Fatal("Acquire still waits after a minute")
	}
	return nil
}

// waiterFirst checks that got, a waiter's Acquire, returns before again,
// the Acquire of the process that released the name just before, and that
// again follows once the waiter releases.
func waiterFirst(t *testing.T, got, again <-chan acquired) {
	t.Helper()
	var first *Lock
	select {
	case r := <-again:
		select {
		case w := <-got:
			t.Fatalf("the releaser acquired again (%v) before the waiter, whose Acquire returned %v", r.err, w.err)
		default:
		}
		t.Fatalf("the releaser acquired again (%v) before the waiter", r.err)
	case r := <-got:
		if r.err != nil {
			t.Fatalf("Acquire: %v", r.err)
		}
		first = r.l
	}
	if err := first.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if second := mustGet(t, again); first.Fence() >= second.Fence() {
		t.Errorf("fences: waiter %d, releaser %d; want the waiter's first", first.Fence(), second.Fence())
	}
}

// channelHolder returns the id of the server connection that holds the
// wake-up channel of name in table, or 0 when nobody holds it.
func channelHolder(t *testing.T, db *sql.DB, table, name string) int64 {
	t.Helper()
	q := "SELECT IS_USED_LOCK(CONCAT('sqllock:', LEFT(SHA2(CONCAT_WS(0x00, DATABASE(), ?, ?), 256), 56)))"
	var id sql.NullInt64
	if err := db.QueryRow(q, table, name).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id.Int64
}

// channelWaiters returns how many server sessions are in wake_wait for a
// name of table: sessions of other tests on other tables (side by side, or
// a killed one the server has yet to clear) do not count.
func channelWaiters(t *testing.T, e *testEnv, table string) int {
	t.Helper()
	var n int
	q := "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE 'SELECT IS_FREE_LOCK(CONCAT(''sqllock:''%' AND ID <> CONNECTION_ID() AND INFO LIKE CONCAT('%''', ?, '''%')"
	if err := scanProcesslist(testCtx(t), e.db, q, []any{table}, &n); err != nil {
		t.Fatal(err)
	}
	return n
}

// blockedWaiter starts an Acquire of name by c and returns once it blocks
// on the channel.
func blockedWaiter(t *testing.T, e *testEnv, c *Client, table, name string) <-chan acquired {
	t.Helper()
	got := acquireAsync(testCtx(t), c, name)
	waitFor(t, time.Minute, "the waiter blocks on the channel", func() bool {
		return headAttempts(c, name) > 0 && channelWaiters(t, e, table) == 1
	})
	return got
}

// channelQueue makes a Client that holds name (with its channel) and starts
// w's Acquire of it, which waits on the channel: the Client, its Lock, and
// w's outcome.
func channelQueue(t *testing.T, e *testEnv, table, name string, w *Client) (*Client, *Lock, <-chan acquired) {
	t.Helper()
	h := e.client(t, e.openDB(t), table)
	held := holdAfterWaiting(t, e, h, table, name)
	return h, held, blockedWaiter(t, e, w, table, name)
}

// holdAfterWaiting returns a Lock on name that c took after waiting for it
// (behind a lease of another Client), so that it holds the channel.
func holdAfterWaiting(t *testing.T, e *testEnv, c *Client, table, name string) *Lock {
	t.Helper()
	ctx := testCtx(t)
	first := mustAcquire(t, e.client(t, e.openDB(t), table), name, wakeTTL)
	got := acquireAsync(ctx, c, name)
	waitFor(t, time.Minute, "the second Client waits", func() bool { return headAttempts(c, name) > 0 })
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l := mustGet(t, got)
	if !c.wait.Peek(name).Holds || l.hold.Load() == nil {
		t.Fatal("a Lock taken after waiting: got no channel, want it held")
	}
	if channelHolder(t, e.db, table, name) == 0 {
		t.Fatal("the server says nobody holds the channel")
	}
	return l
}

// A process waiting for a name another holds sends no statement while it
// waits, though its strategy would poll every 10ms, and the release wakes it:
// it takes the name with the one acquire its grant calls for.
func TestWithWakeups_releaseWakesWaiterWithoutPolling(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		skipChannelsOnTiDB(t, e)
		table := e.newTable(t)
		ctx := testCtx(t)
		r := newEventRecorder()
		w, p := e.proxiedClient(t, table, WithRetry(LinearBackoff(10*time.Millisecond)), WithObserver(r.observer()))
		_, held, got := channelQueue(t, e, table, "n", w)
		// A wait on the channel times out after 1 to 5 s and the head polls
		// once (internal/wait/channel.go), as it must, past a stuck holder:
		// on a loaded machine such a poll fell in a window counted below.
		// Each counts as one statement more; polling at the strategy's
		// 10 ms would send a hundred a second.
		timedOut := func() int {
			r.mu.Lock()
			defer r.mu.Unlock()
			return r.counts["wakeup n timed_out"]
		}
		before := timedOut()
		p.ResetCounts()
		// A second, a hundred polls of the strategy, on the default DSN;
		// the other variants change the statements, not the wait: 200 ms.
		quiet := 200 * time.Millisecond
		if e.variant.name == variants[0].name {
			quiet = time.Second
		}
		time.Sleep(quiet)
		if n, polls := p.Commands()[proxyComStmtExecute], timedOut()-before; n > polls {
			t.Errorf("statements sent while waiting %v: got %d, want at most %d (one per wait on the channel that timed out)", quiet, n, polls)
		}
		noRecheck(w)
		// An acquire statement that waits past 100 ms for the row the
		// release deletes (a loaded machine) starts the frozen-holder watch,
		// whose read of the lease (internal/engine/frozen.go) is no poll:
		// a CI run counted it here. The watch is put off.
		w.eng.SetFrozenLook(time.Hour)
		p.ResetCounts()
		if err := held.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
		l := mustGet(t, got)
		// A timeout told before this window may have its poll in it.
		if n, polls := p.Commands()[proxyComStmtExecute], timedOut()-before; n < 1 || n > 1+polls {
			t.Errorf("statements sent from the release to the acquisition: got %d, want 1 and at most %d more (one per wait on the channel that timed out)", n, polls)
		}
		if l.Fence() <= held.Fence() {
			t.Errorf("fence: got %d, want more than %d", l.Fence(), held.Fence())
		}
		if channelHolder(t, e.db, table, "n") == 0 {
			t.Error("the waker: got no channel held, want the new holder's")
		}
	})
}

// Many goroutines of one process waiting for a name send nothing while they
// wait: one waits on the channel, the others in the process's queue. Then
// each takes the name in turn.
func TestWithWakeups_localQueueSendsNothing(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipChannelsOnTiDB(t, e)
		table := e.newTable(t)
		ctx := testCtx(t)
		const goroutines = 16
		w, p := e.proxiedClient(t, table, WithRetry(LinearBackoff(10*time.Millisecond)))
		_, held, got := channelQueue(t, e, table, "n", w)
		errs := make(chan error, goroutines)
		for range goroutines - 1 {
			go func() {
				l, err := w.Acquire(ctx, "n", wakeTTL)
				if err == nil {
					err = l.Release(ctx)
				}
				errs <- err
			}()
		}
		waitFor(t, time.Minute, "every goroutine waits", func() bool { return w.wait.Peek("n").Waiting == goroutines })
		p.ResetCounts()
		time.Sleep(time.Second)
		if n := p.CommandCount(); n != 0 {
			t.Errorf("commands sent while %d goroutines waited a second: got %d, want 0", goroutines, n)
		}
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
		// The first in line (on the channel) takes it first.
		if err := mustGet(t, got).Release(ctx); err != nil {
			t.Fatal(err)
		}
		for range goroutines - 1 {
			if err := <-errs; err != nil {
				t.Error(err)
			}
		}
	})
}

// A process that releases a name and acquires it again at once queues
// behind a process that was waiting for it.
func TestWithWakeups_releaserQueuesBehindWaiter(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		skipChannelsOnTiDB(t, e)
		table := e.newTable(t)
		ctx := testCtx(t)
		w := e.client(t, e.openDB(t), table)
		h, held, got := channelQueue(t, e, table, "n", w)
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
		waiterFirst(t, got, acquireAsync(ctx, h, "n"))
	})
}

// A channel cut while it is held (its connection killed) costs the waiter
// its wake-up, never the lease: the waiter takes the channel, is refused,
// polls, and takes the name once it is released; the Release reports no
// error.
func TestWithWakeups_channelKilledFallsBackToPolling(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		skipChannelsOnTiDB(t, e)
		table := e.newTable(t)
		ctx := testCtx(t)
		w, p := e.proxiedClient(t, table, WithRetry(LinearBackoff(10*time.Millisecond)))
		_, held, got := channelQueue(t, e, table, "n", w)
		if _, err := e.db.Exec(fmt.Sprintf("KILL %d", channelHolder(t, e.db, table, "n"))); err != nil {
			t.Fatal(err)
		}
		waitFor(t, time.Minute, "the waiter polls", func() bool { return headAttempts(w, "n") > 3 })
		if !w.wait.Peek("n").Holds {
			t.Error("the polling waiter: got no channel, want it held")
		}
		p.ResetCounts()
		if err := held.Release(ctx); err != nil {
			t.Fatalf("Release after its channel was killed: %v", err)
		}
		l := mustGet(t, got)
		if l.Fence() <= held.Fence() {
			t.Errorf("fence: got %d, want more than %d", l.Fence(), held.Fence())
		}
	})
}

// A waiter whose channel connection is killed while it waits in GET_LOCK
// goes back to the channel and is still woken by the release.
func TestWithWakeups_waiterKilledMidWait(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipChannelsOnTiDB(t, e)
		table := e.newTable(t)
		ctx := testCtx(t)
		w := e.client(t, e.openDB(t), table)
		_, held, got := channelQueue(t, e, table, "n", w)
		var id int64
		// The waiter on this table's channel, not another test's.
		if err := scanProcesslist(testCtx(t), e.db, "SELECT ID FROM information_schema.PROCESSLIST WHERE INFO LIKE 'SELECT IS_FREE_LOCK(CONCAT(''sqllock:''%' AND ID <> CONNECTION_ID() AND INFO LIKE CONCAT('%''', ?, '''%')", []any{table}, &id); err != nil {
			t.Fatal(err)
		}
		if _, err := e.db.Exec(fmt.Sprintf("KILL %d", id)); err != nil {
			t.Fatal(err)
		}
		waitFor(t, time.Minute, "the waiter blocks on the channel again", func() bool { return channelWaiters(t, e, table) == 1 })
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
		mustGet(t, got)
	})
}

// Close ends a wait on the channel at once and lets go of every channel,
// and a waiter's context bounds its wait on the channel.
func TestWithWakeups_closeAndCancel(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipChannelsOnTiDB(t, e)
		table := e.newTable(t)
		ctx := testCtx(t)
		h := e.client(t, e.openDB(t), table)
		holdAfterWaiting(t, e, h, table, "n")

		w := e.client(t, e.openDB(t), table)
		cctx, cancel := context.WithCancel(ctx)
		got := acquireAsync(cctx, w, "n")
		waitFor(t, time.Minute, "the waiter blocks on the channel", func() bool { return channelWaiters(t, e, table) == 1 })
		cancel()
		if r := <-got; !errors.Is(r.err, ErrNotAcquired) || !errors.Is(r.err, context.Canceled) {
			t.Errorf("Acquire cancelled on the channel: got %v, want ErrNotAcquired and context.Canceled", r.err)
		}

		got = acquireAsync(ctx, w, "n")
		waitFor(t, time.Minute, "the waiter blocks on the channel", func() bool { return channelWaiters(t, e, table) == 1 })
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if r := <-got; !errors.Is(r.err, ErrClosed) {
			t.Errorf("Acquire on the channel of a closed Client: got %v, want ErrClosed", r.err)
		}
		if err := h.Close(); err != nil {
			t.Fatal(err)
		}
		if h.wait.Peek("n").Holds || w.wait.Peek("n").Holds {
			t.Error("after Close: got a channel held, want none")
		}
		waitFor(t, time.Minute, "the server lets go of the channel", func() bool {
			return channelHolder(t, e.db, table, "n") == 0
		})
		info, err := e.client(t, e.db, table).Inspect(ctx, "n")
		if err != nil || info.Held {
			t.Errorf("Inspect after Close: got %+v, %v; want not held", info, err)
		}
	})
}

// A pool limited to one connection leaves it to the lease statements: the
// waiter polls, and the holder's Release does not wait for a connection.
func TestWithWakeups_fullPoolPolls(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipChannelsOnTiDB(t, e)
		table := e.newTable(t)
		ctx := testCtx(t)
		db := e.openDB(t)
		db.SetMaxOpenConns(1)
		h := e.client(t, db, table, WithRetry(LinearBackoff(10*time.Millisecond)))
		first := mustAcquire(t, e.client(t, e.openDB(t), table), "n", wakeTTL)
		got := acquireAsync(ctx, h, "n")
		waitFor(t, time.Minute, "the Client polls", func() bool { return headAttempts(h, "n") > 3 })
		if h.wait.Peek("n").Holds {
			t.Error("a Client with a one-connection pool: got a channel, want none")
		}
		if err := first.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := mustGet(t, got).Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// Close racing Acquire and Release of processes that hand a name around on
// the channel leaves nothing held: no lease, no channel, no waiter.
func TestWithWakeups_closeRacesHandoffs(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipChannelsOnTiDB(t, e)
		table := e.newTable(t)
		ctx := testCtx(t)
		var cs []*Client
		done := make(chan struct{})
		loops := 0
		for range 3 {
			c := e.client(t, e.openDB(t), table)
			cs = append(cs, c)
			for range 3 {
				loops++
				go func() {
					defer func() { done <- struct{}{} }()
					for {
						l, err := c.Acquire(ctx, "n", wakeTTL)
						if err != nil {
							if !errors.Is(err, ErrClosed) {
								t.Errorf("Acquire: got %v, want ErrClosed in the end", err)
							}
							return
						}
						time.Sleep(time.Millisecond)
						if err := l.Release(ctx); err != nil && !errors.Is(err, ErrClosed) {
							t.Errorf("Release: %v", err)
						}
					}
				}()
			}
		}
		waitFor(t, time.Minute, "the processes hand the name on the channel", func() bool {
			return channelHolder(t, e.db, table, "n") != 0
		})
		time.Sleep(500 * time.Millisecond)
		for _, c := range cs {
			go c.Close()
		}
		for range loops {
			<-done
		}
		for _, c := range cs {
			if err := c.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		}
		waitFor(t, time.Minute, "the server lets go of every channel and waiter", func() bool {
			return channelHolder(t, e.db, table, "n") == 0 && channelWaiters(t, e, table) == 0
		})
		info, err := e.client(t, e.db, table).Inspect(ctx, "n")
		if err != nil || info.Held {
			t.Errorf("Inspect after Close: got %+v, %v; want not held", info, err)
		}
	})
}

// The exact text a waiting Client sends on its channel, and a server that
// refuses GET_LOCK (MariaDB Galera): the Client says so once and polls,
// without asking for the channel again.
func TestWithWakeups_serverRefusesGetLock(t *testing.T) {
	e := newMockEnv(t, WithRetry(LinearBackoff(time.Millisecond)), WithWakeups(defaultWakeups))
	e.wakeupConns()
	held, free := okReply(0, 1), okReply(7, 1)
	tok := &tokenArg{}
	args := acquireArgs("job", mockHolder, 1_000_000, tok)
	e.expectExec("acquire", args, held)
	// The name as a hex literal, twice, and a timeout of a whole second.
	wait := withTable(strings.ReplaceAll(queries["wake_wait"], "'sqllock'", "'"+DefaultTable+"'"), DefaultTable)
	wait = strings.Replace(strings.Replace(wait, "?", "X'6a6f62'", 2), "?", "1", 1)
	e.mock.ExpectQuery(wait).WithoutArgs().WillReturnError(mysqlErr(fault.NotSupportedYet, "42000", "This version of MariaDB doesn't yet support 'GET_LOCK in cluster (WSREP_ON=ON)'"))
	e.expectExec("acquire", args, held, held, free)
	l, err := e.c.Acquire(t.Context(), "job", time.Second)
	if err != nil || l.Fence() != 7 {
		t.Fatalf("Acquire: got %v, %v; want fence 7", l, err)
	}
	if !e.c.wait.Peek("").Refused {
		t.Error("wake-ups after the refusal: got on, want off")
	}
	e.done()
}

// skipChannelsOnTiDB skips a test of the wake-up channels on TiDB, where a
// Client keeps them off (TestWithWakeups_offOnTiDB).
func skipChannelsOnTiDB(t *testing.T, e *testEnv) {
	t.Helper()
	if e.server.TiDB {
		t.Skipf("%s is %s: the wake-up channels stay off on TiDB, whose GET_LOCK neither granted waiters in order nor freed a killed connection's lock at once (TestWithWakeups_offOnTiDB)", e.server.Label, e.server.Version)
	}
	skipOnVitess(t, e, vitessNoChannels)
}

// On TiDB a Client asked for wake-up channels takes none: a waiting process
// polls, holds no named lock, and takes the name once it is released.
func TestWithWakeups_offOnTiDB(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		if !e.server.TiDB {
			t.Skipf("%s is %s: the channels are on here (the other TestWithWakeups_ tests)", e.server.Label, e.server.Version)
		}
		table := e.newTable(t)
		ctx := testCtx(t)
		a := e.client(t, e.openDB(t), table, WithHolder("a"))
		b := e.client(t, e.openDB(t), table, WithHolder("b"), WithRetry(LinearBackoff(10*time.Millisecond)))
		held := mustAcquire(t, a, "n", time.Minute)
		got := make(chan *Lock, 1)
		go func() {
			l, err := b.Acquire(ctx, "n", time.Minute)
			if err != nil {
				t.Errorf("Acquire: %v", err)
			}
			got <- l
		}()
		time.Sleep(300 * time.Millisecond) // b polls
		if locks := channelWaiters(t, e, table); locks != 0 {
			t.Errorf("sessions waiting in GET_LOCK: got %d, want 0", locks)
		}
		if h := channelHolder(t, e.db, table, "n"); h != 0 {
			t.Errorf("the name's channel: got held by connection %d, want free", h)
		}
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
		l := <-got
		if l == nil || l.Fence() <= held.Fence() {
			t.Fatalf("after the release: got %v, want b holding a fence above %d", l, held.Fence())
		}
		if h := channelHolder(t, e.db, table, "n"); h != 0 {
			t.Errorf("after the hand-over: the name's channel held by connection %d, want free", h)
		}
	})
}

// Release ends within ReleaseTimeout on a connection that stops answering,
// the channel's let-go included: the let-go is cut at the release's bound
// and discards the channel's connection, with which its named lock dies.
// Before, the let-go's own second came on top (6 s).
func TestWithWakeups_releaseOnStalledServerWithinReleaseTimeout(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipChannelsOnTiDB(t, e)
		table := e.newTable(t)
		c, p := e.proxiedClient(t, table)
		l := holdAfterWaitingFor(t, e, c, table, "n", time.Minute)
		p.Stall(true)
		t.Cleanup(func() { p.Stall(false) })
		began := time.Now()
		err := l.Release(testCtx(t))
		took := time.Since(began)
		if err == nil {
			t.Errorf("Release against a server that does not answer: got nil, want an error")
		}
		if took > ReleaseTimeout+500*time.Millisecond {
			t.Errorf("Release of a Lock holding a channel, on a stalled server, took %v, want at most ReleaseTimeout (%v) and 500ms", took, ReleaseTimeout)
		}
	})
}

// A Do whose acquire waited (so the Lock would hold the name's wake-up
// channel), on a pool of two connections, whose fn holds a transaction of
// the same pool: the keep-alive's Refresh must find a connection, and fn
// runs to its end. Before, the channel kept the second connection for the
// Lock's life, the Refresh waited for one until its deadline, and fn was
// cancelled 540 ms into a 600 ms lease.
func TestWithWakeups_boundedPoolDoKeepsLeaseConnection(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipChannelsOnTiDB(t, e)
		ctx := testCtx(t)
		run := func(ttl time.Duration) (err, cause error) {
			table := e.newTable(t)
			db := e.openDB(t)
			db.SetMaxOpenConns(2)
			c := e.client(t, db, table)
			first := mustAcquire(t, e.client(t, e.openDB(t), table, WithWakeups(0)), "n", time.Minute)
			done := make(chan error, 1)
			var fnErr atomic.Value
			go func() {
				done <- c.Do(ctx, "n", ttl, func(ctx context.Context, _ *Lock) error {
					tx, err := db.BeginTx(ctx, nil)
					if err != nil {
						return err
					}
					defer tx.Rollback() // BeginTx took a connection of the pool, held until then
					select {
					case <-ctx.Done():
						fnErr.Store(context.Cause(ctx))
						return ctx.Err()
					case <-time.After(3 * time.Second):
					}
					return tx.Commit()
				})
			}()
			waitFor(t, time.Minute, "the Do waits", func() bool { return headAttempts(c, "n") > 0 })
			if err := first.Release(ctx); err != nil {
				t.Fatal(err)
			}
			err = <-done
			cause, _ = fnErr.Load().(error)
			return err, cause
		}
		// A loaded machine can keep a short lease's renewals from answering
		// in time: the test is made again with a longer lease, up to 2.4 s.
		// Each is shorter than fn's 3 s, so each needs renewals on the
		// pool's second connection: with none to be had, every try fails.
		for ttl := 600 * time.Millisecond; ; ttl *= 2 {
			err, cause := run(ttl)
			if err == nil {
				return
			}
			if ttl >= 2400*time.Millisecond || !lostForNoRenewal(cause) {
				t.Fatalf("Do on a pool of two whose fn holds a transaction, lease %v: %v (fn's context: %v)", ttl, err, cause)
			}
			t.Logf("lease %v lost for want of a renewal in time (a loaded machine?): again with %v", ttl, 2*ttl)
		}
	})
}

// Issue 22, point 3. A channel's connection that the server drops after it
// idled (a short wait_timeout) wedges nobody: the Lock holding it releases
// without error, and a process waiting for the name gets it.
func TestWithWakeups_channelDroppedByWaitTimeout(t *testing.T) {
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

// Issue 22, point 6. After every way a Lock holding its name's wake-up
// channel can end, and every way a wait on the channel can end, nothing is
// left behind: the Client holds no channel and counts none in use, its pool
// has no connection checked out, and the server named lock is free. Each
// case runs with wake-up channels as they are by default.
func TestWithWakeups_nothingLeftAfterEveryEnd(t *testing.T) {
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
	if l.hold.Load() == nil || !c.wait.Peek(name).Holds {
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
		held, used, inUse := c.wait.Peek(name).Has, c.wait.Peek("").InUse, c.db.Stats().InUse
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

// Issue 22, point 6. A Lock that took its name through the channel and is
// left to lapse, never released, lets go of the channel once its lease could
// have expired: the connection goes back, the server named lock is freed,
// and a process waiting for the name hears of it at once.
func TestWithWakeups_lapsedLockLetsGoOfChannel(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipChannelsOnTiDB(t, e)
		table := e.newTable(t)
		c := e.client(t, e.openDB(t), table)
		// Long enough that the check below comes before the lapse on a
		// loaded machine.
		holdAfterWaitingFor(t, e, c, table, "n", time.Second)
		// Left to lapse: no Release, no Refresh.
		waitFor(t, 10*time.Second, "the channel is let go of after the lease lapsed", func() bool {
			return !c.wait.Peek("n").Holds && channelHolder(t, e.db, table, "n") == 0
		})
	})
}

// A caller waiting behind a lease of its own Client that holds the name's
// channel sends nothing while it waits, though its strategy would poll every
// 10 ms: that lease's release wakes it. So it cannot take the name in the
// instant between the release and the acquire of the process the release
// woke, which waited on the channel first and goes first.
func TestWithWakeups_waiterBehindOwnLeaseSendsNothing(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		skipChannelsOnTiDB(t, e)
		table := e.newTable(t)
		ctx := testCtx(t)
		w, p := e.proxiedClient(t, table, WithRetry(LinearBackoff(10*time.Millisecond)))
		held := holdAfterWaiting(t, e, w, table, "n")
		got := blockedWaiter(t, e, e.client(t, e.openDB(t), table), table, "n")
		again := acquireAsync(ctx, w, "n")
		waitFor(t, time.Minute, "the second caller waits", func() bool { return w.wait.Peek("n").Waiting == 1 })
		noRecheck(w)
		w.eng.SetFrozenLook(time.Hour)
		p.ResetCounts()
		time.Sleep(time.Second) // a hundred polls of the strategy
		if n := p.Commands()[proxyComStmtExecute]; n != 0 {
			t.Errorf("statements sent by a caller waiting a second behind its own Client's lease: got %d, want 0", n)
		}
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
		waiterFirst(t, got, again)
	})
}

// A caller waiting behind a lease of its own Client that lapses unreleased
// (no keep-alive) takes the name once the lease lapsed, not a ttl of its
// own later: the lapse kicks it.
func TestWithWakeups_ownLeaseLapseKicksWaiter(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipChannelsOnTiDB(t, e)
		table := e.newTable(t)
		ctx := testCtx(t)
		c := e.client(t, e.openDB(t), table)
		short := holdAfterWaitingFor(t, e, c, table, "n", 2*time.Second)
		began := time.Now()
		again := acquireAsync(ctx, c, "n") // its own ttl: wakeTTL, a minute
		// The lease lapses 2 s after its acquire; a ttl of the waiter's is
		// a minute. Half of that tells one from the other on a loaded machine.
		select {
		case r := <-again:
			if r.err != nil {
				t.Fatalf("Acquire: %v", r.err)
			}
			if r.l.Fence() <= short.Fence() {
				t.Errorf("fence: got %d, want more than %d", r.l.Fence(), short.Fence())
			}
		case <-time.After(wakeTTL / 2):
			t.Fatalf("the caller behind a lapsed lease of its own Client still waits after %v", time.Since(began))
		}
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
		// The waiter makes its first use first: on a loaded machine that
		// took longer than the stuck lease, which its first attempt then
		// found lapsed, without a wait on the channel.
		r := newEventRecorder()
		w := e.client(t, e.openDB(t), table, WithObserver(r.observer()))
		if err := mustAcquire(t, w, "warm", time.Minute).Release(ctx); err != nil {
			t.Fatal(err)
		}
		stuck := mustAcquire(t, e.client(t, e.openDB(t), table), "n", 2*time.Second) // never refreshed
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
