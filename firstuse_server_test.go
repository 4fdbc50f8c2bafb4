package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"log/slog"
	"sync"

	"github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock/internal/fault"
)

// gmsEnv names the DSN of a go-mysql-server (scripts/gms up; scripts/gms
// dsn), which TestClient_firstUse_refusesGoMySQLServer holds a Client to.
const gmsEnv = "SQLLOCK_TEST_GMS_DSN"

// go-mysql-server's in-memory engine runs each statement as MySQL does
// alone, and not together: a Client refuses it at its first use, naming
// what failed, before any lease is taken.
func TestClient_firstUse_refusesGoMySQLServer(t *testing.T) {
	dsn := os.Getenv(gmsEnv)
	if dsn == "" {
		t.Skipf("set %s to a go-mysql-server's DSN (scripts/gms up; scripts/gms dsn)", gmsEnv)
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	table := fmt.Sprintf("tgms_%d", time.Now().UnixNano())
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS `" + table + "`") })
	c, err := New(db, WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx := testCtx(t)
	err = c.CreateTable(ctx)
	t.Logf("CreateTable: %v", err)
	wantErrIs(t, err, ErrUnsupportedServer)
	if strings.Contains(err.Error(), "no rows in result set") || errors.Is(err, ErrBadTable) {
		t.Errorf("CreateTable: got %v, want an error naming what the server failed to do", err)
	}
	_, err = c.TryAcquire(ctx, "job", time.Minute)
	t.Logf("TryAcquire: %v", err)
	wantErrIs(t, err, ErrUnsupportedServer)
	// It calls itself MySQL 8.0.31; the proof of the statements finds a
	// refresh by the owner of a live lease reporting nothing extended
	// (internal/engine/prover.go), before the row lock's proof.
	assertErrContains(t, err, "statement refresh: a refresh by the owner of a live lease reported 0")
}

// A read-only server is refused before any write, even for an account that
// could write there (root: SUPER, or MariaDB's READ ONLY ADMIN), with an
// error that says so and that the waiting calls pass over as they pass
// over the server's own refusal; once writable, the next call proves and
// acquires. On the tests' own server, which may be made read-only.
func TestClient_firstUse_refusesReadOnlyServer(t *testing.T) {
	if os.Getenv(ownServerEnv) == "" {
		t.Skipf("set %s when the test server is the tests' own, to make it read-only", ownServerEnv)
	}
	soleServer(t, "makes the server read-only under "+ownServerEnv)
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		if e.server.TiDB || e.server.Vitess {
			t.Skipf("%s: its read-only settings refuse every account, and the proof does not ask them", e.server.Label)
		}
		table := e.newTable(t)
		setGlobal(t, e, "read_only", "ON", "OFF")
		c := e.client(t, e.db, table)
		ctx := testCtx(t)
		_, err := c.TryAcquire(ctx, "job", time.Minute)
		if !errors.Is(err, errReadOnlyServer) || errors.Is(err, ErrUnsupportedServer) || !passable(err) || classify(err) != fault.Refused {
			t.Fatalf("TryAcquire on a read-only server as root: got %v, want the read-only refusal, passable", err)
		}
		assertErrContains(t, err, "read-only (@@read_only = 1)")
		if n := e.proofRows(t, table); n != 0 {
			t.Errorf("%d proof rows written on a read-only server, want 0", n)
		}
		short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		_, err = c.Acquire(short, "job", time.Minute)
		if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, errReadOnlyServer) {
			t.Errorf("Acquire on a read-only server: got %v, want its deadline wrapping the read-only refusal", err)
		}
		if _, err := e.db.Exec("SET GLOBAL read_only = OFF"); err != nil {
			t.Fatal(err)
		}
		l := mustAcquire(t, c, "job", time.Minute)
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// roundRobin is a TCP balancer on loopback that sends each new connection
// to the next of its backends in turn, as a load balancer over several
// primaries does.
func roundRobin(t *testing.T, backends ...string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for i := 0; ; i++ {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", backends[i%len(backends)])
			if err != nil {
				client.Close()
				continue
			}
			go func() { _, _ = io.Copy(server, client); server.Close() }()
			go func() { _, _ = io.Copy(client, server); client.Close() }()
		}
	}()
	return ln.Addr().String()
}

// A pool whose connections reach two servers (a round-robin balancer over
// two primaries) is refused at first use, naming both servers: each would
// keep leases of its own, and two Clients could both hold one name.
func TestClient_firstUse_refusesTwoServers(t *testing.T) {
	envs, table, db := balancedPool(t)
	c := envs[0].client(t, db, table)
	_, err := c.TryAcquire(testCtx(t), "job", time.Minute)
	t.Logf("TryAcquire through the balancer: %v", err)
	wantTwoServers(t, err, envs)
}

// balancedPool returns two servers' environments, a table of the test's
// own on both, and a pool whose connections go to them in turn through a
// round-robin balancer. It skips unless there are two such servers.
func balancedPool(t *testing.T) (envs []*testEnv, table string, db *sql.DB) {
	t.Helper()
	requireServers(t)
	// Two MariaDB servers if there are, which tell themselves apart by
	// host, port and datadir alone; else MariaDB and MySQL, or two MySQL.
	servers := slices.Clone(testServers)
	slices.SortStableFunc(servers, func(a, b testServer) int {
		if a.MariaDB == b.MariaDB {
			return 0
		} else if a.MariaDB {
			return -1
		}
		return 1
	})
	for _, s := range servers {
		if s.Err == nil && !s.Fake && !s.TiDB && !s.Vitess && len(envs) < 2 {
			envs = append(envs, newEnv(t, s, variants[0]))
		}
	}
	if len(envs) < 2 {
		t.Skipf("%s names fewer than two MySQL or MariaDB servers, which the balancer needs", dsnEnv)
	}
	table = envs[0].newTable(t)
	if _, err := envs[1].db.Exec(strings.ReplaceAll(schema, "`sqllock`", "`"+table+"`")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = envs[1].db.Exec("DROP TABLE IF EXISTS `" + table + "`") })
	addr := roundRobin(t, envs[0].serverAddr(t), envs[1].serverAddr(t))
	db = sql.OpenDB(envs[0].quietConnector(t, func(c *mysql.Config) { c.Addr = addr }))
	t.Cleanup(func() { db.Close() })
	return envs, table, db
}

