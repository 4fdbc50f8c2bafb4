package sqllock

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock/internal/fault"
)

// The cluster tests run on the three-node clusters scripts/cluster starts,
// when their variables name the nodes' DSNs, comma-separated:
//
//	eval "$(scripts/cluster galera env)"   # SQLLOCK_TEST_GALERA_DSNS
//	eval "$(scripts/cluster gr env)"       # SQLLOCK_TEST_GR_DSNS
//
// Unset, they skip (CI starts the clusters in steps of their own, and runs
// these tests there); set, every node must answer, CI or not. A Group
// Replication group runs the multi-writer tests in multi-primary mode and
// the failover test in single-primary mode.
const (
	galeraEnv = "SQLLOCK_TEST_GALERA_DSNS"
	grEnv     = "SQLLOCK_TEST_GR_DSNS"
	// grKillEnv names a shell command that SIGKILLs the group's primary,
	// such as "scripts/cluster gr kill-primary". The failover test runs
	// only when it is set: it takes a node down.
	grKillEnv = "SQLLOCK_TEST_GR_KILL_PRIMARY"
)

// A testCluster is a cluster's nodes, each with a pool of its own.
type testCluster struct {
	label string
	dsns  []string
	dbs   []*sql.DB
	gr    bool
}

// clusterFrom returns the cluster env names, skipping the test when env is
// unset and failing it when a node does not answer.
func clusterFrom(t *testing.T, env string) *testCluster {
	t.Helper()
	v := os.Getenv(env)
	if v == "" {
		t.Skipf("set %s to the comma-separated DSNs of a three-node cluster (scripts/cluster galera|gr env prints it) to run this test", env)
	}
	c := &testCluster{label: env}
	for _, dsn := range strings.Split(v, ",") {
		if dsn = strings.TrimSpace(dsn); dsn == "" {
			continue
		}
		db, err := sql.Open("mysql", dsn)
		if err != nil {
			t.Fatalf("%s: %v", env, err)
		}
		t.Cleanup(func() { db.Close() })
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = db.PingContext(ctx)
		cancel()
		if err != nil {
			t.Fatalf("%s: node %s does not answer: %v", env, dsn, err)
		}
		c.dsns = append(c.dsns, dsn)
		c.dbs = append(c.dbs, db)
	}
	if len(c.dsns) < 2 {
		t.Fatalf("%s names %d node(s); the cluster tests need at least 2", env, len(c.dsns))
	}
	var mode sql.NullString
	err := c.dbs[0].QueryRow("SELECT @@global.group_replication_single_primary_mode").Scan(&mode)
	c.gr = err == nil
	return c
}

// singlePrimary reports whether the cluster is a Group Replication group in
// single-primary mode.
func (c *testCluster) singlePrimary(t *testing.T) bool {
	t.Helper()
	if !c.gr {
		return false
	}
	var on bool
	if err := c.dbs[0].QueryRow("SELECT @@global.group_replication_single_primary_mode").Scan(&on); err != nil {
		t.Fatalf("group_replication_single_primary_mode: %v", err)
	}
	return on
}

// multiWriter returns the cluster when every node takes writes, and skips
// the test otherwise.
func multiWriter(t *testing.T, env string) *testCluster {
	t.Helper()
	c := clusterFrom(t, env)
	if c.singlePrimary(t) {
		t.Skipf("%s names a single-primary group; this test needs writers on several nodes (scripts/cluster gr multi-primary)", env)
	}
	return c
}

// newTable creates a lock table through db and waits until every node has
// it; it is dropped through db when the test ends, once every node has
// applied what the others committed (caughtUp): a Group Replication
// member that drops the table before applying another member's last
// write to it stops its applier and leaves the group (a CI run lost a
// node so, and every test after it).
func (c *testCluster) newTable(t *testing.T, db *sql.DB) string {
	t.Helper()
	e := &testEnv{db: db}
	table := e.newTable(t)
	for i, db := range c.dbs {
		waitFor(t, 30*time.Second, fmt.Sprintf("table %s on node %d", table, i+1), func() bool {
			_, err := db.Exec("SELECT 1 FROM `" + table + "` LIMIT 1")
			return err == nil
		})
	}
	t.Cleanup(func() { c.caughtUp(t) }) // runs before the drop, registered earlier
	return table
}

