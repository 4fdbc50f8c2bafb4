package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// Fault injection: a connection cut between a statement and its reply, a
// reply later than the lease, a stalled network, a connection killed by the
// server, and (opt-in) a server restart. In each, a holder must never be
// told it holds a lease that another holds, nor lose its own lock to a
// retry. A second Client, connected directly, is the witness.

// faultEnv is a Client whose connections pass through a proxy, and a witness
// Client on the same table that connects directly.
type faultEnv struct {
	p       *proxy
	c       *Client // through the proxy
	witness *Client
	table   string
	vitess  bool // through vtgate (vitess_test.go)
}

func newFaultEnv(t *testing.T, e *testEnv) *faultEnv {
	t.Helper()
	table := e.newTable(t)
	p := startProxy(t, e.serverAddr(t))
	db := e.openDBWith(t, func(c *mysql.Config) {
		c.Addr = p.Addr()
		c.TLS, c.TLSConfig = nil, "false"
	})
	return &faultEnv{p: p, c: e.client(t, db, table, WithHolder("faulty")), witness: e.client(t, e.openDB(t), table, WithHolder("witness")), table: table, vitess: e.server.Vitess}
}

// wantHeldBy checks, through the witness, that l's lease is live on the
// server with l's fence, and that nobody else can take it.
func (f *faultEnv) wantHeldBy(t *testing.T, l *Lock) {
	t.Helper()
	if got := inspect(t, f.witness, l.Name()); !got.Held || got.Fence != l.Fence() || got.Holder != "faulty" {
		t.Fatalf("Inspect(%q): got %+v, want held by faulty with fence %d", l.Name(), got, l.Fence())
	}
	_, err := f.witness.TryAcquire(testCtx(t), l.Name(), time.Minute)
	wantErrIs(t, err, ErrNotAcquired)
}

// wantFree checks that the witness can take name, with a fence above after.
func (f *faultEnv) wantFree(t *testing.T, name string, after uint64) {
	t.Helper()
	l := mustAcquire(t, f.witness, name, time.Minute)
	if l.Fence() <= after {
		t.Fatalf("witness got fence %d, want above %d", l.Fence(), after)
	}
	if err := l.Release(testCtx(t)); err != nil {
		t.Fatalf("witness Release: %v", err)
	}
}

// wantRetried checks that the statement was sent again after the cut, so
// that the test exercised the retry and not a lucky first reply.
func (f *faultEnv) wantRetried(t *testing.T) {
	t.Helper()
	if n := f.p.Commands()[proxyComStmtExecute]; n < 2 {
		t.Fatalf("statements executed through the cut: got %d, want the cut one and a retry", n)
	}
}

// The reply to an acquire is lost after the server ran it: the retry, with
// the same token, must return the lease the first attempt took, with its
// fence, not refuse it as another owner's nor take a second one.
func TestFaults_cutAfterAcquire(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		f := newFaultEnv(t, e)
		ctx := testCtx(t)
		for _, tc := range []struct {
			name string
			warm bool // statements already prepared on a live connection
		}{{"cold", false}, {"warm", true}} {
			t.Run(tc.name, func(t *testing.T) {
				name := "acquire-" + tc.name
				if tc.warm {
					if err := mustAcquire(t, f.c, name, time.Minute).Release(ctx); err != nil {
						t.Fatal(err)
					}
				}
				before := inspect(t, f.witness, name).Fence
				f.p.ResetCounts()
				f.p.CutAfterCommand(proxyComStmtExecute, 1)
				l, err := f.c.TryAcquire(ctx, name, time.Minute)
				if err != nil {
					t.Fatalf("TryAcquire through a cut reply: %v", err)
				}
				f.wantRetried(t)
				if l.Fence() <= before {
					t.Fatalf("got fence %d, want above %d", l.Fence(), before)
				}
				f.wantHeldBy(t, l)
				if err := l.Release(ctx); err != nil {
					t.Fatalf("Release: %v", err)
				}
				f.wantFree(t, name, l.Fence())
			})
		}
	})
}

