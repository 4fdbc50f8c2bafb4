package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock/internal/fault"
)

// ownServerEnv, when set, says the test server is the tests' own: tests may
// change its global variables and accounts (a read-only server, a full
// one). Never set it for a shared server.
const ownServerEnv = "SQLLOCK_TEST_OWN_SERVER"

// closedAddr returns a loopback address where nothing listens.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// classifyCase is an error a real server gave, and the class it must have.
type classifyCase struct {
	name string
	err  func(t *testing.T, e *testEnv) error
	want fault.Outcome
}

var outcomeNames = map[fault.Outcome]string{fault.Final: "final", fault.RolledBack: "rolled back", fault.Refused: "refused", fault.Unknown: "unknown"}

// Each error the server gives here is classified as the loops need: final
// ones end them, the others are retried or waited out.
func TestClassify_realServerErrors(t *testing.T) {
	if os.Getenv(ownServerEnv) != "" {
		soleServer(t, "makes the server read-only and full under "+ownServerEnv)
	}
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		cases := []classifyCase{
			{"no server listening", func(t *testing.T, e *testEnv) error {
				db := e.openDBWith(t, func(c *mysql.Config) { c.Addr = closedAddr(t) })
				_, err := e.client(t, db, "sqllock").TryAcquire(testCtx(t), "job", time.Second)
				return err
			}, fault.Refused},
			{"read-only transaction", func(t *testing.T, e *testEnv) error {
				if e.server.TiDB {
					t.Skip("TiDB has no read-only transactions: transaction_read_only is a no-op function it refuses (1235)")
				}
				skipOnVitess(t, e, vitessNoReadOnly)
				v := "transaction_read_only"
				if e.server.MariaDB {
					v = "tx_read_only" // MariaDB 10.11's name
				}
				table := e.newTable(t)
				db := e.openDBWith(t, func(c *mysql.Config) { setParam(c, v, "1") })
				_, err := e.client(t, db, table).TryAcquire(testCtx(t), "job", time.Second)
				return wantErrno(t, err, 1792)
			}, fault.Refused},
			{"no such table", func(t *testing.T, e *testEnv) error {
				_, err := e.client(t, e.db, "sqllock_no_such_table").TryAcquire(testCtx(t), "job", time.Second)
				return wantErrno(t, err, e.noSuchTable())
			}, fault.Final},
			{"access denied", func(t *testing.T, e *testEnv) error {
				skipOnVitess(t, e, vitessNoAuth)
				db := e.openDBWith(t, func(c *mysql.Config) { c.User, c.Passwd = "sqllock_no_such_user", "wrong" })
				_, err := e.client(t, db, "sqllock").TryAcquire(testCtx(t), "job", time.Second)
				return wantErrno(t, err, 1045)
			}, fault.Final},
			{"statement time limit", statementTimeLimit, fault.RolledBack},
			{"connection killed while a statement runs", func(t *testing.T, e *testEnv) error {
				skipOnVitess(t, e, vitessNoKill)
				ctx := testCtx(t)
				conn, err := e.db.Conn(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close()
				var id int64
				if err := conn.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id); err != nil {
					t.Fatal(err)
				}
				time.AfterFunc(200*time.Millisecond, func() {
					_, _ = e.openDB(t).Exec(fmt.Sprintf("KILL CONNECTION %d", id))
				})
				var n int
				return conn.QueryRowContext(ctx, "SELECT SLEEP(10)").Scan(&n)
			}, fault.Unknown},
			{"idle session closed by the server", func(t *testing.T, e *testEnv) error {
				skipOnVitess(t, e, vitessNoIdleKill)
				ctx := testCtx(t)
				conn, err := e.db.Conn(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close()
				if _, err := conn.ExecContext(ctx, "SET SESSION wait_timeout = 1"); err != nil {
					t.Fatal(err)
				}
				time.Sleep(2500 * time.Millisecond)
				_, err = conn.ExecContext(ctx, "DO 1")
				return err
			}, fault.Unknown},
		}
		if os.Getenv(ownServerEnv) != "" {
			cases = append(cases, ownServerCases...)
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				err := tc.err(t, e)
				if err == nil {
					t.Fatalf("got no error, want one")
				}
				t.Logf("%s gave: %v", e.server.Label, err)
				if got := classify(err); got != tc.want {
					t.Errorf("classify(%v): got %s, want %s", err, outcomeNames[got], outcomeNames[tc.want])
				}
			})
		}
	})
}

// wantErrno fails the test unless err carries server error n, and returns
// err.
func wantErrno(t *testing.T, err error, n int) error {
	t.Helper()
	if got, ok := fault.Errno(err); !ok || got != n {
		t.Fatalf("got %v, want server error %d", err, n)
	}
	return err
}

