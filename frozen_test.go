package sqllock

import (
	"context"
	"database/sql"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/sqllock/sqllock/observe"
)

// skipUnlessFrozenEnds skips a test of ending a frozen holder on a server
// where the Client does not (internal/engine/frozen.go).
func skipUnlessFrozenEnds(t *testing.T, e *testEnv) {
	t.Helper()
	skipFakeFor(t, e, "the server's lock-wait tables and KILL")
	if e.oneRow() || strings.HasPrefix(e.server.Version, "5.") {
		t.Skip("the Client does not end a frozen holder on TiDB, through Vitess or on MySQL 5.7 (docs/guarantees.md)")
	}
}

// frozenEvents collects the Observer's frozen_holder events.
type frozenEvents struct {
	mu  sync.Mutex
	evs []observe.RetryEvent
}

func (f *frozenEvents) option() Option {
	return WithObserver(observe.Observer{Retried: func(ev observe.RetryEvent) {
		if ev.Statement == "frozen_holder" {
			f.mu.Lock()
			f.evs = append(f.evs, ev)
			f.mu.Unlock()
		}
	}})
}

// count returns how many events of outcome out came.
func (f *frozenEvents) count(out observe.Outcome) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, ev := range f.evs {
		if ev.Outcome == out {
			n++
		}
	}
	return n
}

// frozenHolder makes a table on e's server, takes "job" in it for ttl by
// a Client whose holder is "frozen-holder", on a pool of its own, and
// begins a transaction that Checks the lease and then stays open, as a
// stopped holder's would; rolled back when the test ends. It returns the
// table, the Lock, the transaction and its connection's id.
func frozenHolder(t *testing.T, e *testEnv, ttl time.Duration) (string, *Lock, *sql.Tx, uint64) {
	t.Helper()
	table := e.newTable(t)
	db := e.openDB(t)
	l := mustAcquire(t, e.client(t, db, table, WithHolder("frozen-holder")), "job", ttl)
	tx, err := db.BeginTx(testCtx(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback() })
	var id uint64
	if err := tx.QueryRow("SELECT CONNECTION_ID()").Scan(&id); err != nil {
		t.Fatal(err)
	}
	if err := l.Check(testCtx(t), tx); err != nil {
		t.Fatalf("Check: got %v, want nil", err)
	}
	return table, l, tx, id
}

// A holder whose Lock.Check transaction stays open (a stopped process,
// here a transaction nobody ends) keeps its lease row locked. Past its
// lease and frozenAfter, an Acquire of the name ends that transaction,
// takes the name, logs a Warn naming the connection and the old holder,
// and tells the Observer; the holder's transaction is gone.
func TestClient_Acquire_frozenHolder(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipUnlessFrozenEnds(t, e)
		table, l, tx, conn := frozenHolder(t, e, time.Second)

		rec, logOpt := newRecorder()
		var evs frozenEvents
		cand := e.client(t, e.db, table, WithHolder("candidate"), logOpt, evs.option())
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		l2, err := cand.Acquire(ctx, "job", time.Minute)
		if err != nil {
			t.Fatalf("Acquire behind the frozen holder: got %v, want the lease", err)
		}
		defer l2.Release(testCtx(t))
		t.Logf("taken %v after the frozen holder's lease ended", time.Since(l.ValidUntil()).Round(time.Millisecond))
		if l2.Fence() <= l.Fence() {
			t.Errorf("fence: got %d, want above the frozen holder's %d", l2.Fence(), l.Fence())
		}
		if _, err := tx.Exec("SELECT 1"); err == nil {
			t.Errorf("the frozen holder's transaction: got nil, want an error (its connection ended)")
		}
		warns := rec.find(slog.LevelWarn, "ended a frozen holder's transaction", "job")
		if len(warns) != 1 {
			t.Fatalf("Warns: got %d, want 1; all: %q", len(warns), rec.atLeast(slog.LevelInfo))
		}
		if got, want := attr(warns[0], "connection"), strconv.FormatUint(conn, 10); got != want {
			t.Errorf("the Warn's connection: got %s, want %s", got, want)
		}
		if got := attr(warns[0], "holder"); got != "frozen-holder" {
			t.Errorf("the Warn's holder: got %q, want %q", got, "frozen-holder")
		}
		if got := evs.count(observe.OutcomeRolledBack); got != 1 {
			t.Errorf("frozen_holder events, rolled_back: got %d, want 1", got)
		}
	})
}

