package sqllock

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock/internal/fault"
	"github.com/sqllock/sqllock/observe"
)

// The settings a replica's applier has, set by a client's session: MariaDB's
// applier runs with the origin's @@session.server_id, MySQL's with the
// origin's @@session.original_commit_timestamp, and an earlier guard let a
// session that set them pass as the applier. The guard now tells the
// applier by USER(), which no SET changes: a session with either setting and
// a clock an hour ahead, or an open transaction, is still refused, and
// takes over no live lease.
func TestSessionGuard_applierSettingsRefused(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipOnVitess(t, e, vitessNoTimestamp)
		if e.server.TiDB {
			t.Skip("TiDB has neither setting: its guard never let an applier pass")
		}
		ctx := testCtx(t)
		table := e.newTable(t)
		other := e.client(t, e.db, table)
		theirs := mustAcquire(t, other, "theirs", time.Minute)
		t.Cleanup(func() { _ = theirs.Release(context.Background()) })
		lookalike := "SET SESSION server_id = 4242" // MariaDB's applier: the origin's server_id
		if !e.server.MariaDB {
			lookalike = "SET @@SESSION.original_commit_timestamp = 1" // MySQL's applier: the origin's commit time
		}
		db := oneConnDB(t, e, func(*mysql.Config) {})
		c := e.client(t, db, table)
		held := mustAcquire(t, c, "held", time.Minute) // the first use, on a plain session
		if _, err := db.ExecContext(ctx, lookalike); err != nil {
			t.Fatalf("%s: %v", lookalike, err)
		}
		if _, err := db.ExecContext(ctx, "SET timestamp = UNIX_TIMESTAMP(SYSDATE()) + 3600"); err != nil {
			t.Fatal(err)
		}
		_, err := c.TryAcquire(ctx, "theirs", time.Minute)
		wantGuard(t, "TryAcquire of a live lease, an hour ahead, after "+lookalike, err, "session timestamp")
		if info, err := other.Inspect(ctx, "theirs"); err != nil || info.Fence != theirs.Fence() || !info.Held {
			t.Fatalf("the live lease after the refusal: %+v, %v; want it still theirs", info, err)
		}
		err = held.Refresh(ctx, time.Minute)
		wantGuard(t, "Refresh, an hour ahead, after "+lookalike, err, "session timestamp")
		if _, err := db.ExecContext(ctx, "SET timestamp = DEFAULT"); err != nil {
			t.Fatal(err)
		}
		if e.server.MariaDB {
			// An open transaction: the lease would be undone by its
			// ROLLBACK.
			conn, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := conn.ExecContext(ctx, "BEGIN"); err != nil {
				t.Fatal(err)
			}
			if err := conn.Close(); err != nil { // back to the pool, still in its transaction
				t.Fatal(err)
			}
			_, err = c.TryAcquire(ctx, "free", time.Minute)
			wantGuard(t, "TryAcquire in an open transaction, after "+lookalike, err, "open transaction")
			if _, err := db.ExecContext(ctx, "ROLLBACK"); err != nil {
				t.Fatal(err)
			}
			wantFree(t, other, "free")
		}
		if err := held.Refresh(ctx, time.Minute); err != nil {
			t.Fatalf("Refresh on the session put back (the lookalike setting kept): %v", err)
		}
	})
}