// wantTwoServers fails t unless err refuses a pool whose connections reach
// the servers of envs, naming each.
func wantTwoServers(t *testing.T, err error, envs []*testEnv) {
	t.Helper()
	wantErrIs(t, err, ErrUnsupportedServer)
	assertErrContains(t, err, "the pool's connections reach different servers")
	for _, e := range envs {
		if e.server.MariaDB != envs[0].server.MariaDB {
			assertErrContains(t, err, e.server.Version)
		} else if e.server.MariaDB {
			var port string
			if err := e.db.QueryRow("SELECT @@port").Scan(&port); err != nil {
				t.Fatal(err)
			}
			assertErrContains(t, err, " "+port+" ")
		} else {
			var uuid string
			if err := e.db.QueryRow("SELECT @@server_uuid").Scan(&uuid); err != nil {
				t.Fatal(err)
			}
			assertErrContains(t, err, uuid)
		}
	}
}

// warmPool opens n connections of db and puts them back idle, so that
// what follows finds them there instead of dialling.
func warmPool(t *testing.T, db *sql.DB, n int) {
	t.Helper()
	db.SetMaxIdleConns(n)
	ctx := testCtx(t)
	conns := make([]*sql.Conn, n)
	for i := range conns {
		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = conn
	}
	for _, conn := range conns {
		conn.Close()
	}
}

// notProven returns the log records that say what the first use could
// not prove for want of connections.
func notProven(rec *recorder) []string {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var out []string
	for _, r := range rec.recs {
		if r.Level >= slog.LevelInfo && attr(r, "not_proven") != "" {
			out = append(out, r.Level.String()+" "+r.Message)
		}
	}
	return out
}