// A holder inside its Lock.Check transaction whose lease is live is never
// ended: the Acquire waits and is refused, and the holder commits.
func TestClient_Acquire_frozenHolderLive(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipUnlessFrozenEnds(t, e)
		table, _, tx, _ := frozenHolder(t, e, time.Minute)

		rec, logOpt := newRecorder()
		var evs frozenEvents
		cand := e.client(t, e.db, table, logOpt, evs.option())
		// Longer than frozenLook and frozenAfter, so the watch has looked.
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_, err := cand.Acquire(ctx, "job", time.Minute)
		wantErrIs(t, err, ErrNotAcquired)
		if err := tx.Commit(); err != nil {
			t.Fatalf("the live holder's commit: got %v, want nil", err)
		}
		if n := len(evs.evs); n != 0 {
			t.Errorf("frozen_holder events: got %d, want 0", n)
		}
		if w := rec.find(slog.LevelWarn, "frozen", "job"); len(w) != 0 {
			t.Errorf("Warns of a frozen holder: got %d, want none; all: %q", len(w), rec.atLeast(slog.LevelWarn))
		}
	})
}

// An account that cannot read the lock-wait tables, or cannot kill
// another account's connection, is told once per Client, with what to
// grant, and the Observer counts each frozen holder met; the name stays
// held.
func TestClient_Acquire_frozenHolderUnprivileged(t *testing.T) {
	if os.Getenv(ownServerEnv) == "" {
		t.Skipf("set %s when the test servers are the tests' own, to create an account", ownServerEnv)
	}
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipUnlessFrozenEnds(t, e)
		table, _, tx, _ := frozenHolder(t, e, time.Second)

		grant, udb := frozenUser(t, e, table)
		lookup, kill := "GRANT SELECT ON performance_schema.*", "CONNECTION_ADMIN"
		if e.server.MariaDB {
			lookup, kill = "GRANT PROCESS", "CONNECTION ADMIN"
		}
		// held checks the warnings of a new Client of the account after
		// two Acquires of the name, each long enough for the lease to end
		// and frozenAfter to pass.
		held := func(what string) {
			t.Helper()
			rec, logOpt := newRecorder()
			var evs frozenEvents
			// A new pool: a global privilege is read at login.
			cand := e.client(t, udb(), table, logOpt, evs.option())
			mustAcquire(t, cand, "first use", time.Minute).Release(testCtx(t))
			for range 2 {
				ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
				_, err := cand.Acquire(ctx, "job", time.Minute)
				cancel()
				wantErrIs(t, err, ErrNotAcquired)
			}
			warns := rec.find(slog.LevelWarn, "cannot end a frozen holder's transaction", "job")
			if len(warns) != 1 || !strings.Contains(warns[0].Message, what) {
				t.Errorf("Warns: got %q, want one saying %q", rec.atLeast(slog.LevelWarn), what)
			}
			if evs.count(observe.OutcomeRefused) < 1 || evs.count(observe.OutcomeRolledBack) != 0 {
				t.Errorf("frozen_holder events: got %+v, want refused ones only", evs.evs)
			}
		}
		held(lookup)
		if e.server.MariaDB {
			grant("PROCESS ON *.*")
		} else {
			grant("SELECT ON performance_schema.*")
		}
		held(kill)
		if _, err := tx.Exec("SELECT 1"); err != nil {
			t.Errorf("the frozen holder's transaction: got %v, want it alive (another account's)", err)
		}
	})
}

// frozenUser creates an account with the privileges sqllock needs on
// table and no others, dropped when the test ends, and returns a function
// that grants it more and one that opens a *sql.DB for it. Every host form, so that no
// anonymous account of a fresh install matches first.
func frozenUser(t *testing.T, e *testEnv, table string) (grant func(priv string), open func() *sql.DB) {
	t.Helper()
	var users []string
	for _, host := range []string{"'%'", "'localhost'", "'127.0.0.1'"} {
		user := "sqllock_frz@" + host
		users = append(users, user)
		for _, q := range []string{
			"DROP USER IF EXISTS " + user,
			"CREATE USER " + user + " IDENTIFIED BY 'frz'",
			"GRANT SELECT, INSERT, UPDATE, DELETE ON `" + table + "` TO " + user,
		} {
			if _, err := e.db.Exec(q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		t.Cleanup(func() { _, _ = e.db.Exec("DROP USER IF EXISTS " + user) })
	}
	grant = func(priv string) {
		t.Helper()
		for _, user := range users {
			if _, err := e.db.Exec("GRANT " + priv + " TO " + user); err != nil {
				t.Fatalf("GRANT %s: %v", priv, err)
			}
		}
	}
	return grant, func() *sql.DB {
		return e.openDBWith(t, func(c *mysql.Config) { c.User, c.Passwd = "sqllock_frz", "frz" })
	}
}
