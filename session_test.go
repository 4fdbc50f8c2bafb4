package sqllock

import (
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

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