// A caller that holds a connection of a small pool in a transaction of its
// own when the Client's first use comes gets a Lock within its context, or,
// when it holds the pool's only connection, its context's end: the first
// use takes a connection beyond its first only when the pool has one to
// spare. What it could not prove without one it says in one log line, and
// a later acquire proves it, once the pool has two connections free. No
// proof row is left.
func TestClient_firstUse_callerHoldsAConnection(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipFakeFor(t, e, "it holds the caller's connection in a transaction of plain SQL")
		table := e.newTable(t)
		for _, limit := range []int{1, 2, 4} {
			t.Run(fmt.Sprintf("MaxOpenConns=%d", limit), func(t *testing.T) {
				db := e.openDB(t)
				db.SetMaxOpenConns(limit)
				warmPool(t, db, limit)
				rec, opt := newRecorder()
				c := e.client(t, db, table, opt)
				ctx, cancel := context.WithTimeout(testCtx(t), 30*time.Second)
				defer cancel()
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback()
				if _, err := tx.ExecContext(ctx, "SELECT 1"); err != nil {
					t.Fatal(err)
				}
				name := "job"
				if limit == 1 {
					// Nothing can run while the caller holds the only
					// connection: the call ends with the caller's context.
					short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
					defer cancel()
					_, err := c.TryAcquire(short, name, time.Minute)
					t.Logf("TryAcquire with the pool's only connection held: %v", err)
					if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ErrNotAcquired) {
						t.Fatalf("TryAcquire: got %v, want the caller's deadline and ErrNotAcquired", err)
					}
					assertErrContains(t, err, "every connection of the pool was in use, at its limit SetMaxOpenConns(1)")
				} else {
					l, err := c.TryAcquire(ctx, name, time.Minute)
					if err != nil {
						t.Fatalf("TryAcquire with one of %d connections held by the caller: got %v, want a Lock", limit, err)
					}
					if err := l.Release(ctx); err != nil {
						t.Fatal(err)
					}
				}
				switch got := notProven(rec); {
				case limit == 2 && len(got) != 1:
					t.Errorf("log: got %q, want one line saying what was not proven", got)
				case limit != 2 && len(got) != 0:
					t.Errorf("log: got %q, want none before the first use has run", got)
				}
				if err := tx.Rollback(); err != nil {
					t.Fatal(err)
				}
				// The caller's transaction has ended: what the first use
				// could not prove, a later acquire does.
				for range 2 {
					if err := mustAcquire(t, c, name, time.Minute).Release(ctx); err != nil {
						t.Fatal(err)
					}
				}
				got := notProven(rec)
				if len(got) > 1 {
					t.Errorf("log: got %q, want one line at the most", got)
				}
				if pending := c.eng.PoolProofPending(); pending != (limit == 1) {
					t.Errorf("after the caller's transaction: proof pending %v, want %v", pending, limit == 1)
				}
				if limit == 1 && len(got) != 1 {
					t.Errorf("log: got %q, want one line: a pool of one cannot prove the row lock", got)
				}
				if n := e.proofRows(t, table); n != 0 {
					t.Errorf("%d proof rows left, want 0", n)
				}
				if s := db.Stats(); s.InUse != 0 {
					t.Errorf("%d connections in use after the calls, want 0", s.InUse)
				}
			})
		}
	})
}

// A pool over two servers whose first use found no connection to spare
// beside the one the caller held is refused by the first acquire that
// finds two free, naming both servers, and then by every acquire, also
// while the pool has none to spare again.
func TestClient_firstUse_twoServersProvenLater(t *testing.T) {
	envs, table, db := balancedPool(t)
	db.SetMaxOpenConns(2)
	rec, opt := newRecorder()
	c := envs[0].client(t, db, table, opt)
	ctx := testCtx(t)
	tx, err := db.BeginTx(ctx, nil) // the first connection: the first server
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	l, err := c.TryAcquire(ctx, "job", time.Minute) // on the second server
	if err != nil {
		t.Fatalf("TryAcquire beside the caller's transaction: got %v, want a Lock", err)
	}
	if got := notProven(rec); len(got) != 1 {
		t.Errorf("log: got %q, want one line saying what was not proven", got)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	_, err = c.TryAcquire(ctx, "other", time.Minute)
	t.Logf("TryAcquire with two connections free: %v", err)
	wantTwoServers(t, err, envs)
	_ = l.Release(ctx) // on either server: the other may answer that it holds no such lease
	if tx, err = db.BeginTx(ctx, nil); err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	_, err = c.TryAcquire(ctx, "other", time.Minute)
	t.Logf("TryAcquire with one connection free: %v", err)
	wantTwoServers(t, err, envs)
	for _, e := range envs {
		if n := e.proofRows(t, table); n != 0 {
			t.Errorf("%s: %d proof rows left, want 0", e.server.Label, n)
		}
	}
}

// The first use of a Client on a small pool that other goroutines use
// without pause, while the caller holds a connection in a transaction,
// gets a Lock and leaves no proof row: a connection the pool's counts said
// was free but another goroutine took first holds it up only for a bound.
func TestClient_firstUse_busyPool(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipFakeFor(t, e, "it counts the proof's rows with plain SQL")
		table := e.newTable(t)
		db := e.openDB(t)
		db.SetMaxOpenConns(4)
		ctx, cancel := context.WithCancel(testCtx(t))
		defer cancel()
		var wg sync.WaitGroup
		defer wg.Wait()
		defer cancel()
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					_, _ = db.ExecContext(ctx, "DO 1")
				}
			}()
		}
		for i := range 3 {
			c := e.client(t, db, table)
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			l, err := c.TryAcquire(ctx, fmt.Sprint("job", i), time.Minute)
			if err != nil {
				t.Fatalf("TryAcquire on a busy pool: got %v, want a Lock", err)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			_ = tx.Rollback()
		}
		if n := e.proofRows(t, table); n != 0 {
			t.Errorf("%d proof rows left, want 0", n)
		}
	})
}