// caughtUp waits until every node has applied every transaction the
// others had committed when it was called: on Group Replication, each
// node waits for every node's gtid_executed; on Galera, a query with
// wsrep_sync_wait on each node waits for its apply queue.
func (c *testCluster) caughtUp(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if !c.gr {
		for i, db := range c.dbs {
			conn, err := db.Conn(ctx)
			if err == nil {
				if _, err = conn.ExecContext(ctx, "SET SESSION wsrep_sync_wait = 1"); err == nil {
					_, err = conn.ExecContext(ctx, "SELECT 1")
					_, _ = conn.ExecContext(ctx, "SET SESSION wsrep_sync_wait = 0")
				}
				_ = conn.Close()
			}
			var serverErr *mysql.MySQLError
			switch {
			case err != nil && !errors.As(err, &serverErr):
				t.Logf("node %d does not answer (%v): not waited for", i+1, err)
			case err != nil:
				t.Errorf("node %d catching up: %v", i+1, err)
			}
		}
		return
	}
	// A node a test took down (the failover test kills the primary) has
	// nothing to apply, and nothing to wait for: it is left out.
	var (
		live []int
		sets []string
	)
	for i, db := range c.dbs {
		var set string
		err := db.QueryRowContext(ctx, "SELECT @@GLOBAL.gtid_executed").Scan(&set)
		var serverErr *mysql.MySQLError
		if err != nil && !errors.As(err, &serverErr) {
			t.Logf("node %d does not answer (%v): not waited for", i+1, err)
			continue
		}
		if err != nil {
			t.Errorf("node %d: gtid_executed: %v", i+1, err)
			return
		}
		live, sets = append(live, i), append(sets, set)
	}
	for _, i := range live {
		for k, set := range sets {
			var timedOut int
			if err := c.dbs[i].QueryRowContext(ctx, "SELECT WAIT_FOR_EXECUTED_GTID_SET(?, 30)", set).Scan(&timedOut); err != nil || timedOut != 0 {
				t.Errorf("node %d waiting for node %d's transactions: %d, %v", i+1, live[k]+1, timedOut, err)
			}
		}
	}
}

// clusterWriters runs f for each multi-writer cluster whose variable is set.
func clusterWriters(t *testing.T, f func(t *testing.T, c *testCluster)) {
	for _, env := range []string{galeraEnv, grEnv} {
		t.Run(env, func(t *testing.T) { f(t, multiWriter(t, env)) })
	}
}

// They run first of the multi-writer tests: in a CI run a Group Replication
// member left the group (super_read_only) after the contention test's
// load on this 2-core machine, which the stress run after it tolerates
// (-allow-errors) but a test that writes on every node does not.
//
// Overlapping sets raced from every node: never two holders of a name,
// fences growing, no deadlock, and nothing left (raceSets). A set's commit
// that loses certification to another node's is sent again, as a single
// acquire is.
func TestCluster_sets_overlapping(t *testing.T) {
	clusterWriters(t, func(t *testing.T, c *testCluster) {
		table := c.newTable(t, c.dbs[0])
		var clients []*Client
		for n, db := range c.dbs {
			clients = append(clients, (&testEnv{}).client(t, db, table, WithHolder(fmt.Sprintf("node%d", n+1))))
		}
		raceSets(t, clients, 3, 80, func() { c.caughtUp(t) })
	})
}

// A semaphore of 2 slots raced from every node, two Clients per node:
// never more than 2 holders, no slot or fence given twice (raceSlots).
func TestCluster_slots_neverMoreThanN(t *testing.T) {
	clusterWriters(t, func(t *testing.T, c *testCluster) {
		table := c.newTable(t, c.dbs[0])
		var clients []*Client
		for n, db := range c.dbs {
			for range 2 {
				clients = append(clients, (&testEnv{}).client(t, db, table, WithHolder(fmt.Sprintf("node%d", n+1))))
			}
		}
		raceSlots(t, clients, 2, 40)
	})
}

// The shared renewal across nodes: a Client on the first node keeps ten
// leases alive together; one forced free from the second node ends that
// lease's keep-alive alone, and the second node finds the others held.
func TestCluster_sharedRenewal_forcedReleaseEndsThatLeaseAlone(t *testing.T) {
	clusterWriters(t, func(t *testing.T, c *testCluster) {
		table := c.newTable(t, c.dbs[0])
		var count sharedCount
		a := (&testEnv{}).client(t, c.dbs[0], table, WithHolder("node1"), WithObserver(count.observer()))
		b := (&testEnv{}).client(t, c.dbs[1], table, WithHolder("node2"), WithLockDelay(0))
		forcedEndsThatLeaseAlone(t, a, b, &count)
	})
}