// The reply to a refresh is lost: the retry extends the same lease again,
// and the lease stays the holder's.
func TestFaults_cutAfterRefresh(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		f := newFaultEnv(t, e)
		ctx := testCtx(t)
		l := mustAcquire(t, f.c, "refresh", 5*time.Second)
		f.p.ResetCounts()
		f.p.CutAfterCommand(proxyComStmtExecute, 1)
		if err := l.Refresh(ctx, time.Minute); err != nil {
			t.Fatalf("Refresh through a cut reply: %v", err)
		}
		f.wantRetried(t)
		f.wantHeldBy(t, l)
		if got := inspect(t, f.witness, "refresh"); got.TTL < 50*time.Second {
			t.Fatalf("TTL after Refresh(1m): got %v, want about 1m", got.TTL)
		}
		if d := time.Until(l.ValidUntil()); d < 50*time.Second {
			t.Fatalf("ValidUntil is %v away, want about 1m", d)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
		f.wantFree(t, "refresh", l.Fence())
	})
}

// The reply to a release is lost after the row was deleted: the retry finds
// no row, and since the lease was certainly live when it was sent, Release
// reports success, not ErrNotHeld.
func TestFaults_cutAfterRelease(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		f := newFaultEnv(t, e)
		ctx := testCtx(t)
		l := mustAcquire(t, f.c, "release", time.Minute)
		f.p.ResetCounts()
		f.p.CutAfterCommand(proxyComStmtExecute, 1)
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release through a cut reply: %v", err)
		}
		f.wantRetried(t)
		if got := inspect(t, f.witness, "release"); got.Held {
			t.Fatalf("after Release: got %+v, want not held", got)
		}
		wantErrIs(t, l.Release(ctx), ErrNotHeld)
		f.wantFree(t, "release", l.Fence())
	})
}

// Every reply comes later than the lease lasts. The holder is told it
// acquired, but ValidUntil is already past when it is told, so it can know
// not to rely on it; the next holder gets a higher fence, and the late
// holder's Refresh and Release report the loss.
func TestFaults_latencyBeyondLease(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		f := newFaultEnv(t, e)
		ctx := testCtx(t)
		const ttl = 100 * time.Millisecond
		// Warm: prepared statements on a live connection, so the latency
		// falls on the statements alone.
		if err := mustAcquire(t, f.c, "slow", ttl).Release(ctx); err != nil {
			t.Fatal(err)
		}
		f.p.Latency(3 * ttl)
		l := mustAcquire(t, f.c, "slow", ttl)
		if now := time.Now(); !now.After(l.ValidUntil()) {
			t.Fatalf("ValidUntil %v after a reply slower than the lease, want it past (now %v)", l.ValidUntil(), now)
		}
		next := mustAcquire(t, f.witness, "slow", time.Minute)
		if next.Fence() <= l.Fence() {
			t.Fatalf("next holder's fence %d, want above the late holder's %d", next.Fence(), l.Fence())
		}
		wantErrIs(t, l.Refresh(ctx, time.Minute), ErrNotHeld)
		wantErrIs(t, l.Release(ctx), ErrNotHeld)
		f.p.Latency(0)
		if got := inspect(t, f.witness, "slow"); !got.Held || got.Fence != next.Fence() || got.Holder != "witness" {
			t.Fatalf("got %+v, want the next holder's lease untouched", got)
		}
	})
}

// The network stalls while the holder refreshes; its lease runs out and
// another holder takes the name. When the network heals, the held refresh
// reaches the server late: the token guard must keep it from touching the
// new lease, and the old holder must learn it lost.
func TestFaults_stallDuringRefresh(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		f := newFaultEnv(t, e)
		const ttl = 200 * time.Millisecond
		l := mustAcquire(t, f.c, "stall", ttl)
		f.p.Stall(true)
		ctx, cancel := context.WithTimeout(context.Background(), 2*ttl)
		err := l.Refresh(ctx, time.Minute)
		cancel()
		if err == nil || errors.Is(err, ErrNotHeld) {
			t.Fatalf("Refresh through a stall: got %v, want an error that is not ErrNotHeld", err)
		}
		if time.Now().Before(l.ValidUntil()) {
			t.Fatalf("ValidUntil %v is still ahead after a failed refresh outlived the lease", l.ValidUntil())
		}
		time.Sleep(ttl) // the lease has expired by the server's clock too
		next := mustAcquire(t, f.witness, "stall", time.Minute)
		f.p.Stall(false)
		time.Sleep(100 * time.Millisecond) // let the held refresh arrive
		wantErrIs(t, l.Refresh(testCtx(t), time.Minute), ErrNotHeld)
		wantErrIs(t, l.Release(testCtx(t)), ErrNotHeld)
		if got := inspect(t, f.witness, "stall"); !got.Held || got.Fence != next.Fence() || got.Holder != "witness" || got.TTL < 50*time.Second {
			t.Fatalf("got %+v, want the next holder's lease untouched", got)
		}
	})
}