// oneConnDB opens a pool of one connection on the environment's DSN changed
// by f, so that a session setting the test makes through it is the session
// every statement of a Client on it runs in, as a setting on a connection of
// an application's pool is for the statements that get that connection.
func oneConnDB(t *testing.T, e *testEnv, f func(*mysql.Config)) *sql.DB {
	t.Helper()
	db := sql.OpenDB(e.quietConnector(t, f))
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	return db
}

// wantGuard fails t unless err is the session guard's refusal naming what.
func wantGuard(t *testing.T, op string, err error, what string) {
	t.Helper()
	switch {
	case err == nil:
		t.Fatalf("%s: got no error, want the session guard's refusal naming %s", op, what)
	case !strings.Contains(err.Error(), what):
		t.Fatalf("%s: got %v, want an error naming %s", op, err, what)
	case !passable(err):
		t.Fatalf("%s: got a final error %v, want a refusal that may pass", op, err)
	}
}

// wantFree fails t unless name is free, as read by c on a connection of its
// own pool: a refused statement wrote nothing.
func wantFree(t *testing.T, c *Client, name string) {
	t.Helper()
	info, err := c.Inspect(testCtx(t), name)
	if err != nil {
		t.Fatalf("Inspect(%q): %v", name, err)
	}
	if info.Held {
		t.Fatalf("%q is held by %q after a refused statement, want it free", name, info.Holder)
	}
}

// A session timestamp set on a connection of the Client's pool after its
// first use (SET timestamp, as tests and replays do) gives the session a
// clock of its own: without the guard, an hour behind made an acquire write a
// lease that had ended an hour before, and an hour ahead took over another
// owner's live lease. Every statement that takes or extends a lease refuses.
func TestSessionGuard_timestamp(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipOnVitess(t, e, vitessNoTimestamp)
		ctx := testCtx(t)
		table := e.newTable(t)
		other := e.client(t, e.db, table)
		db := oneConnDB(t, e, func(*mysql.Config) {})
		c := e.client(t, db, table)
		held, err := c.TryAcquire(ctx, "held", time.Minute) // the first use, on a plain session
		if err != nil {
			t.Fatalf("TryAcquire: %v", err)
		}
		theirs, err := other.TryAcquire(ctx, "theirs", time.Minute)
		if err != nil {
			t.Fatalf("other TryAcquire: %v", err)
		}
		defer theirs.Release(ctx)

		for _, shift := range []string{"- 3600", "+ 3600"} {
			if _, err := db.ExecContext(ctx, "SET timestamp = UNIX_TIMESTAMP(SYSDATE()) "+shift); err != nil {
				t.Fatal(err)
			}
			_, err := c.TryAcquire(ctx, "free", time.Minute)
			wantGuard(t, "TryAcquire, timestamp "+shift, err, "session timestamp")
			wantFree(t, other, "free")
			_, err = c.TryAcquire(ctx, "theirs", time.Minute)
			wantGuard(t, "TryAcquire of a held name, timestamp "+shift, err, "session timestamp")
			err = held.Refresh(ctx, time.Minute)
			wantGuard(t, "Refresh, timestamp "+shift, err, "session timestamp")
			if !e.oneRow() {
				_, err = c.TryAcquireSet(ctx, []string{"set1", "set2"}, time.Minute)
				wantGuard(t, "TryAcquireSet, timestamp "+shift, err, "session timestamp")
				wantFree(t, other, "set1")
				_, err = c.Semaphore("sem", 2).TryAcquire(ctx, time.Minute)
				wantGuard(t, "Semaphore.TryAcquire, timestamp "+shift, err, "session timestamp")
			}
		}
		if _, err := db.ExecContext(ctx, "SET timestamp = DEFAULT"); err != nil {
			t.Fatal(err)
		}
		if err := held.Refresh(ctx, time.Minute); err != nil {
			t.Fatalf("Refresh with the server's clock again: %v", err)
		}
		if err := held.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
	})
}

