package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock/internal/engine"
	"github.com/sqllock/sqllock/observe"
)

// Benchmarks need a server, found as for the tests (harness_servers_test.go); without
// one they skip. Run them with
//
//	SQLLOCK_TEST_DSN='root@tcp(127.0.0.1:3306)/test' go test -run '^$' -bench . -benchmem
//
// or go run ./cmd/sqllock-bench, which runs them, prints ratios to the
// durable floor and writes bench/results.txt and bench/chart.svg.
//
// Every variant of a benchmark runs as a b.Run of the same benchmark, so
// that they are compared on one server under one load; on a shared machine
// only ratios within one run mean much.

func benchEnv(b *testing.B) *testEnv {
	b.Helper()
	requireServers(b)
	if len(testServers) > 1 {
		b.Fatalf("the benchmarks compare their variants on one server: set %s to one DSN (scripts/testdb dsn SERVER)", dsnEnv)
	}
	s := testServers[0]
	if s.Err != nil {
		b.Fatal(s.Err)
	}
	if s.Fake {
		b.Skip("the benchmarks measure a real server's round trips and commits")
	}
	e := newEnv(b, s, variants[0])
	// What a commit costs depends on these: a binary log synced at each
	// commit (MySQL's default) adds a second flush to the redo log's.
	var logBin, syncBinlog, flushAtCommit string
	if err := e.db.QueryRow("SELECT @@log_bin, @@sync_binlog, @@innodb_flush_log_at_trx_commit").Scan(&logBin, &syncBinlog, &flushAtCommit); err != nil {
		b.Fatal(err)
	}
	b.Logf("on %s (%s): log_bin=%s sync_binlog=%s innodb_flush_log_at_trx_commit=%s", s.Label, s.Version, logBin, syncBinlog, flushAtCommit)
	return e
}

// benchTTL is the lease the benchmarks take: long enough that nothing
// expires during a run.
const benchTTL = 10 * time.Second

// scratchTable creates a table of the given columns for one benchmark and
// drops it when the benchmark ends. It returns the backtick-quoted name.
func (e *testEnv) scratchTable(b *testing.B, columns string) string {
	b.Helper()
	name := "`" + e.newTable(b) + "_x`"
	if _, err := e.db.Exec("CREATE TABLE " + name + " (" + columns + ") ENGINE=InnoDB"); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.db.Exec("DROP TABLE IF EXISTS " + name) })
	return name
}

func mustPrepare(b *testing.B, db interface {
	PrepareContext(context.Context, string) (*sql.Stmt, error)
}, query string) *sql.Stmt {
	b.Helper()
	st, err := db.PrepareContext(context.Background(), query)
	if err != nil {
		b.Fatalf("prepare %s: %v", query, err)
	}
	b.Cleanup(func() { st.Close() })
	return st
}