// The network stalls during an acquire until the caller gives up. The
// caller holds nothing; whatever the held statement does when it arrives
// late, the name is free again within the lease, and fences still grow.
func TestFaults_stallDuringAcquire(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		f := newFaultEnv(t, e)
		const ttl = 300 * time.Millisecond
		if err := mustAcquire(t, f.c, "stall-acquire", ttl).Release(testCtx(t)); err != nil {
			t.Fatal(err)
		}
		before := inspect(t, f.witness, "stall-acquire").Fence
		f.p.Stall(true)
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		l, err := f.c.TryAcquire(ctx, "stall-acquire", ttl)
		cancel()
		if l != nil || !errors.Is(err, ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("TryAcquire through a stall: got %v, %v; want no lock, ErrNotAcquired and DeadlineExceeded", l, err)
		}
		f.p.Stall(false)
		// Within the lease of a late acquire the name is free again.
		deadline := time.Now().Add(10 * ttl)
		for {
			next, err := f.witness.TryAcquire(testCtx(t), "stall-acquire", time.Minute)
			if err == nil {
				if next.Fence() <= before {
					t.Fatalf("got fence %d, want above %d", next.Fence(), before)
				}
				break
			}
			wantErrIs(t, err, ErrNotAcquired)
			if time.Now().After(deadline) {
				t.Fatalf("name still held %v after the stall: %+v", 10*ttl, inspect(t, f.witness, "stall-acquire"))
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}

// killEnv is a Client whose pool holds one connection, so that the server's
// id of that connection is the Client's, and a direct connection to kill it.
type killEnv struct {
	c, witness *Client
	db, admin  *sql.DB
}

func newKillEnv(t *testing.T, e *testEnv) *killEnv {
	t.Helper()
	skipOnVitess(t, e, vitessNoKill)
	table := e.newTable(t)
	db := e.openDB(t)
	db.SetMaxOpenConns(1)
	return &killEnv{c: e.client(t, db, table, WithHolder("faulty")), witness: e.client(t, e.openDB(t), table, WithHolder("witness")), db: db, admin: e.openDB(t)}
}

// connID returns the server's id of the Client's one connection.
func (k *killEnv) connID(t *testing.T) int64 {
	t.Helper()
	var id int64
	if err := k.db.QueryRowContext(testCtx(t), "SELECT CONNECTION_ID()").Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

func (k *killEnv) kill(t *testing.T, id int64) {
	t.Helper()
	// MySQL takes no placeholder in KILL (error 6413: dynamic parameters
	// only in DML); MariaDB does. The id is a number read from the server.
	if _, err := k.admin.ExecContext(testCtx(t), fmt.Sprintf("KILL CONNECTION %d", id)); err != nil {
		t.Fatalf("KILL CONNECTION %d: %v", id, err)
	}
}

// blockRow holds the row lock on name's lease row in a transaction of its
// own until the returned function commits it, so that a statement on that
// row waits.
func (k *killEnv) blockRow(t *testing.T, table, name string) func() {
	t.Helper()
	ctx := testCtx(t)
	tx, err := k.admin.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+table+"` WHERE name = ? AND kind = 'L' FOR UPDATE", name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	commit := func() {
		once.Do(func() {
			if err := tx.Commit(); err != nil {
				t.Errorf("commit: %v", err)
			}
		})
	}
	t.Cleanup(commit)
	return commit
}

// waitRunning waits until connection id runs a statement on the server.
func (k *killEnv) waitRunning(t *testing.T, id int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := k.admin.QueryRowContext(testCtx(t), "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ? AND INFO IS NOT NULL", id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("connection %d ran no statement within 10s", id)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// KILL CONNECTION between operations: the next operation finds its
// connection gone and goes on, on a new one.
func TestFaults_killConnectionBetween(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		k := newKillEnv(t, e)
		ctx := testCtx(t)
		l := mustAcquire(t, k.c, "between", time.Minute)
		k.kill(t, k.connID(t))
		if err := l.Refresh(ctx, time.Minute); err != nil {
			t.Fatalf("Refresh after KILL CONNECTION: %v", err)
		}
		k.kill(t, k.connID(t))
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release after KILL CONNECTION: %v", err)
		}
		k.kill(t, k.connID(t))
		l2 := mustAcquire(t, k.c, "between", time.Minute)
		if l2.Fence() <= l.Fence() {
			t.Fatalf("got fence %d, want above %d", l2.Fence(), l.Fence())
		}
		if got := inspect(t, k.witness, "between"); !got.Held || got.Fence != l2.Fence() {
			t.Fatalf("got %+v, want held with fence %d", got, l2.Fence())
		}
	})
}

// KILL CONNECTION while each operation waits for the lease row's lock: the
// operation is retried on a new connection and gives the answer the killed
// attempt would have.
func TestFaults_killConnectionDuring(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		k := newKillEnv(t, e)
		table := k.c.table[1 : len(k.c.table)-1]
		ops := []struct {
			name string
			op   func(ctx context.Context, l *Lock) (*Lock, error)
		}{
			{"acquire", func(ctx context.Context, l *Lock) (*Lock, error) { return k.c.TryAcquire(ctx, "during", time.Minute) }},
			{"refresh", func(ctx context.Context, l *Lock) (*Lock, error) { return l, l.Refresh(ctx, 2*time.Minute) }},
			{"release", func(ctx context.Context, l *Lock) (*Lock, error) { return nil, l.Release(ctx) }},
		}
		// An expired lease for the acquire to take over, so that the row
		// exists for blockRow to lock.
		mustAcquire(t, k.witness, "during", time.Millisecond)
		time.Sleep(5 * time.Millisecond)
		var l *Lock
		for _, op := range ops {
			id := k.connID(t)
			commit := k.blockRow(t, table, "during")
			type result struct {
				l   *Lock
				err error
			}
			done := make(chan result, 1)
			go func() {
				l, err := op.op(testCtx(t), l)
				done <- result{l, err}
			}()
			k.waitRunning(t, id)
			k.kill(t, id)
			time.Sleep(50 * time.Millisecond) // the retry waits on the row too
			commit()
			r := <-done
			if r.err != nil {
				t.Fatalf("%s killed while it waited: %v", op.name, r.err)
			}
			l = r.l
			switch op.name {
			case "acquire", "refresh":
				if got := inspect(t, k.witness, "during"); !got.Held || got.Fence != l.Fence() || got.Holder != "faulty" {
					t.Fatalf("after %s: got %+v, want held by faulty with fence %d", op.name, got, l.Fence())
				}
			case "release":
				if got := inspect(t, k.witness, "during"); got.Held {
					t.Fatalf("after release: got %+v, want not held", got)
				}
			}
		}
	})
}