// A DSN's timestamp=... is a SET that go-sql-driver/mysql sends on every
// connection it opens: the Client refuses from its first use, and takes
// nothing.
func TestSessionGuard_timestampDSN(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipOnVitess(t, e, vitessNoTimestamp)
		ctx := testCtx(t)
		table := e.newTable(t)
		other := e.client(t, e.db, table)
		db := oneConnDB(t, e, func(c *mysql.Config) { setParam(c, "timestamp", "1000000000") })
		c := e.client(t, db, table)
		_, err := c.TryAcquire(ctx, "x", time.Minute)
		wantGuard(t, "TryAcquire", err, "session timestamp")
		wantFree(t, other, "x")
	})
}

// With autocommit off on a connection of the Client's pool after its first
// use, a lease written there waits for the application's COMMIT or ROLLBACK:
// without the guard, TryAcquire returned a Lock that a ROLLBACK undid, and
// another Client took the name. Every statement that takes or extends a
// lease refuses; so does one in a transaction the application began on a
// pooled connection and did not end, on MariaDB (MySQL has no variable
// that tells).
func TestSessionGuard_autocommit(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		ctx := testCtx(t)
		table := e.newTable(t)
		other := e.client(t, e.db, table)
		db := oneConnDB(t, e, func(*mysql.Config) {})
		c := e.client(t, db, table)
		held, err := c.TryAcquire(ctx, "held", time.Minute) // the first use, with autocommit on
		if err != nil {
			t.Fatalf("TryAcquire: %v", err)
		}
		settings := []string{"SET autocommit = 0"}
		if e.server.MariaDB {
			settings = append(settings, "BEGIN")
		}
		for _, set := range settings {
			if _, err := db.ExecContext(ctx, set); err != nil {
				t.Fatal(err)
			}
			_, err := c.TryAcquire(ctx, "free", time.Minute)
			wantGuard(t, "TryAcquire after "+set, err, "autocommit")
			err = held.Refresh(ctx, time.Minute)
			wantGuard(t, "Refresh after "+set, err, "autocommit")
			if !e.oneRow() {
				_, err = c.TryAcquireSet(ctx, []string{"set1", "set2"}, time.Minute)
				wantGuard(t, "TryAcquireSet after "+set, err, "autocommit")
				_, err = c.Semaphore("sem", 2).TryAcquire(ctx, time.Minute)
				wantGuard(t, "Semaphore.TryAcquire after "+set, err, "autocommit")
			}
			if _, err := db.ExecContext(ctx, "ROLLBACK"); err != nil {
				t.Fatal(err)
			}
			if _, err := db.ExecContext(ctx, "SET autocommit = 1"); err != nil {
				t.Fatal(err)
			}
			// What the application's ROLLBACK undid was never reported taken:
			// another Client finds the name free.
			l, err := other.TryAcquire(ctx, "free", time.Minute)
			if err != nil {
				t.Fatalf("other TryAcquire after the ROLLBACK (%s): %v", set, err)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if err := held.Refresh(ctx, time.Minute); err != nil {
			t.Fatalf("Refresh with autocommit on again: %v", err)
		}
		if err := held.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
	})
}

// A DSN's autocommit=0 is refused at the first use (internal/engine/tablecheck.go), before
// the guard could be met.
func TestSessionGuard_autocommitDSN(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		ctx := testCtx(t)
		table := e.newTable(t)
		db := oneConnDB(t, e, func(c *mysql.Config) { setParam(c, "autocommit", "0") })
		c := e.client(t, db, table)
		_, err := c.TryAcquire(ctx, "x", time.Minute)
		if err == nil || !strings.Contains(err.Error(), "autocommit") {
			t.Fatalf("TryAcquire: got %v, want an error naming autocommit", err)
		}
	})
}

// A session without autocommit would never commit a lease.
func TestClient_autocommitOff(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		db := e.openDBWith(t, func(c *mysql.Config) { setParam(c, "autocommit", "0") })
		c := e.client(t, db, table)
		_, err := c.TryAcquire(testCtx(t), "n", time.Second)
		if err == nil || !strings.Contains(err.Error(), "autocommit") {
			t.Fatalf("got %v, want an error about autocommit", err)
		}
	})
}

func TestClient_autocommitOff_noPrepare(t *testing.T) {
	e := newMockEnv(t)
	e.expectAutocommit(0)
	_, err := e.c.TryAcquire(t.Context(), "job", time.Second)
	assertErrContains(t, err, "autocommit off")
	e.assertNothingPrepared()
	e.done()

	// The check is made again, not remembered as passed.
	e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, &tokenArg{}), okReply(101, 2))
	if _, err := e.c.TryAcquire(t.Context(), "job", time.Second); err != nil {
		t.Errorf("TryAcquire with autocommit on: got %v, want nil", err)
	}
	e.done()
}