// A server made read-only after the Client's first use (a demoted primary,
// whose address moved to the new one) is refused by every statement that
// takes, extends or releases-at-least a lease, though root, with SUPER,
// could still write there: the refusal wraps errReadOnlyServer and is
// classified as the server's own 1290, so the keep-alive and the waiting
// Acquire go on trying, the Observer sees it, and once the server is
// writable again the waiter takes the name. On the tests' own server.
func TestSessionGuard_demotedAfterFirstUse(t *testing.T) {
	if os.Getenv(ownServerEnv) == "" {
		t.Skipf("set %s when the test server is the tests' own, to make it read-only", ownServerEnv)
	}
	soleServer(t, "makes the server read-only under "+ownServerEnv)
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		if e.server.TiDB || e.server.Vitess {
			t.Skipf("%s: its read-only settings refuse every account", e.server.Label)
		}
		ctx := testCtx(t)
		table := e.newTable(t)
		var refused atomic.Int64
		obs := observe.Observer{
			Refreshed: func(ev observe.RefreshEvent) {
				if ev.Outcome == observe.OutcomeRefused && fault.ReadOnlyGuard(ev.Err) {
					refused.Add(1)
				}
			},
		}
		c := e.client(t, e.db, table, WithObserver(obs))
		kept := mustAcquire(t, c, "kept", 3*time.Second)
		leaseCtx := kept.KeepAlive(ctx)
		other := mustAcquire(t, c, "other", time.Minute)
		sem := c.Semaphore("sem", 2)
		slot, err := sem.TryAcquire(ctx, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		set, err := c.TryAcquireSet(ctx, []string{"s1", "s2"}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		// A waiter on another pool, behind the kept lease.
		w := e.client(t, e.openDB(t), table, WithRetry(LinearBackoff(100*time.Millisecond)))
		waited := acquireAsync(ctx, w, "kept")
		// A Do whose minimum hold is released once the server is
		// read-only.
		demoted, doErr := make(chan struct{}), make(chan error, 1)
		go func() {
			doErr <- c.Do(ctx, "min-hold", time.Minute, func(context.Context, *Lock) error { <-demoted; return nil }, WithMinHold(time.Second))
		}()
		waitFor(t, time.Minute, "Do holds its name", func() bool {
			info, err := w.Inspect(ctx, "min-hold")
			return err == nil && info.Held
		})

		setGlobal(t, e, "read_only", "ON", "OFF")
		close(demoted)
		wantReadOnly := func(op string, err error) {
			t.Helper()
			if !errors.Is(err, errReadOnlyServer) || !passable(err) || classify(err) != fault.Refused {
				t.Errorf("%s on a server made read-only: got %v, want the read-only refusal, passable", op, err)
			}
		}
		_, err = c.TryAcquire(ctx, "new", time.Minute)
		wantReadOnly("TryAcquire", err)
		wantReadOnly("Refresh", other.Refresh(ctx, time.Minute))
		wantReadOnly("Refresh of a slot", slot.Refresh(ctx, time.Minute))
		wantReadOnly("Refresh of a set", set.Refresh(ctx, time.Minute))
		_, err = sem.TryAcquire(ctx, time.Minute)
		wantReadOnly("Semaphore.TryAcquire", err)
		_, err = c.TryAcquireSet(ctx, []string{"s3", "s4"}, time.Minute)
		wantReadOnly("TryAcquireSet", err)
		wantReadOnly("Do's release for its minimum hold", <-doErr)
		for _, name := range []string{"new", "s3"} {
			if info, err := e.client(t, e.db, table).Inspect(ctx, name); err != nil || info.Held {
				t.Errorf("%q after the refusals: %+v, %v; want free", name, info, err)
			}
		}
		// The keep-alive's renewals are refused until its lease is lost;
		// the waiter goes on waiting.
		select {
		case <-leaseCtx.Done():
		case <-time.After(time.Minute):
			t.Fatal("the kept lease's context: still live a minute into a read-only server")
		}
		if refused.Load() == 0 {
			t.Error("Observer: got no refresh refused as read-only, want the keep-alive's")
		}
		select {
		case r := <-waited:
			t.Fatalf("the waiter returned while the server was read-only: %v, %v", r.l, r.err)
		default:
		}
		if _, err := e.db.Exec("SET GLOBAL read_only = OFF"); err != nil {
			t.Fatal(err)
		}
		r := <-waited
		if r.err != nil || r.l.Fence() <= kept.Fence() {
			t.Fatalf("the waiter once writable: got %v, %v; want the name with a fence past %d", r.l, r.err, kept.Fence())
		}
		_ = r.l.Release(ctx)
		if !e.server.MariaDB {
			// super_read_only: the server's own 1290, as before.
			setGlobal(t, e, "super_read_only", "ON", "OFF")
			_, err = c.TryAcquire(ctx, "new", time.Minute)
			if !passable(err) || classify(err) != fault.Refused {
				t.Errorf("TryAcquire under super_read_only: got %v, want a refusal that may pass", err)
			}
			if _, err := e.db.Exec("SET GLOBAL super_read_only = OFF"); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// An application that shares its pool with the Client and runs USE on it (a
// multi-tenant service switching databases) moved leases into the other
// database's table of the same name, which an earlier Client named without
// its database: statements prepared afresh on such a connection, and those
// sent as text (sets, slots, look), took names there that another Client
// held in the real table. Now every statement names the table in the
// database the first use found, and the wake-up channels hash that
// database, not the connection's: every kind takes its lease in the right
// table, and nothing lands in the other one.
func TestClient_USE_leasesStayInTheirDatabase(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipFakeFor(t, e, "it has one database")
		skipOnVitess(t, e, "vtgate creates no database: a keyspace is the topology's")
		ctx := testCtx(t)
		table := e.newTable(t)
		var home string
		if err := e.db.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&home); err != nil {
			t.Fatal(err)
		}
		other := "use_" + table[:9]
		if _, err := e.db.ExecContext(ctx, "CREATE DATABASE IF NOT EXISTS `"+other+"`"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = e.db.Exec("DROP DATABASE IF EXISTS `" + other + "`") })
		if _, err := e.db.ExecContext(ctx, "CREATE TABLE `"+other+"`.`"+table+"` LIKE `"+table+"`"); err != nil {
			t.Fatal(err)
		}

		const conns = 4
		db := e.openDB(t)
		db.SetMaxOpenConns(conns)
		db.SetMaxIdleConns(conns)
		c := e.client(t, db, table, WithRetry(LinearBackoff(20*time.Millisecond)))
		mustAcquire(t, c, "warm", time.Minute) // the first use, on the DSN's database
		// Every connection from now on is a new one that ran USE first, so
		// that each statement is prepared afresh there.
		db.SetMaxIdleConns(0)
		db.SetMaxIdleConns(conns)
		var held []*sql.Conn
		for range conns {
			conn, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := conn.ExecContext(ctx, "USE `"+other+"`"); err != nil {
				t.Fatal(err)
			}
			held = append(held, conn)
		}
		for _, conn := range held {
			conn.Close()
		}

		name := mustAcquire(t, c, "name", time.Minute)
		if err := name.Refresh(ctx, time.Minute); err != nil {
			t.Fatalf("Refresh: %v", err)
		}
		set, err := c.TryAcquireSet(ctx, []string{"s1", "s2"}, time.Minute)
		if err != nil {
			t.Fatalf("TryAcquireSet: %v", err)
		}
		var slot *Lock
		if !e.oneRow() {
			if slot, err = c.Semaphore("sem", 2).TryAcquire(ctx, time.Minute); err != nil {
				t.Fatalf("Semaphore.TryAcquire: %v", err)
			}
		}
		if ran, err := c.Once(ctx, "once", func(context.Context, *Lock) error { return nil }); !ran || err != nil {
			t.Fatalf("Once: ran %v, %v", ran, err)
		}
		list, err := c.List(ctx)
		if err != nil || len(list) < 4 {
			t.Fatalf("List: %d leases, %v; want the Client's", len(list), err)
		}
		if info, err := c.Inspect(ctx, "name"); err != nil || !info.Held || info.Fence != name.Fence() {
			t.Fatalf("Inspect: %+v, %v; want the Lock's lease", info, err)
		}

		// A waiter behind another Client's lease: its looks and its wake-up
		// channel are the home table's.
		theirs := mustAcquire(t, e.client(t, e.db, table), "theirs", time.Minute)
		waited := acquireAsync(ctx, c, "theirs")
		if !e.server.TiDB {
			waitFor(t, time.Minute, "the waiter holds the home table's channel", func() bool {
				return channelHolder(t, e.db, table, "theirs") != 0
			})
		}
		if _, err := e.client(t, e.db, table).ForceRelease(ctx, "theirs"); err != nil {
			t.Fatal(err)
		}
		if r := <-waited; r.err != nil {
			t.Fatalf("the waiter: %v", r.err)
		} else if r.l.Fence() <= theirs.Fence() {
			t.Errorf("the waiter's fence %d, want past %d", r.l.Fence(), theirs.Fence())
		}

		// Every lease is in the home table, seen by a Client on a plain
		// pool, and none in the other database.
		plain := e.client(t, e.openDB(t), table)
		for _, n := range []string{"name", "s1", "s2", "theirs"} {
			if _, err := plain.TryAcquire(ctx, n, time.Minute); !errors.Is(err, ErrNotAcquired) {
				t.Errorf("TryAcquire(%q) on a plain pool: got %v, want it held in %s.%s", n, err, home, table)
			}
		}
		var rows int
		if err := e.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+other+"`.`"+table+"`").Scan(&rows); err != nil || rows != 0 {
			t.Errorf("rows in %s.%s: %d, %v; want none", other, table, rows, err)
		}
		for _, l := range []*Lock{name, set, slot} {
			if l != nil {
				if err := l.Release(ctx); err != nil {
					t.Errorf("Release %s: %v", l.Name(), err)
				}
			}
		}
	})
}