// restartEnv names the command that restarts the test server; the restart
// test runs only when it is set, so a user's server is never restarted
// unless they ask. .ci/run sets it to scripts/testdb restart SERVER, for one
// private server at a time.
const restartEnv = "SQLLOCK_TEST_RESTART_CMD"

func serverUptime(t *testing.T, db *sql.DB) int64 {
	t.Helper()
	var name string
	var up int64
	if err := db.QueryRowContext(testCtx(t), "SHOW GLOBAL STATUS LIKE 'Uptime'").Scan(&name, &up); err != nil {
		t.Fatalf("uptime: %v", err)
	}
	return up
}

func serverNow(t *testing.T, db *sql.DB) float64 {
	t.Helper()
	var now float64
	if err := db.QueryRowContext(testCtx(t), "SELECT UNIX_TIMESTAMP(NOW(6))").Scan(&now); err != nil {
		t.Fatalf("server clock: %v", err)
	}
	return now
}

// A serverStart is when the server started, by its own clock, in seconds,
// read as now minus Uptime. Uptime counts whole seconds, so a reading is
// up to a second late and two readings of one run of the server differ by
// a little over a second at most.
type serverStart float64

// startBeforeRestart reads when the server started, once it has been up for
// restartGap: then a restart after the reading moves the start on by more
// than restartGap less a second, which no second reading of the same run
// can (a server restarted a moment ago and again quickly can read the same
// Uptime both times, so Uptime alone cannot tell).
func startBeforeRestart(t *testing.T, db *sql.DB) serverStart {
	t.Helper()
	for serverUptime(t, db) < restartGap {
		time.Sleep(200 * time.Millisecond)
	}
	// The clock first, Uptime second: the reading is not early.
	now := serverNow(t, db)
	return serverStart(now - float64(serverUptime(t, db)))
}

