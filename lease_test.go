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
)

// Real-server tests of the work run under a lease: keep-alive, Do, Check,
// Held, List and Close. Timings in them are correctness bounds with wide
// slack, never performance claims.

// heldLock returns the Lock c holds on name, as Do keeps it to itself.
func heldLock(t *testing.T, c *Client, name string) *Lock {
	t.Helper()
	c.held.mu.Lock()
	defer c.held.mu.Unlock()
	for l := range c.held.locks {
		if l.name == name {
			return l
		}
	}
	t.Fatalf("%q is not held", name)
	return nil
}

// pollAcquire makes b try to take name until it succeeds and returns when
// the successful attempt was sent: the takeover committed after that.
func pollAcquire(t *testing.T, b *Client, name string, ttl time.Duration) (*Lock, time.Time) {
	t.Helper()
	ctx := testCtx(t)
	for {
		sent := time.Now()
		l, err := b.TryAcquire(ctx, name, ttl)
		if err == nil {
			return l, sent
		}
		wantErrIs(t, err, ErrNotAcquired)
		time.Sleep(2 * time.Millisecond)
	}
}

// waitServerExpired returns once the server's clock has passed the expiry of
// name's lease on c's table. Inspect is a plain read: it takes no row lock,
// so it does not wait on a transaction that wrote the row.
func waitServerExpired(t *testing.T, c *Client, name string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); inspect(t, c, name).Held; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the lease of %q is still live by the server's clock 10s on", name)
		}
	}
}

// isolationLevels are the levels a session may run at, as the server's
// isolation variable spells them.
var isolationLevels = []string{"READ-COMMITTED", "REPEATABLE-READ", "SERIALIZABLE"}

// isolated returns a *sql.DB on the environment's DSN whose sessions run at
// level (one of isolationLevels).
func (e *testEnv) isolated(t testing.TB, level string) *sql.DB {
	t.Helper()
	if level == "SERIALIZABLE" && e.server.TiDB {
		t.Skipf("%s is %s: TiDB refuses SERIALIZABLE (error 8048)", e.server.Label, e.server.Version)
	}
	return e.openDBWith(t, func(c *mysql.Config) { setParam(c, isolationVariable(e.server), "'"+level+"'") })
}

// waitForStatements waits until n statements that mention table are running
// on other sessions, stably: that many are waiting for a row lock. (On
// MariaDB an acquire starts with SET STATEMENT: queries.sql, lock_wait_mariadb.
// Through Vitess the server runs vttablet's rewriting, which does not quote
// the table's name; vttestserver's one mysqld serves every shard.)
func waitForStatements(t *testing.T, db *sql.DB, table string, n int) {
	t.Helper()
	ctx := testCtx(t)
	stable := 0
	waitFor(t, 30*time.Second, fmt.Sprintf("%d statements on %s waiting", n, table), func() bool {
		var got int
		err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.PROCESSLIST "+
			"WHERE ID <> CONNECTION_ID() AND INFO LIKE CONCAT('%INSERT %INTO %', ?, '%')", table).Scan(&got)
		if err != nil {
			t.Fatal(err)
		}
		if got >= n {
			stable++
		} else {
			stable = 0
		}
		time.Sleep(50 * time.Millisecond)
		return stable >= 3
	})
}

// onceRecordRace runs TestClient_Once_recordOnlyWhileLeaseHeld's race with
// both Clients' sessions at level.
func onceRecordRace(t *testing.T, e *testEnv, level string) {
	table := e.newTable(t)
	a := e.client(t, e.isolated(t, level), table, WithHolder("a"))
	b := e.client(t, e.isolated(t, level), table, WithHolder("b"),
		WithRetry(LinearBackoff(10*time.Millisecond)))
	ctx := testCtx(t)

	// Another session holds the lock of the record's key until rollback (in
	// a pessimistic transaction on TiDB, whose optimistic ones lock nothing
	// before commit).
	blocker, err := e.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Close()
	begin := "START TRANSACTION" // BEGIN opens a block under MariaDB's sql_mode=ORACLE
	if e.server.TiDB {
		begin = "BEGIN PESSIMISTIC"
	}
	if _, err := blocker.ExecContext(ctx, begin); err != nil {
		t.Fatal(err)
	}
	defer blocker.ExecContext(context.WithoutCancel(ctx), "ROLLBACK")
	if _, err := blocker.ExecContext(ctx, "INSERT INTO `"+table+"` (name, kind, owner, holder, fence, acquired_at, expires_at) VALUES ('job', 'D', 'x', 'blocker', 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))"); err != nil {
		t.Fatal(err)
	}

	var runs atomic.Int32
	type result struct {
		who string
		ran bool
		err error
	}
	results := make(chan result, 2)
	go func() {
		ran, err := a.Once(ctx, "job", func(ctx context.Context, _ *Lock) error {
			runs.Add(1)
			// The lease lapses, as if this process had stalled.
			_, err := e.db.ExecContext(ctx, "UPDATE `"+table+"` SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE name = 'job' AND kind = 'L'")
			return err
		})
		results <- result{"a", ran, err}
	}()
	waitForStatements(t, e.db, table, 1) // a's record waits
	go func() {
		ran, err := b.Once(ctx, "job", func(_ context.Context, _ *Lock) error {
			runs.Add(1)
			return nil
		})
		results <- result{"b", ran, err}
	}()
	// b waits too: for the lease row, or for the record's key.
	waitForStatements(t, e.db, table, 2)
	if _, err := blocker.ExecContext(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	reported, ran := 0, 0
	for range 2 {
		r := <-results
		if r.ran {
			ran++
		}
		if r.ran && r.err == nil {
			reported++
		} else if r.ran && !errors.Is(r.err, ErrLockLost) || !r.ran && r.err != nil {
			t.Errorf("%s: Once returned %v, %v", r.who, r.ran, r.err)
		}
	}
	// MySQL and MariaDB lock the lease row when the record's statement reads
	// it, so the takeover waits, finds the record and does not run fn. TiDB
	// locks nothing before commit: the takeover goes ahead and runs fn, and
	// the first record's commit must then fail, so that its call reports the
	// lost lease (ErrLockLost) rather than a second success.
	wantRuns := 1
	if e.server.TiDB {
		wantRuns = 2
	}
	if reported != 1 || runs.Load() != int32(ran) || ran != wantRuns {
		t.Fatalf("got %d calls reporting a run, %d saying fn ran, and fn run %d times, want 1, %d and %d", reported, ran, runs.Load(), wantRuns, wantRuns)
	}
	var owners int
	if err := e.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+table+"` WHERE name = 'job' AND kind = 'D'").Scan(&owners); err != nil || owners != 1 {
		t.Fatalf("got %d records, %v, want 1", owners, err)
	}
}

// guardUnsafe reports whether a Note 1592's reason is one the session guard
// gives: a system variable (@@autocommit) or a system function (SYSDATE()).
func guardUnsafe(msg string) bool {
	return strings.Contains(msg, "system variable") || strings.Contains(msg, "system function")
}