// statementTimeLimit makes the server end a statement for its time limit:
// MariaDB's max_statement_time (1969), MySQL's max_execution_time, which
// ends only SELECTs (3024).
func statementTimeLimit(t *testing.T, e *testEnv) error {
	if e.server.TiDB {
		// Twice in one day, under CI's load, TiDB let this query run past
		// the test's minute. The errno is MySQL's, and classify reads only
		// the errno: MySQL 9.7 proves it.
		t.Skip("TiDB's MAX_EXECUTION_TIME does not always interrupt this query in time; 3024 is proven on MySQL")
	}
	const heavy = "SELECT COUNT(*) FROM information_schema.COLUMNS a, information_schema.COLUMNS b, information_schema.COLUMNS c"
	q, errno := "SELECT /*+ MAX_EXECUTION_TIME(20) */"+heavy[len("SELECT"):], 3024
	if e.server.MariaDB {
		q, errno = "SET STATEMENT max_statement_time = 0.02 FOR "+heavy, 1969
	}
	var n int64
	return wantErrno(t, e.db.QueryRowContext(testCtx(t), q).Scan(&n), errno)
}

// ownServerCases change the server's global variables: only on the tests'
// own server.
var ownServerCases = []classifyCase{
	{"read-only server", func(t *testing.T, e *testEnv) error {
		table := e.newTable(t)
		db := limitedUser(t, e, table)
		setGlobal(t, e, "read_only", "ON", "OFF")
		// The server's own refusal, which the first use's proof would
		// find first (TestClient_firstUse_refusesReadOnlyServer).
		c := e.client(t, db, table)
		c.markProven()
		_, err := c.TryAcquire(testCtx(t), "job", time.Second)
		return wantErrno(t, err, 1290)
	}, fault.Refused},
	{"too many connections", func(t *testing.T, e *testEnv) error {
		table := e.newTable(t)
		db := limitedUser(t, e, table)
		// MariaDB's least max_connections is 10: hold that many open, so
		// that the next login of an account without administrative
		// privileges is refused.
		setGlobal(t, e, "max_connections", "10", "151")
		for {
			var (
				name string
				n    int
			)
			if err := e.db.QueryRow("SHOW GLOBAL STATUS LIKE 'Threads_connected'").Scan(&name, &n); err != nil {
				t.Fatal(err)
			}
			if n >= 10 {
				break
			}
			conn, err := e.db.Conn(testCtx(t))
			if err != nil {
				t.Fatal(err)
			}
			if err := conn.PingContext(testCtx(t)); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { conn.Close() })
		}
		_, err := e.client(t, db, table).TryAcquire(testCtx(t), "job", time.Second)
		return wantErrno(t, err, 1040)
	}, fault.Refused},
}

// limitedUser returns a *sql.DB for an account with the privileges sqllock
// needs on table and no administrative ones, dropped when the test ends.
func limitedUser(t *testing.T, e *testEnv, table string) *sql.DB {
	t.Helper()
	// Every host form, so that no anonymous account of a fresh install
	// matches first.
	for _, host := range []string{"'%'", "'localhost'", "'127.0.0.1'"} {
		user := "sqllock_app@" + host
		for _, q := range []string{
			"DROP USER IF EXISTS " + user,
			"CREATE USER " + user + " IDENTIFIED BY 'app'",
			"GRANT SELECT, INSERT, UPDATE, DELETE ON `" + table + "` TO " + user,
		} {
			if _, err := e.db.Exec(q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		t.Cleanup(func() { _, _ = e.db.Exec("DROP USER IF EXISTS " + user) })
	}
	return e.openDBWith(t, func(c *mysql.Config) { c.User, c.Passwd = "sqllock_app", "app" })
}

// setGlobal sets a global variable of the tests' own server, and sets it
// back to undo when the test ends.
func setGlobal(t *testing.T, e *testEnv, name, value, undo string) {
	t.Helper()
	if _, err := e.db.Exec("SET GLOBAL " + name + " = " + value); err != nil {
		t.Fatalf("SET GLOBAL %s: %v", name, err)
	}
	t.Cleanup(func() {
		if _, err := e.db.Exec("SET GLOBAL " + name + " = " + undo); err != nil {
			t.Errorf("SET GLOBAL %s back: %v", name, err)
		}
	})
}

// Elect whose server is down the whole time returns its context's error
// wrapping the last error it met: the caller learns why it never led.
func TestElect_serverDown_returnsLastError(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		db := e.openDBWith(t, func(c *mysql.Config) { c.Addr = closedAddr(t) })
		c := e.client(t, db, "sqllock")
		ctx, cancel := context.WithTimeout(testCtx(t), 2*time.Second)
		defer cancel()
		err := c.Elect(ctx, "leader", time.Second, Callbacks{OnStartedLeading: func(_ context.Context, _ *Lock) error { return nil }})
		if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("Elect with no server: got %v, want DeadlineExceeded wrapping the refused connection", err)
		}
	})
}