// replicaEnv names the DSN of a read-only replica of the one server in
// SQLLOCK_TEST_DSN that applies the tables test.trepl* (scripts/testdb up
// SERVER-replica), which TestSessionGuard_statementReplica writes through.
const replicaEnv = "SQLLOCK_TEST_REPLICA_DSN"

// With binlog_format=STATEMENT a replica runs every statement again, the
// session guard too, inside a transaction its binary log opens, with its
// own clock, and read-only: the guard lets the applier pass (USER() has no
// host there), so a replica whose applier lags past a second applies every
// statement the library sends, and its table ends as the primary's.
func TestSessionGuard_statementReplica(t *testing.T) {
	dsn := os.Getenv(replicaEnv)
	if dsn == "" {
		t.Skipf("set %s to a replica of the one server in SQLLOCK_TEST_DSN (scripts/testdb up SERVER-replica; scripts/testdb dsn SERVER-replica)", replicaEnv)
	}
	soleServer(t, "reads the replica of the one server under "+replicaEnv)
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		ctx := testCtx(t)
		replica, err := sql.Open("mysql", dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { replica.Close() })
		sqlThread := func(verb string) {
			t.Helper()
			stmt := verb + " SLAVE SQL_THREAD"
			if !e.server.MariaDB {
				stmt = verb + " REPLICA SQL_THREAD"
			}
			if _, err := replica.ExecContext(ctx, stmt); err != nil {
				t.Fatalf("%s: %v", stmt, err)
			}
		}
		var b [4]byte
		_, _ = rand.Read(b[:])
		table := "trepl_" + hex.EncodeToString(b[:]) // the replica applies test.trepl* alone
		db := e.openDBWith(t, func(c *mysql.Config) { setParam(c, "binlog_format", "'STATEMENT'") })
		c := e.client(t, db, table, WithLockDelay(0))
		if err := c.CreateTable(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = e.db.Exec("DROP TABLE IF EXISTS `" + table + "`") })
		waitFor(t, time.Minute, "the replica has the table", func() bool {
			var n int
			return replica.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+table+"`").Scan(&n) == nil
		})

		sqlThread("STOP")
		stopped := time.Now()
		l := mustAcquire(t, c, "name", time.Minute)
		if err := l.Refresh(ctx, time.Minute); err != nil {
			t.Fatal(err)
		}
		set, err := c.TryAcquireSet(ctx, []string{"s1", "s2"}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if err := set.Refresh(ctx, time.Minute); err != nil {
			t.Fatal(err)
		}
		slot, err := c.Semaphore("sem", 2).TryAcquire(ctx, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if ran, err := c.Once(ctx, "once", func(context.Context, *Lock) error { return nil }); !ran || err != nil {
			t.Fatalf("Once: %v, %v", ran, err)
		}
		if err := c.Do(ctx, "min-hold", time.Minute, func(context.Context, *Lock) error { return nil }, WithMinHold(time.Hour)); err != nil {
			t.Fatal(err)
		}
		if _, err := c.ForceRelease(ctx, "name"); err != nil {
			t.Fatal(err)
		}
		for _, l := range []*Lock{set, slot} {
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		mustAcquire(t, c, "last", time.Minute)
		if lag := time.Since(stopped); lag < 1500*time.Millisecond {
			time.Sleep(1500*time.Millisecond - lag) // the applier replays past the clock test's second
		}
		sqlThread("START")

		rows := func(db *sql.DB) string {
			var sum sql.NullString
			if err := db.QueryRowContext(ctx, "SELECT GROUP_CONCAT(CONCAT_WS(' ', HEX(name), kind, HEX(owner), fence, acquired_at, expires_at) ORDER BY name, kind SEPARATOR '\n') FROM `"+table+"`").Scan(&sum); err != nil {
				t.Fatal(err)
			}
			return sum.String
		}
		want := rows(e.db)
		waitFor(t, time.Minute, "the replica applies every statement", func() bool {
			if errno, running := replicaStatus(t, replica); errno != 0 || !running {
				t.Fatalf("the replica's applier: error %d, running %v; want it applying (SHOW REPLICA STATUS)", errno, running)
			}
			return rows(replica) == want
		})
	})
}

// replicaStatus reads the applier's last error number and whether it runs.
func replicaStatus(t *testing.T, db *sql.DB) (errno int64, running bool) {
	t.Helper()
	q := "SHOW REPLICA STATUS"
	var v string
	if err := db.QueryRow("SELECT VERSION()").Scan(&v); err == nil && strings.Contains(v, "MariaDB") {
		q = "SHOW SLAVE STATUS"
	}
	rows, err := db.Query(q)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	vals := make([]sql.NullString, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	if !rows.Next() {
		t.Fatalf("%s: no row: the server is no replica", q)
	}
	if err := rows.Scan(ptrs...); err != nil {
		t.Fatal(err)
	}
	for i, c := range cols {
		switch c {
		case "Last_SQL_Errno":
			errno, _ = strconv.ParseInt(vals[i].String, 10, 64)
		case "Slave_SQL_Running", "Replica_SQL_Running":
			running = vals[i].String == "Yes"
		}
	}
	return errno, running
}