const restartGap = 4

// wantRestarted fails the test unless the server started again after
// before was read.
func wantRestarted(t *testing.T, db *sql.DB, before serverStart) {
	t.Helper()
	// Uptime first, the clock second: the reading is not early.
	up := serverUptime(t, db)
	after := serverStart(serverNow(t, db) - float64(up))
	t.Logf("server started at %.1f before the restart, %.1f after (up %ds)", float64(before), float64(after), up)
	if after-before < restartGap/2 {
		t.Fatalf("the server's start moved by %.1fs across the restart (up %ds now): it did not restart", float64(after-before), up)
	}
}

// The server restarts while a holder keeps its lease and a worker acquires
// and releases. Afterwards the library goes on without help: the held
// lease refreshes, every lock a caller believes held is held on the server,
// every release ends, and fences keep growing.
func TestFaults_serverRestart(t *testing.T) {
	cmd := os.Getenv(restartEnv)
	if cmd == "" {
		t.Skipf("set %s to a command that restarts the test server (as .ci/run does with scripts/testdb restart SERVER) to run this test", restartEnv)
	}
	soleServer(t, "restarts the server with "+restartEnv)
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		c := e.client(t, e.openDB(t), table, WithHolder("survivor"))
		witness := e.client(t, e.openDB(t), table, WithHolder("witness"))
		held := mustAcquire(t, c, "held", time.Minute)
		// An acquire cut by the restart whose clean-up failed too leaves a
		// lease nobody holds; it lasts workerTTL.
		const workerTTL = 10 * time.Second

		ctx, stop := context.WithCancel(testCtx(t))
		var (
			fences   []uint64
			workErrs []error
			wg       sync.WaitGroup
		)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				l, err := c.TryAcquire(ctx, "worker", workerTTL)
				if err != nil {
					time.Sleep(20 * time.Millisecond) // the server is away
					continue
				}
				fences = append(fences, l.Fence())
				for {
					err := l.Release(context.WithoutCancel(ctx))
					if err == nil {
						break
					}
					if errors.Is(err, ErrNotHeld) {
						workErrs = append(workErrs, err)
						break
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
		}()

		time.Sleep(300 * time.Millisecond)
		before := startBeforeRestart(t, e.db)
		t.Logf("restarting the server with %s", cmd)
		restart := exec.Command("sh", "-c", cmd)
		if out, err := restart.CombinedOutput(); err != nil {
			stop()
			wg.Wait()
			t.Fatalf("%s: %v\n%s", cmd, err, out)
		}
		time.Sleep(300 * time.Millisecond)
		stop()
		wg.Wait()
		t.Logf("the worker acquired %d times", len(fences))
		wantRestarted(t, e.db, before)

		if err := held.Refresh(testCtx(t), time.Minute); err != nil {
			t.Fatalf("Refresh after the restart: %v", err)
		}
		if got := inspect(t, witness, "held"); !got.Held || got.Fence != held.Fence() {
			t.Fatalf("after the restart: got %+v, want held with fence %d", got, held.Fence())
		}
		if len(workErrs) > 0 {
			t.Fatalf("worker releases: %v", workErrs)
		}
		if len(fences) < 2 {
			t.Fatalf("the worker acquired %d times, want some before and after the restart", len(fences))
		}
		for i := 1; i < len(fences); i++ {
			if fences[i] <= fences[i-1] {
				t.Fatalf("fence %d after %d, want fences increasing", fences[i], fences[i-1])
			}
		}
		// Every release ended, so the name is free, or held at most for
		// workerTTL by an acquire whose outcome the restart hid.
		wctx, cancel := context.WithTimeout(testCtx(t), 3*workerTTL)
		defer cancel()
		next, err := witness.Acquire(wctx, "worker", time.Minute)
		if err != nil {
			t.Fatalf("witness Acquire after the restart: %v", err)
		}
		if next.Fence() <= fences[len(fences)-1] {
			t.Fatalf("fence after the restart %d, want above %d", next.Fence(), fences[len(fences)-1])
		}
		if err := held.Release(testCtx(t)); err != nil {
			t.Fatalf("Release after the restart: %v", err)
		}
	})
}