// A candidate whose server is read-only (a replica during a failover) keeps
// campaigning, and leads once the server takes writes: on the tests' own
// server, which may be made read-only.
func TestClient_Elect_readOnlyServer_leadsAfter(t *testing.T) {
	if os.Getenv(ownServerEnv) == "" {
		t.Skipf("set %s when the test server is the tests' own, to make it read-only", ownServerEnv)
	}
	soleServer(t, "makes the server read-only under "+ownServerEnv)
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		c := e.client(t, limitedUser(t, e, table), table)
		setGlobal(t, e, "read_only", "ON", "OFF")
		ctx, cancel := context.WithCancel(testCtx(t))
		defer cancel()
		led := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- c.Elect(ctx, "leader", 200*time.Millisecond, Callbacks{
				OnStartedLeading: func(_ context.Context, _ *Lock) error { close(led); return nil },
			})
		}()
		time.Sleep(500 * time.Millisecond) // several refused attempts
		select {
		case <-led:
			t.Fatalf("led while the server was read-only")
		case err := <-done:
			t.Fatalf("Elect returned while the server was read-only: %v", err)
		default:
		}
		if _, err := e.db.Exec("SET GLOBAL read_only = OFF"); err != nil {
			t.Fatal(err)
		}
		select {
		case <-led:
		case err := <-done:
			t.Fatalf("Elect returned instead of leading: %v", err)
		case <-time.After(10 * time.Second):
			t.Fatalf("no lead 10s after the server took writes again")
		}
		cancel()
		wantErrIs(t, <-done, context.Canceled)
	})
}

// MariaDB's snapshot isolation (innodb_snapshot_isolation, ON by default from
// 11.6) under SERIALIZABLE refuses an acquire whose lease row another
// transaction changed while the acquire waited for it: Error 1020, "Record
// has changed since last read". The statement was rolled back, so the
// acquire is sent again with its token and takes the lease.
func TestClient_TryAcquire_recordChanged_retried(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		if !e.server.MariaDB {
			t.Skip("innodb_snapshot_isolation is MariaDB's")
		}
		var on int
		if err := e.db.QueryRow("SELECT @@innodb_snapshot_isolation").Scan(&on); err != nil {
			t.Skipf("this MariaDB has no innodb_snapshot_isolation (10.6.18, 10.11.8 and later do): %v", err)
		}
		table := e.newTable(t)
		db := e.openDBWith(t, func(c *mysql.Config) {
			setParam(c, "innodb_snapshot_isolation", "ON")
			setParam(c, "tx_isolation", "'SERIALIZABLE'")
		})
		db.SetMaxOpenConns(1)
		c := e.client(t, db, table, WithHolder("serializable"))
		witness := e.client(t, e.openDB(t), table, WithHolder("witness"))
		// An expired lease for the acquire to take over; the statements are
		// prepared first, so that the acquire's one connection is known.
		mustAcquire(t, witness, "job", time.Millisecond)
		mustAcquire(t, c, "warm", time.Minute)
		var id int64
		if err := db.QueryRow("SELECT CONNECTION_ID()").Scan(&id); err != nil {
			t.Fatal(err)
		}

		// Another transaction locks the lease row and changes it while the
		// acquire waits for it.
		k := &killEnv{admin: e.openDB(t)}
		ctx := testCtx(t)
		tx, err := k.admin.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, "UPDATE `"+table+"` SET expires_at = expires_at - INTERVAL 1 SECOND WHERE name = 'job' AND kind = 'L'"); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			l, err := c.TryAcquire(ctx, "job", time.Minute)
			if err == nil && l.Fence() == 0 {
				err = errors.New("no fence")
			}
			done <- err
		}()
		k.waitRunning(t, id)
		time.Sleep(50 * time.Millisecond) // waiting for the row lock
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("TryAcquire after the row changed under it: got %v, want the lease", err)
		}
		if got := inspect(t, witness, "job"); !got.Held || got.Holder != "serializable" {
			t.Fatalf("after the acquire: got %+v, want held by serializable", got)
		}
	})
}

// Acquire waits out an outage: while no connection to the server can be
// made, each attempt fails with an error that may pass, and the call goes
// on polling until the server answers again.
func TestClient_Acquire_waitsOutAnOutage(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		f := newFaultEnv(t, e)
		ctx := testCtx(t)
		// Prepared on a live connection, which the outage then breaks.
		warm := mustAcquire(t, f.c, "job", time.Minute)
		if err := warm.Release(ctx); err != nil {
			t.Fatal(err)
		}
		f.p.Refuse(true)
		f.p.CutAll()
		done := make(chan error, 1)
		go func() {
			l, err := f.c.Acquire(ctx, "job", time.Minute)
			if err == nil {
				err = l.Release(ctx)
			}
			done <- err
		}()
		time.Sleep(500 * time.Millisecond) // several attempts, refused
		select {
		case err := <-done:
			t.Fatalf("Acquire returned during the outage: %v", err)
		default:
		}
		f.p.Refuse(false)
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("Acquire after the outage: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("Acquire still waiting 10s after the outage ended")
		}
	})
}