// BenchmarkPair is one uncontended acquire and release, the cost every lock
// user pays, beside what it can be compared with:
//
//   - floor: two prepared single-row UPDATE commits on a table of their
//     own, the least any durable acquire and release can cost (one round
//     trip and one redo-log flush each);
//   - sqllock: Client.TryAcquire then Lock.Release;
//   - driver: sqllock's own two prepared statements run directly with fixed
//     arguments, which is what the driver and database/sql cost (and
//     allocate) for them without the library;
//   - seedDeleteInsert and seedSelectUpsert: the two multi-statement recipes
//     people write by hand, as they write them (db.ExecContext), and the
//     same with their statements prepared once (…Prepared);
//   - getLock: GET_LOCK and RELEASE_LOCK on one pinned connection, which
//     write nothing and hold no lease.
func BenchmarkPair(b *testing.B) {
	e := benchEnv(b)
	ctx := context.Background()

	b.Run("floor", func(b *testing.B) {
		t := e.scratchTable(b, "id INT PRIMARY KEY, v BIGINT NOT NULL")
		if _, err := e.db.Exec("INSERT INTO " + t + " VALUES (1, 0)"); err != nil {
			b.Fatal(err)
		}
		up := mustPrepare(b, e.db, "UPDATE "+t+" SET v = v + 1 WHERE id = ?")
		b.ReportAllocs()
		for b.Loop() {
			for range 2 {
				if _, err := up.ExecContext(ctx, 1); err != nil {
					b.Fatal(err)
				}
			}
		}
	})

	b.Run("sqllock", func(b *testing.B) { benchWarmPair(b, e.newClient(b)) })

	b.Run("driver", func(b *testing.B) {
		c := e.newClient(b)
		acquire := mustPrepare(b, e.db, c.eng.Forms().SQL[qAcquire])
		release := mustPrepare(b, e.db, c.eng.Forms().SQL[qRelease])
		const name, token = "bench", "0123456789abcdef0123456789abcdef"
		us := benchTTL.Microseconds()
		b.ReportAllocs()
		for b.Loop() {
			res, err := acquire.ExecContext(ctx, name, token, c.holder, us, name, token, c.holder, token, us)
			if err != nil {
				b.Fatal(err)
			}
			if id, _ := res.LastInsertId(); id <= 2 {
				b.Fatalf("acquire reported %d", id)
			}
			res, err = release.ExecContext(ctx, name, token)
			if err != nil {
				b.Fatal(err)
			}
			if n, _ := res.RowsAffected(); n != 1 {
				b.Fatalf("release deleted %d rows", n)
			}
		}
	})

	// The recipes twice: as people copy them (db.ExecContext with arguments,
	// which with the default DSN prepares, executes and closes a statement
	// each time), and with their statements prepared once, as sqllock's are.
	for _, prepared := range []bool{false, true} {
		suffix := ""
		if prepared {
			suffix = "Prepared"
		}
		b.Run("seedDeleteInsert"+suffix, func(b *testing.B) {
			r := newSeedRecipes(b, e, prepared)
			b.ReportAllocs()
			for b.Loop() {
				if err := r.deleteInsertPair(ctx, "bench"); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("seedSelectUpsert"+suffix, func(b *testing.B) {
			r := newSeedRecipes(b, e, prepared)
			b.ReportAllocs()
			for b.Loop() {
				if err := r.selectUpsertPair(ctx, "bench"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}

	b.Run("getLock", func(b *testing.B) {
		conn, err := e.db.Conn(ctx)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { conn.Close() })
		get := mustPrepare(b, conn, "SELECT GET_LOCK(?, 0)")
		rel := mustPrepare(b, conn, "SELECT RELEASE_LOCK(?)")
		name := e.newTable(b) // a name no one else uses on this server
		b.ReportAllocs()
		for b.Loop() {
			var ok sql.NullInt64
			if err := get.QueryRowContext(ctx, name).Scan(&ok); err != nil || ok.Int64 != 1 {
				b.Fatalf("GET_LOCK: %v, %v", ok, err)
			}
			if err := rel.QueryRowContext(ctx, name).Scan(&ok); err != nil || ok.Int64 != 1 {
				b.Fatalf("RELEASE_LOCK: %v, %v", ok, err)
			}
		}
	})
}

// seedRecipes are the hand-written lease locks the seed documents describe,
// on a one-row-per-name table of their own:
//
//   - delete-insert: delete the name's row if it has expired, insert a
//     row (a duplicate key means someone holds it), delete it to release;
//   - select-upsert: read the row, and if it is absent or expired write it
//     with an INSERT ... ON DUPLICATE KEY UPDATE, then release by setting
//     its expiry to now.
//
// They are here to be timed, not used: both check, then act, in separate
// statements, and the select-upsert one can give two callers the lock. With
// prepared false they send each statement as the recipes are written, with
// db.ExecContext; with prepared true, over statements prepared once.
type seedRecipes struct {
	db                      *sql.DB
	stmts                   map[string]*sql.Stmt // by query text; nil when not prepared
	delExpired, insert, del string
	sel, upsert, expire     string
}

func newSeedRecipes(b *testing.B, e *testEnv, prepared bool) *seedRecipes {
	t := e.scratchTable(b, "name VARBINARY(255) PRIMARY KEY, owner VARBINARY(32) NOT NULL, expires_at DATETIME(6) NOT NULL")
	r := &seedRecipes{
		db:         e.db,
		delExpired: "DELETE FROM " + t + " WHERE name = ? AND expires_at < UTC_TIMESTAMP(6)",
		insert:     "INSERT INTO " + t + " (name, owner, expires_at) VALUES (?, ?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)",
		del:        "DELETE FROM " + t + " WHERE name = ? AND owner = ?",
		sel:        "SELECT owner, expires_at > UTC_TIMESTAMP(6) FROM " + t + " WHERE name = ?",
		upsert: "INSERT INTO " + t + " (name, owner, expires_at) VALUES (?, ?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)" +
			" ON DUPLICATE KEY UPDATE owner = ?, expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND",
		expire: "UPDATE " + t + " SET expires_at = UTC_TIMESTAMP(6) WHERE name = ? AND owner = ?",
	}
	if prepared {
		r.stmts = make(map[string]*sql.Stmt)
		for _, q := range []string{r.delExpired, r.insert, r.del, r.sel, r.upsert, r.expire} {
			r.stmts[q] = mustPrepare(b, e.db, q)
		}
	}
	return r
}

func (r *seedRecipes) exec(ctx context.Context, q string, args ...any) error {
	var err error
	if st := r.stmts[q]; st != nil {
		_, err = st.ExecContext(ctx, args...)
	} else {
		_, err = r.db.ExecContext(ctx, q, args...)
	}
	return err
}

func (r *seedRecipes) queryRow(ctx context.Context, q string, args ...any) *sql.Row {
	if st := r.stmts[q]; st != nil {
		return st.QueryRowContext(ctx, args...)
	}
	return r.db.QueryRowContext(ctx, q, args...)
}

func (r *seedRecipes) deleteInsertPair(ctx context.Context, name string) error {
	token, err := newToken()
	if err != nil {
		return err
	}
	if err := r.exec(ctx, r.delExpired, name); err != nil {
		return err
	}
	if err := r.exec(ctx, r.insert, name, token, benchTTL.Microseconds()); err != nil {
		return err // a duplicate key: held
	}
	return r.exec(ctx, r.del, name, token)
}

func (r *seedRecipes) selectUpsertPair(ctx context.Context, name string) error {
	token, err := newToken()
	if err != nil {
		return err
	}
	var owner string
	var live bool
	switch err := r.queryRow(ctx, r.sel, name).Scan(&owner, &live); {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return err
	case live:
		return ErrNotAcquired
	}
	us := benchTTL.Microseconds()
	if err := r.exec(ctx, r.upsert, name, token, us, token, us); err != nil {
		return err
	}
	return r.exec(ctx, r.expire, name, token)
}

// BenchmarkHandoff is goroutines taking turns on one name with Acquire and
// Release, holding it for no time: in one Client, and spread over 4 Clients
// on *sql.DBs of their own (as 4 processes would be). Every Client's
// connections go through the counting proxy (a TCP hop of its own), which
// reports:
//
//   - handoffs/s: acquisitions per second (ns/op is the time per handoff);
//   - stmts/handoff: statements sent per acquisition, polls included (the
//     floor is 2: one acquire, one release);
//   - p50-µs, p99-µs: handoff latency, from the holder calling Release to
//     the next holder's Acquire returning;
//   - cross/handoff: the share of handoffs that went to another Client.
//
// The Clients use the default RetryStrategy.
func BenchmarkHandoff(b *testing.B) {
	e := benchEnv(b)
	for _, clients := range []int{1, 4} {
		for _, g := range []int{1, 8, 64} {
			if g < clients {
				continue
			}
			b.Run(fmt.Sprintf("clients=%d/goroutines=%d", clients, g), func(b *testing.B) {
				benchHandoff(b, e, handoffRun{clients: clients, goroutines: g})
			})
		}
	}
}

// BenchmarkCrossProcess is 4 Clients (processes) with one goroutine each
// that hand one name around: after releasing, a Client does not try again
// until another has taken the name, so every handoff goes to another
// process, which learns of the release only by polling (wake-up channels
// off: with them, the release wakes the next process, BenchmarkContention). It measures what a
// RetryStrategy trades: handoff latency (p50, p99) against polling load
// (polls/s/waiter: refused statements per second per waiting process).
// With hold=0 the waiters have just begun and poll fast; with a hold of
// 300ms their backoff has grown to its cap, the case that bounds latency.
// Run it with a fixed count (-benchtime 40x): a held handoff takes 300ms.
func BenchmarkCrossProcess(b *testing.B) {
	e := benchEnv(b)
	for _, hold := range []time.Duration{0, 300 * time.Millisecond} {
		for _, s := range []struct{ min, max time.Duration }{
			{defaultRetryMin, defaultRetryMax},
			{4 * time.Millisecond, 64 * time.Millisecond},
		} {
			b.Run(fmt.Sprintf("hold=%v/backoff=%v-%v", hold, s.min, s.max), func(b *testing.B) {
				benchHandoff(b, e, handoffRun{clients: 4, goroutines: 4, rotate: true, hold: hold,
					retry: ExponentialBackoff(s.min, s.max), noWakeups: true})
			})
		}
	}
}

type handoffRun struct {
	clients, goroutines int
	retry               RetryStrategy // nil for the default
	// rotate makes a goroutine wait, after its release, until a goroutine
	// of another Client has taken the name.
	rotate bool
	hold   time.Duration // how long a holder keeps the name
	// noWakeups turns wake-up channels off: waiting processes poll.
	noWakeups bool
}

// benchAcquire acquires "hot" for benchTTL and returns the Lock, when it
// returned and how long it took; nil when ctx ended first.
func benchAcquire(b *testing.B, ctx context.Context, c *Client) (*Lock, time.Time, time.Duration) {
	called := time.Now()
	l, err := c.Acquire(ctx, "hot", benchTTL)
	if err != nil {
		if ctx.Err() == nil {
			b.Error(err)
		}
		return nil, time.Time{}, 0
	}
	now := time.Now()
	return l, now, now.Sub(called)
}

func benchHandoff(b *testing.B, e *testEnv, r handoffRun) {
	table := e.newTable(b)
	p := startProxy(b, e.serverAddr(b))
	cs := make([]*Client, r.clients)
	for i := range cs {
		db := e.openDBWith(b, func(c *mysql.Config) { c.Addr = p.Addr() })
		var opts []Option
		if r.retry != nil {
			opts = append(opts, WithRetry(r.retry))
		}
		if r.noWakeups {
			opts = append(opts, WithWakeups(0))
		}
		cs[i] = e.client(b, db, table, opts...)
		mustAcquire(b, cs[i], "warm", time.Second).Release(context.Background())
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var (
		mu       sync.Mutex
		turn     = sync.NewCond(&mu)
		acquired int   // acquisitions so far
		holder   = -1  // the Client that took the name last
		released int64 // when the last holder called Release, ns since start
		crossed  int
		lat      = make([]time.Duration, 0, b.N)
		waited   time.Duration // time spent in Acquire, all goroutines
	)
	b.ReportAllocs()
	p.ResetCounts()
	start := time.Now()
	b.ResetTimer()
	var wg sync.WaitGroup
	for g := range r.goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ci := g % r.clients
			for {
				l, now, took := benchAcquire(b, ctx, cs[ci])
				if l == nil {
					return
				}
				mu.Lock()
				waited += took
				if acquired > 0 {
					lat = append(lat, now.Sub(start)-time.Duration(released))
					if holder != ci {
						crossed++
					}
				}
				acquired++
				holder = ci
				mine, last := acquired, acquired >= b.N
				released = int64(time.Since(start))
				turn.Broadcast()
				mu.Unlock()
				if r.hold > 0 {
					time.Sleep(r.hold)
					mu.Lock()
					released = int64(time.Since(start))
					mu.Unlock()
				}
				if err := l.Release(context.Background()); err != nil {
					b.Error(err)
					return
				}
				if last {
					cancel()
					return
				}
				if r.rotate {
					mu.Lock()
					for acquired == mine && ctx.Err() == nil {
						turn.Wait()
					}
					mu.Unlock()
				}
			}
		}()
	}
	go func() { <-ctx.Done(); mu.Lock(); turn.Broadcast(); mu.Unlock() }()
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	stmts := p.Commands()[proxyComStmtExecute]
	b.ReportMetric(float64(acquired)/elapsed.Seconds(), "handoffs/s")
	b.ReportMetric(float64(stmts)/float64(acquired), "stmts/handoff")
	if len(lat) > 0 {
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		b.ReportMetric(float64(crossed)/float64(len(lat)), "cross/handoff")
	}
	if polls := stmts - 2*acquired; r.rotate && waited > 0 {
		b.ReportMetric(float64(max(polls, 0))/waited.Seconds(), "polls/s/waiter")
	}
}

// BenchmarkNames is K goroutines each taking and releasing a name of its
// own through one Client: throughput grows with K until the server's
// commit rate binds. ns/op is per pair, across all goroutines.
func BenchmarkNames(b *testing.B) {
	e := benchEnv(b)
	for _, k := range []int{1, 4, 16, 32} {
		b.Run(fmt.Sprintf("K=%d", k), func(b *testing.B) {
			c := e.newClient(b)
			ctx := context.Background()
			mustAcquire(b, c, "warm", time.Second).Release(ctx)
			var left atomic.Int64
			left.Store(int64(b.N))
			b.ReportAllocs()
			start := time.Now()
			b.ResetTimer()
			var wg sync.WaitGroup
			for i := range k {
				wg.Add(1)
				go func() {
					defer wg.Done()
					name := fmt.Sprintf("name-%d", i)
					for left.Add(-1) >= 0 {
						l, err := c.TryAcquire(ctx, name, benchTTL)
						if err != nil {
							b.Error(err)
							return
						}
						if err := l.Release(ctx); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "pairs/s")
		})
	}
}

// BenchmarkContention is 4 Clients (processes, each on a *sql.DB of its
// own, one goroutine each) that loop on one name: Acquire, hold 50ms,
// Release, for contentionRun; the set and slot variants loop so on a set
// of two names (AcquireSet) and on a semaphore of one slot (Semaphore.Acquire),
// with default options. Nothing makes them take turns: what they get
// is what the lock gives them. It reports:
//
//   - cross/acq: the share of acquisitions that went to another Client
//     than the last holder;
//   - p50-µs, p99-µs: from the holder calling Release to another Client's
//     Acquire returning;
//   - min-share: the smallest share of the acquisitions any Client got (a
//     fair lock gives 0.25);
//   - polls/s/waiter: acquire statements beyond one per acquisition, per
//     second a Client spent waiting in Acquire;
//   - chan-stmts/acq: statements on the wake-up channel per acquisition
//     (GET_LOCK, RELEASE_LOCK and the probe after a release; 0 without).
//
// A set's statements are sent as text, as the channel's are: its variant
// reports neither of the last two.
//
// Each variant runs once for contentionRun whatever b.N is: run it with
// -benchtime 1x.
func BenchmarkContention(b *testing.B) {
	e := benchEnv(b)
	hot := func(ctx context.Context, c *Client) (*Lock, error) { return c.Acquire(ctx, "hot", benchTTL) }
	for _, v := range []struct {
		name    string
		opts    []Option
		acquire func(ctx context.Context, c *Client) (*Lock, error)
	}{
		{"default", nil, hot},
		{"backoff=1ms-16ms", []Option{WithWakeups(0), WithRetry(ExponentialBackoff(time.Millisecond, 16*time.Millisecond))}, hot},
		{"wakeups=0", []Option{WithWakeups(0)}, hot},
		{"set", nil, func(ctx context.Context, c *Client) (*Lock, error) {
			return c.AcquireSet(ctx, []string{"hot", "hot2"}, benchTTL)
		}},
		{"slot", nil, func(ctx context.Context, c *Client) (*Lock, error) {
			return c.Semaphore("hot", 1).Acquire(ctx, benchTTL)
		}},
	} {
		if v.name == "set" && e.server.Vitess || v.name == "slot" && e.oneRow() {
			continue
		}
		b.Run(v.name, func(b *testing.B) { benchContention(b, e, v.opts, v.acquire, v.name != "set") })
	}
}

const (
	contentionRun  = 20 * time.Second
	contentionHold = 50 * time.Millisecond
)

// benchContention runs BenchmarkContention's loop on acquire; counted
// tells that its acquire and release are prepared statements, so that the
// proxy's counts tell polls and channel statements apart.
func benchContention(b *testing.B, e *testEnv, opts []Option, acquire func(context.Context, *Client) (*Lock, error), counted bool) {
	const clients = 4
	table := e.newTable(b)
	p := startProxy(b, e.serverAddr(b))
	cs := make([]*Client, clients)
	for i := range cs {
		db := e.openDBWith(b, func(c *mysql.Config) { c.Addr = p.Addr() })
		cs[i] = e.client(b, db, table, opts...)
		l, err := acquire(context.Background(), cs[i]) // the first use's proofs
		if err != nil {
			b.Fatal(err)
		}
		l.Release(context.Background())
	}
	ctx, cancel := context.WithTimeout(context.Background(), contentionRun)
	defer cancel()
	var (
		mu       sync.Mutex
		holder   = -1
		released time.Time
		lat      []time.Duration
		per      [clients]int
		total    int
		crossed  int
		waited   time.Duration
	)
	b.ReportAllocs()
	p.ResetCounts()
	b.ResetTimer()
	var wg sync.WaitGroup
	for ci := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				called := time.Now()
				l, err := acquire(ctx, cs[ci])
				if err != nil {
					if ctx.Err() == nil {
						b.Error(err)
					}
					return
				}
				now := time.Now()
				mu.Lock()
				waited += now.Sub(called)
				if holder >= 0 && holder != ci {
					crossed++
					lat = append(lat, now.Sub(released))
				}
				holder = ci
				per[ci]++
				total++
				mu.Unlock()
				time.Sleep(contentionHold)
				mu.Lock()
				released = time.Now()
				mu.Unlock()
				if err := l.Release(context.Background()); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	cmds := p.Commands()
	polls := cmds[proxyComStmtExecute] - 2*total
	least := total
	for _, n := range per {
		least = min(least, n)
	}
	b.ReportMetric(float64(total), "acquisitions")
	b.ReportMetric(float64(crossed)/float64(max(total-1, 1)), "cross/acq")
	b.ReportMetric(float64(least)/float64(max(total, 1)), "min-share")
	if len(lat) > 0 {
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	}
	if !counted {
		return
	}
	b.ReportMetric(float64(cmds[proxyComQuery])/float64(max(total, 1)), "chan-stmts/acq")
	if waited > 0 {
		b.ReportMetric(float64(max(polls, 0))/waited.Seconds(), "polls/s/waiter")
	}
}

// BenchmarkAcquireWakeups is one uncontended Acquire and Release, with
// wake-up channels off and on: on, the release of a lease taken without
// waiting also asks whether another process waits (wake_probe), one
// statement that writes nothing, at most once every probeEvery.
func BenchmarkAcquireWakeups(b *testing.B) {
	e := benchEnv(b)
	ctx := context.Background()
	for _, n := range []int{0, defaultWakeups} {
		b.Run(fmt.Sprintf("wakeups=%d", n), func(b *testing.B) {
			c := e.newClient(b, WithWakeups(n))
			mustAcquire(b, c, "warm", time.Second).Release(ctx)
			b.ReportAllocs()
			for b.Loop() {
				l, err := c.Acquire(ctx, "bench", benchTTL)
				if err != nil {
					b.Fatal(err)
				}
				if err := l.Release(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkFirstUse is what a Client's first lease costs beside every later
// one: the first-use check of the table and the proof of the statements
// (internal/engine/proof.go), then the acquire and release, each prepared on first use.
//
//   - firstUse: New, TryAcquire, Release and Close on a table that exists;
//   - firstUseUnproven: the same with the proof skipped, so that the
//     difference is the proof's cost alone;
//   - firstSet, firstSetUnproven: a Client's first set (its single-name
//     proof taken as made), with and without the set statements' proof;
//   - warm: TryAcquire and Release on a Client that has made both.
func BenchmarkFirstUse(b *testing.B) {
	e := benchEnv(b)
	ctx := context.Background()
	table := e.newTable(b)
	var firstOn func(b *testing.B, db *sql.DB, skipProof bool)
	first := func(b *testing.B, skipProof bool) {
		firstOn(b, e.db, skipProof)
	}
	firstOn = func(b *testing.B, db *sql.DB, skipProof bool) {
		b.ReportAllocs()
		for b.Loop() {
			c, err := New(db, WithTable(table))
			if err != nil {
				b.Fatal(err)
			}
			if skipProof {
				c.markProven()
			}
			l, err := c.TryAcquire(ctx, "bench", benchTTL)
			if err != nil {
				b.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				b.Fatal(err)
			}
			if err := c.Close(); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("firstUse", func(b *testing.B) { first(b, false) })
	b.Run("firstUseUnproven", func(b *testing.B) { first(b, true) })
	// A Client's first set, after its first single name: the set
	// statements' own proof (internal/engine/later.go), and without it.
	firstSet := func(b *testing.B, skipProof bool) {
		b.ReportAllocs()
		for b.Loop() {
			c, err := New(e.db, WithTable(table))
			if err != nil {
				b.Fatal(err)
			}
			c.markProven()
			if skipProof {
				c.eng.Mark(func(f *engine.Forms) *bool { return &f.Later[engine.LaterSets] })
			}
			l, err := c.TryAcquireSet(ctx, []string{"bench", "bench2"}, benchTTL)
			if err != nil {
				b.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				b.Fatal(err)
			}
			if err := c.Close(); err != nil {
				b.Fatal(err)
			}
		}
	}
	if !e.server.Vitess {
		b.Run("firstSet", func(b *testing.B) { firstSet(b, false) })
		b.Run("firstSetUnproven", func(b *testing.B) { firstSet(b, true) })
	}
	// A pool of one connection: no second connection, so no proof of the
	// row lock between two, nor of the servers they reach (internal/engine/facts.go).
	b.Run("firstUseOneConn", func(b *testing.B) {
		db := e.openDB(b)
		db.SetMaxOpenConns(1)
		firstOn(b, db, false)
	})
	b.Run("warm", func(b *testing.B) { benchWarmPair(b, e.client(b, e.db, table)) })
}

// benchWarmPair measures one uncontended TryAcquire and Release on c, once
// its statements are prepared.
func benchWarmPair(b *testing.B, c *Client) {
	ctx := context.Background()
	mustAcquire(b, c, "warm", time.Second).Release(ctx)
	b.ReportAllocs()
	for b.Loop() {
		l, err := c.TryAcquire(ctx, "bench", benchTTL)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkObserver is BenchmarkPair's sqllock variant without an Observer,
// with an empty one, and with one whose every func does nothing: what
// observing costs the library, not the observer.
func BenchmarkObserver(b *testing.B) {
	e := benchEnv(b)
	noop := observe.Observer{
		AcquireDone: func(observe.AcquireEvent) {}, HoldStart: func(observe.HoldEvent) {}, HoldEnd: func(observe.HoldEvent) {},
		Refreshed: func(observe.RefreshEvent) {}, Released: func(observe.ReleaseEvent) {}, Retried: func(observe.RetryEvent) {},
		Unknown: func(observe.UnknownEvent) {}, Wakeup: func(observe.WakeupEvent) {},
	}
	b.Run("none", func(b *testing.B) { benchWarmPair(b, e.newClient(b)) })
	b.Run("empty", func(b *testing.B) { benchWarmPair(b, e.newClient(b, WithObserver(observe.Observer{}))) })
	b.Run("noop", func(b *testing.B) { benchWarmPair(b, e.newClient(b, WithObserver(noop))) })
}

// BenchmarkSets is an uncontended acquire and release of K names: one
// TryAcquireSet of the K names and the set's Release (two statements,
// whatever K), beside K TryAcquire and Release pairs one after another, what
// a caller without sets pays, and is never all or nothing.
func BenchmarkSets(b *testing.B) {
	e := benchEnv(b)
	ctx := context.Background()
	for _, k := range []int{1, 10, 64} {
		names := make([]string, k)
		for i := range names {
			names[i] = fmt.Sprintf("set-%02d", i)
		}
		b.Run(fmt.Sprintf("all/K=%d", k), func(b *testing.B) {
			c := e.newClient(b)
			mustAcquire(b, c, "warm", time.Second).Release(ctx)
			b.ReportAllocs()
			for b.Loop() {
				l, err := c.TryAcquireSet(ctx, names, benchTTL)
				if err != nil {
					b.Fatal(err)
				}
				if err := l.Release(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
		if k == 64 {
			continue // the trend is plain at 10
		}
		b.Run(fmt.Sprintf("oneByOne/K=%d", k), func(b *testing.B) {
			c := e.newClient(b)
			mustAcquire(b, c, "warm", time.Second).Release(ctx)
			locks := make([]*Lock, k)
			b.ReportAllocs()
			for b.Loop() {
				for i, n := range names {
					l, err := c.TryAcquire(ctx, n, benchTTL)
					if err != nil {
						b.Fatal(err)
					}
					locks[i] = l
				}
				for _, l := range locks {
					if err := l.Release(ctx); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

// BenchmarkSlots is one uncontended Semaphore.TryAcquire and Release beside
// BenchmarkPair's TryAcquire and Release, in one run: a slot costs one
// statement whose rows grow with n (the fence row twice and every slot row),
// with n-1 slots held by others or none.
func BenchmarkSlots(b *testing.B) {
	e := benchEnv(b)
	b.Run("TryAcquire", func(b *testing.B) { benchWarmPair(b, e.newClient(b)) })
	for _, tc := range []struct{ n, held int }{{1, 0}, {8, 0}, {8, 7}, {64, 63}} {
		b.Run(fmt.Sprintf("TryAcquireSlot/n=%d/held=%d", tc.n, tc.held), func(b *testing.B) {
			c := e.newClient(b)
			ctx := context.Background()
			other := e.client(b, e.db, trimTable(c.table))
			for range tc.held {
				if _, err := other.Semaphore("bench", tc.n).TryAcquire(ctx, time.Hour); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			for b.Loop() {
				l, err := c.Semaphore("bench", tc.n).TryAcquire(ctx, benchTTL)
				if err != nil {
					b.Fatal(err)
				}
				if err := l.Release(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func trimTable(quoted string) string { return quoted[1 : len(quoted)-1] }