// A holder on one node checks its lease in a transaction; the lease expires
// and a client on another node takes the name over and commits; the
// holder's commit, sent at once, must then fail. A Check that only read the
// lease row (a shared lock, local to one node, certified by no one) let
// that commit through when it reached certification before the takeover
// was applied on the holder's node: in about one round in ten on Galera
// here.
func TestCluster_Check_acrossNodes(t *testing.T) {
	clusterWriters(t, func(t *testing.T, c *testCluster) {
		table := c.newTable(t, c.dbs[0])
		holderDB, takerDB := c.dbs[0], c.dbs[1]
		holder := (&testEnv{}).client(t, holderDB, table, WithHolder("holder"))
		taker := (&testEnv{}).client(t, takerDB, table, WithHolder("taker"))
		if _, err := holderDB.Exec("CREATE TABLE `" + table + "_work` (id INT PRIMARY KEY, v INT NOT NULL) ENGINE=InnoDB"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { holderDB.Exec("DROP TABLE IF EXISTS `" + table + "_work`") })
		ctx := testCtx(t)
		const ttl = 300 * time.Millisecond
		const rounds = 20
		for i := range rounds {
			name := fmt.Sprintf("n%d", i)
			l := mustAcquire(t, holder, name, ttl)
			tx, err := holderDB.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Check(ctx, tx); err != nil {
				tx.Rollback()
				t.Fatalf("round %d: Check of a live lease: got %v, want nil", i, err)
			}
			if _, err := tx.ExecContext(ctx, "INSERT INTO `"+table+"_work` VALUES (?, 1)", i); err != nil {
				tx.Rollback()
				t.Fatal(err)
			}
			time.Sleep(ttl + 100*time.Millisecond) // the lease expires
			var taken *Lock
			waitFor(t, 30*time.Second, "the takeover on the other node", func() bool {
				taken, err = taker.TryAcquire(ctx, name, time.Minute)
				return err == nil
			})
			cerr := tx.Commit()
			if cerr == nil {
				t.Errorf("round %d: the holder's commit succeeded after a takeover on another node committed (fence %d after %d)", i, taken.Fence(), l.Fence())
			} else if classify(cerr) != fault.RolledBack {
				t.Errorf("round %d: the holder's commit failed with %v; want a certification conflict (rolled back)", i, cerr)
			}
			if err := taken.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		var n int
		if err := takerDB.QueryRow("SELECT COUNT(*) FROM `" + table + "_work`").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Errorf("%d writes of holders whose lease was taken over committed, want 0", n)
		}
	})
}

// Clients on every node contend for a few names at once. Their statements
// conflict at commit (Galera answers 1213; Group Replication 3101, 1213 or
// 1180 with handler error 149), and the library sends them again within the
// call's budget: no such error reaches a caller before the budget
// (maxRetryBudget) is spent. (On a loaded machine a call can meet
// conflicts for all of it; the error then says so, as documented.)
func TestCluster_contention_noConflictReachesCallers(t *testing.T) {
	clusterWriters(t, func(t *testing.T, c *testCluster) {
		table := c.newTable(t, c.dbs[0])
		ctx := testCtx(t)
		const (
			perNode = 4
			names   = 2
			runFor  = 5 * time.Second
		)
		stop := time.Now().Add(runFor)
		var (
			mu                 sync.Mutex
			errs               []error
			acquired, refreshd int
			wg                 sync.WaitGroup
		)
		fail := func(err error) {
			mu.Lock()
			defer mu.Unlock()
			errs = append(errs, err)
		}
		for n, db := range c.dbs {
			cl := (&testEnv{}).client(t, db, table, WithHolder(fmt.Sprintf("node%d", n+1)))
			for g := range perNode {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; time.Now().Before(stop); i++ {
						name := fmt.Sprintf("c%d", (g+i)%names)
						began := time.Now()
						l, err := cl.TryAcquire(ctx, name, 2*time.Second)
						if errors.Is(err, ErrNotAcquired) {
							time.Sleep(time.Millisecond)
							continue
						}
						if err != nil && classify(err) == fault.RolledBack && time.Since(began) >= fault.MaxRetryBudget-fault.MaxBackoff {
							t.Logf("node %d: TryAcquire met conflicts for its whole budget (%v): %v", n+1, time.Since(began).Round(time.Millisecond), err)
							continue
						}
						if err != nil {
							fail(fmt.Errorf("node %d: TryAcquire after %v: %w", n+1, time.Since(began).Round(time.Millisecond), err))
							continue
						}
						if err := l.Refresh(ctx, 2*time.Second); err != nil {
							fail(fmt.Errorf("node %d: Refresh: %w", n+1, err))
						}
						if err := l.Release(ctx); err != nil {
							fail(fmt.Errorf("node %d: Release: %w", n+1, err))
						}
						mu.Lock()
						acquired++
						refreshd++
						mu.Unlock()
					}
				}()
			}
		}
		wg.Wait()
		for i, err := range errs {
			if i == 10 {
				t.Errorf("... and %d more", len(errs)-i)
				break
			}
			t.Errorf("got %v, want no error but ErrNotAcquired", err)
		}
		if acquired == 0 {
			t.Errorf("no acquire succeeded: the run proved nothing")
		}
		t.Logf("%d acquired, refreshed and released across %d nodes", acquired, len(c.dbs))
	})
}

// failoverDB returns a pool whose connections go to the first node that
// takes writes, as a router in front of a group would: while none does (an
// election), to a read-only one (whose writes fail with 1290), and while
// none answers, the dial error. Connections are recycled often, so the pool
// follows a new primary.
func failoverDB(t *testing.T, dsns []string) *sql.DB {
	t.Helper()
	f := &failoverConnector{}
	for _, dsn := range dsns {
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Timeout = 2 * time.Second
		cfg.Logger = log.New(io.Discard, "", 0) // a killed node makes the driver log
		conn, err := mysql.NewConnector(cfg)
		if err != nil {
			t.Fatal(err)
		}
		f.nodes = append(f.nodes, conn)
	}
	db := sql.OpenDB(f)
	db.SetConnMaxLifetime(time.Second)
	t.Cleanup(func() { db.Close() })
	return db
}

type failoverConnector struct{ nodes []driver.Connector }

func (f *failoverConnector) Driver() driver.Driver { return f.nodes[0].Driver() }

func (f *failoverConnector) Connect(ctx context.Context) (driver.Conn, error) {
	var (
		readOnly driver.Conn
		last     error
	)
	for _, n := range f.nodes {
		conn, err := n.Connect(ctx)
		if err != nil {
			last = err
			continue
		}
		ro, err := connReadOnly(ctx, conn)
		switch {
		case err == nil && !ro:
			if readOnly != nil {
				readOnly.Close()
			}
			return conn, nil
		case err == nil && readOnly == nil:
			readOnly = conn
		default:
			if err != nil {
				last = err
			}
			conn.Close()
		}
	}
	if readOnly != nil {
		return readOnly, nil
	}
	return nil, last
}

func connReadOnly(ctx context.Context, conn driver.Conn) (bool, error) {
	q, ok := conn.(driver.QueryerContext)
	if !ok {
		return false, errors.New("the driver's connection cannot query")
	}
	rows, err := q.QueryContext(ctx, "SELECT @@global.read_only", nil)
	if err != nil {
		return false, err
	}
	defer rows.Close()
	v := make([]driver.Value, 1)
	if err := rows.Next(v); err != nil {
		return false, err
	}
	return fmt.Sprint(v[0]) != "0", nil
}

// primaryIndex returns the index of the node that takes writes, or -1.
func (c *testCluster) primaryIndex() int {
	for i, db := range c.dbs {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		var ro bool
		err := db.QueryRowContext(ctx, "SELECT @@global.read_only").Scan(&ro)
		cancel()
		if err == nil && !ro {
			return i
		}
	}
	return -1
}

// The group's primary is SIGKILLed while holders keep leases alive and
// workers acquire and release. The holders keep every lease through the
// election (about 20 s of refused connections, broken ones and 1290
// --super-read-only): the keep-alive goes on through those errors, and the
// new primary has every lease acknowledged before the kill. No name stays
// blocked by an acquire in flight at the kill: once the workers' Client
// has closed, another takes every name at once, though their ttl is long.
func TestCluster_failover_GRPrimaryKilled(t *testing.T) {
	kill := os.Getenv(grKillEnv)
	if kill == "" {
		t.Skipf("set %s to a command that SIGKILLs the group's primary (scripts/cluster gr kill-primary), with %s, to run this test; it takes a node down", grKillEnv, grEnv)
	}
	c := clusterFrom(t, grEnv)
	if !c.singlePrimary(t) {
		t.Skipf("%s names a multi-primary group; the failover test needs a single primary (scripts/cluster gr single-primary)", grEnv)
	}
	// Through a pool that follows the primary, so that the table is dropped
	// on the new one.
	table := c.newTable(t, failoverDB(t, c.dsns))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const (
		holders = 20
		workers = 4
		ttl     = time.Minute // longer than an election, with its margin
	)
	hc := (&testEnv{}).client(t, failoverDB(t, c.dsns), table, WithHolder("holder"))
	type held struct {
		l   *Lock
		ctx context.Context
	}
	var hs []held
	for i := range holders {
		l := mustAcquire(t, hc, fmt.Sprintf("held%d", i), ttl)
		hs = append(hs, held{l, l.KeepAlive(ctx)})
	}

	// Workers acquire and release names of their own, with the long ttl,
	// until the election is over: some acquire is in flight at the kill.
	var logged strings.Builder // the workers' warnings, to count acquires left unsettled
	var logMu sync.Mutex
	logger := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		logMu.Lock()
		defer logMu.Unlock()
		return logged.Write(p)
	}), &slog.HandlerOptions{Level: slog.LevelWarn}))
	wc := (&testEnv{}).client(t, failoverDB(t, c.dsns), table, WithHolder("worker"),
		WithRetry(LinearBackoff(20*time.Millisecond)), WithLogger(logger))
	wctx, stopWorkers := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for wctx.Err() == nil {
				actx, cancel := context.WithTimeout(wctx, 3*time.Second)
				l, err := wc.Acquire(actx, fmt.Sprintf("work%d", w), ttl)
				cancel()
				if err == nil {
					rctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
					_ = l.Release(rctx) // a failed release leaves it to Close
					cancel()
				}
			}
		}()
	}

	time.Sleep(2 * time.Second)
	old := c.primaryIndex()
	if old < 0 {
		t.Fatal("no node takes writes before the kill")
	}
	t.Logf("killing the primary, node %d: %s", old+1, kill)
	if out, err := exec.CommandContext(ctx, "sh", "-c", kill).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", kill, err, out)
	}
	killedAt := time.Now()
	waitFor(t, 3*time.Minute, "a new primary", func() bool {
		time.Sleep(200 * time.Millisecond)
		i := c.primaryIndex()
		return i >= 0 && i != old
	})
	t.Logf("a new primary after %v", time.Since(killedAt).Round(time.Second))
	time.Sleep(2 * time.Second) // let the pools' connections move to it
	stopWorkers()
	wg.Wait()

	for i, h := range hs {
		if err := h.ctx.Err(); err != nil {
			t.Errorf("holder %d: the keep-alive gave up: %v", i, context.Cause(h.ctx))
			continue
		}
		if err := h.l.Refresh(ctx, ttl); err != nil {
			t.Errorf("holder %d: Refresh on the new primary: got %v, want nil", i, err)
		}
	}
	logMu.Lock()
	t.Logf("acquires whose outcome stayed unknown at the failover: %d", strings.Count(logged.String(), "outcome stays unknown"))
	logMu.Unlock()
	if err := wc.Close(); err != nil {
		t.Errorf("the workers' Close: %v", err)
	}
	other := (&testEnv{}).client(t, failoverDB(t, c.dsns), table, WithHolder("other"))
	for w := range workers {
		name := fmt.Sprintf("work%d", w)
		l, err := other.TryAcquire(ctx, name, time.Second)
		if err != nil {
			info, _ := other.Inspect(ctx, name)
			t.Errorf("%s after the failover and the workers' Close: got %v (held by %q, %v left), want the lease", name, err, info.Holder, info.TTL)
			continue
		}
		if err := l.Release(ctx); err != nil {
			t.Error(err)
		}
	}
	for i, h := range hs {
		if err := h.l.Release(ctx); err != nil {
			t.Errorf("holder %d: Release: %v", i, err)
		}
	}
}

type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// Issue 22, point 2, on the real Galera cluster. Some MariaDB Galera
// versions refuse GET_LOCK while wsrep is on (error 1235); MariaDB 10.11's,
// which CI starts, grants it, but each node's named locks are its own. A
// Client with wake-up channels must get the name from a holder on another
// node either way: when the node refuses, it says so once, turns its
// channels off and polls; when it grants, the channel never hears the other
// node's release, and the waiter learns of it by polling.
func TestCluster_wakeups_galera(t *testing.T) {
	c := clusterFrom(t, galeraEnv)
	if c.gr {
		t.Skip("this is Galera's case")
	}
	var granted sql.NullInt64
	refuses := false
	if err := c.dbs[0].QueryRow("SELECT GET_LOCK('sqllock-test-probe', 0)").Scan(&granted); err != nil {
		if n, ok := fault.Errno(err); !ok || n != fault.NotSupportedYet {
			t.Fatalf("GET_LOCK on the first node: %v", err)
		}
		refuses = true
	} else {
		c.dbs[0].Exec("DO RELEASE_LOCK('sqllock-test-probe')")
	}
	t.Logf("the first node refuses GET_LOCK: %v", refuses)
	table := c.newTable(t, c.dbs[0])
	ctx := testCtx(t)
	rec, logOpt := newRecorder()
	waiter := (&testEnv{}).client(t, c.dbs[0], table, WithRetry(LinearBackoff(20*time.Millisecond)), logOpt)
	holder := (&testEnv{}).client(t, c.dbs[1], table)
	for i := range 2 {
		name := fmt.Sprintf("n%d", i)
		l := mustAcquire(t, holder, name, time.Minute)
		got := acquireAsync(ctx, waiter, name)
		waitFor(t, time.Minute, "the waiter has tried", func() bool { return headAttempts(waiter, name) > 0 })
		time.Sleep(100 * time.Millisecond)
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		w := mustGet(t, got)
		if err := w.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var refusals int
	for _, line := range rec.atLeast(slog.LevelWarn) {
		if strings.Contains(line, "refuses GET_LOCK") {
			refusals++
		}
	}
	if refuses {
		if !waiter.wait.Peek("").Refused {
			t.Error("the Client's channels are still on after Galera refused GET_LOCK")
		}
		if refusals != 1 {
			t.Errorf("warnings about the refusal: got %d, want 1 (logged: %v)", refusals, rec.atLeast(slog.LevelWarn))
		}
	} else if refusals != 0 {
		t.Errorf("warnings about a refusal from a node that grants GET_LOCK: %d", refusals)
	}
}

// galeraAheadEnv names, for TestCluster_clockAhead_warns, a Galera node
// (1, 2 or 3) whose clock was set at least a second ahead by hand:
//
//	scripts/cluster galera skew 3 +5s
//	SQLLOCK_TEST_GALERA_AHEAD=3 go test -run TestCluster_clockAhead_warns .
const galeraAheadEnv = "SQLLOCK_TEST_GALERA_AHEAD"

// A lease taken through a node whose clock runs ahead is read, through
// another node, with an acquired_at in that node's future: Inspect warns.
func TestCluster_clockAhead_warns(t *testing.T) {
	ahead := os.Getenv(galeraAheadEnv)
	if ahead == "" {
		t.Skipf("set %s to a Galera node whose clock runs at least 1 s ahead (scripts/cluster galera skew N +5s)", galeraAheadEnv)
	}
	c := clusterFrom(t, galeraEnv)
	i, err := strconv.Atoi(ahead)
	if err != nil || i < 1 || i > len(c.dbs) {
		t.Fatalf("%s=%q: want a node number from 1 to %d", galeraAheadEnv, ahead, len(c.dbs))
	}
	other := c.dbs[i%len(c.dbs)]
	table := c.newTable(t, other)
	taker := (&testEnv{}).client(t, c.dbs[i-1], table)
	rec, logOpt := newRecorder()
	reader := (&testEnv{}).client(t, other, table, logOpt)
	mustAcquire(t, taker, "skewed", time.Minute)
	waitFor(t, 30*time.Second, "the lease on the other node", func() bool {
		info, err := reader.Inspect(testCtx(t), "skewed")
		return err == nil && info.Held
	})
	got := rec.find(slog.LevelWarn, "acquired ahead", "skewed")
	if len(got) != 1 {
		t.Fatalf("warnings: got %d, want 1", len(got))
	}
	t.Logf("warned: %s ahead", attr(got[0], "ahead"))
}
