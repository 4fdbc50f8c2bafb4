package sqllock

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/engine"
)

// Every statement that writes is safe for statement-based replication: with
// binlog_format=STATEMENT the server raises no Note 1592 for any of them,
// but those that take or extend a lease, whose session guard reads
// @@autocommit and SYSDATE() on purpose (queries.sql): for them the Note
// names just those, and binlog_format=MIXED logs them as rows.
func TestQueries_statementBinlogSafe(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		if e.server.TiDB {
			t.Skip("TiDB writes no binary log of statements (it replicates through its own change feed)")
		}
		c := e.newClient(t)
		ctx := testCtx(t)
		if _, err := c.eng.Stmt(ctx, qAcquire); err != nil { // the first use: the server's forms
			t.Fatal(err)
		}
		conn, err := e.db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		var logBin bool
		if err := conn.QueryRowContext(ctx, "SELECT @@log_bin").Scan(&logBin); err != nil {
			t.Fatal(err)
		}
		if !logBin {
			t.Skip("the server writes no binary log, so it judges no statement unsafe")
		}
		if _, err := conn.ExecContext(ctx, "SET SESSION binlog_format = 'STATEMENT'"); err != nil {
			t.Skipf("cannot set binlog_format here: %v", err)
		}
		defer conn.ExecContext(context.WithoutCancel(ctx), "SET SESSION binlog_format = DEFAULT")
		const tok, us = "0123456789abcdef0123456789abcdef", int64(60_000_000)
		acquire := []any{"n", tok, "h", us, "n", tok, "h", tok, us}
		if e.oneRow() { // through Vitess: tidb_acquire's arguments
			acquire = []any{"n", tok, "h", us}
		}
		for _, s := range []struct {
			q       int
			args    []any
			guarded bool
		}{
			{qAcquire, acquire, true},
			{qAcquire, acquire, true}, // the same owner again
			{qRefresh, []any{us, "n", tok}, true},
			{qCheck, []any{"n", tok}, false},
			{qOnceRecord, []any{"n", tok}, false},
			{qReleaseAtLeast, []any{us, "n", tok}, true},
			{qRelease, []any{"n", tok}, false},
		} {
			if _, err := conn.ExecContext(ctx, c.eng.Forms().SQL[s.q], s.args...); err != nil {
				t.Fatalf("%s: %v", stmtNames[s.q], err)
			}
			rows, err := conn.QueryContext(ctx, "SHOW WARNINGS")
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var level, msg string
				var code int
				if err := rows.Scan(&level, &code, &msg); err != nil {
					t.Fatal(err)
				}
				if code == 1592 && !(s.guarded && guardUnsafe(msg)) {
					t.Errorf("%s: got Note 1592 (%s), want none", stmtNames[s.q], msg)
				}
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			rows.Close()
		}
	})
}

func TestSplitQueries_names(t *testing.T) {
	got := slices.Sorted(maps.Keys(queries))
	want := []string{"acquire", "acquire_attached", "all_acquire", "all_acquire_fence", "all_acquire_fence_first", "all_acquire_fence_write", "all_acquire_lease", "all_check", "all_fences", "all_refresh", "all_release", "all_release_at_least", "carries", "check", "first_use", "force_release", "frozen_blocker_mariadb", "frozen_blocker_mysql", "frozen_kill", "frozen_lease", "inspect", "lease", "list", "lock_delay", "lock_wait_mariadb", "look", "once_done", "once_record", "once_reset", "proof_clear", "proof_engine", "proof_overflow", "refresh", "release", "release_at_least", "renew_found", "renew_many", "renew_many_mariadb",
		"server_mariadb", "server_mysql", "server_mysql_plain", "session_attach", "session_close", "session_detach", "session_found", "session_open", "session_renew", "slot_acquire", "slot_list", "slot_release",
		"tidb_acquire", "tidb_all_acquire", "tidb_all_acquire_row", "tidb_all_refresh", "tidb_all_release", "tidb_inspect", "tidb_lease", "tidb_list", "tidb_lock_delay", "tidb_look", "tidb_once_record", "tidb_refresh", "tidb_release", "tidb_release_at_least",
		"wake_probe", "wake_release", "wake_wait"}
	if !slices.Equal(got, want) {
		t.Errorf("names in queries.sql: got %v, want %v", got, want)
	}
	for _, name := range stmtNames {
		if _, ok := queries[name]; !ok {
			t.Errorf("queries[%q]: got missing, want present", name)
		}
	}
	for _, i := range tidbStmts {
		if _, ok := queries[tidbPrefix+stmtNames[i]]; !ok {
			t.Errorf("queries[%q]: got missing, want TiDB's form of %s", tidbPrefix+stmtNames[i], stmtNames[i])
		}
	}
}

func TestSplitQueries_statements(t *testing.T) {
	// Placeholders per statement: the argument lists the Client sends.
	wantArgs := map[string]int{"acquire": 9, "acquire_attached": 9, "refresh": 3, "release": 2, "inspect": 1, "first_use": 0, "carries": 1,
		"release_at_least": 3, "check": 2, "list": 0, "once_done": 1, "once_record": 2,
		"lease": 1, "lock_delay": 5, "tidb_lock_delay": 5, "once_reset": 1, "proof_clear": 1, "proof_engine": 1, "proof_overflow": 1,
		"server_mysql": 0, "server_mysql_plain": 0, "server_mariadb": 0, "look": 1, "wake_wait": 3, "wake_release": 1, "wake_probe": 1,
		"frozen_lease": 1, "frozen_blocker_mariadb": 3, "frozen_blocker_mysql": 3, "frozen_kill": 1,
		"slot_acquire": 21, "slot_release": 3, "slot_list": 2,
		"tidb_acquire": engine.OneRowAcquireArgs, "tidb_refresh": 3, "tidb_release": 2, "tidb_inspect": 1,
		"tidb_release_at_least": 3, "tidb_list": 0, "tidb_once_record": 2, "tidb_lease": 1, "tidb_look": 1,
		// Sets: literal holes, which the Go side fills (acquire_set.go).
		"all_acquire": 5, "all_acquire_lease": 4, "all_acquire_fence_first": 1, "all_acquire_fence": 1,
		"all_acquire_fence_write": 1, "all_refresh": 3, "renew_many": 3, "renew_found": 2, "all_release": 2, "all_release_at_least": 3,
		"all_check": 2, "all_fences": 2, "tidb_all_acquire": 1,
		"force_release": 2, "session_open": 4, "session_renew": 3, "session_attach": 4, "session_found": 2, "session_detach": 2, "session_close": 3, "tidb_all_acquire_row": 4, "tidb_all_refresh": 3, "tidb_all_release": 2}
	for name, stmt := range queries {
		t.Run(name, func(t *testing.T) {
			if got, want := strings.Count(stmt, "?"), wantArgs[name]; got != want {
				t.Errorf("placeholders: got %d, want %d", got, want)
			}
			if strings.Contains(stmt, ";") || strings.Contains(stmt, "--") {
				t.Errorf("got %q, want one statement without semicolon or comments", stmt)
			}
			onTable := strings.Contains(stmt, "`sqllock`")
			row := strings.HasPrefix(stmt, "(") // a row of a set's acquire
			if want := name != "first_use" && name != "carries" && !strings.HasPrefix(name, "server_") && !row && !strings.HasPrefix(name, "wake_") && !strings.HasPrefix(name, "lock_wait_") && !strings.HasPrefix(name, "guard_") && name != "frozen_kill" && name != "renew_many_mariadb"; onTable != want {
				t.Errorf("names the table placeholder: got %v, want %v", onTable, want)
			}
		})
	}
}

// Every TiDB statement that writes turns TiDB's own re-run of a conflicting
// autocommit statement off for itself, so that its answer is that of the run
// that committed (queries.sql); the reads need no hint.
func TestQueries_TiDBWritesNotRerun(t *testing.T) {
	const hint = "/*+ SET_VAR(tidb_retry_limit=0) */"
	for _, i := range tidbStmts {
		name := tidbPrefix + stmtNames[i]
		stmt := queries[name]
		verb, _, _ := strings.Cut(stmt, " ")
		writes := verb == "INSERT" || verb == "UPDATE" || verb == "DELETE"
		if got := strings.HasPrefix(stmt, verb+" "+hint+" "); got != writes {
			t.Errorf("%s: starts with %s %s: got %v, want %v", name, verb, hint, got, writes)
		}
	}
}

// acquireAllSQL returns the acquire of set s for ttl, as the Client sends it.
func (c *Client) acquireAllSQL(s *lockSet, ttl time.Duration) string {
	return c.eng.SetAcquire(s.Set, ttl)
}

// slotSQL returns slot_acquire for table (quoted) with its slot row written
// v times; mariadb: with the bound on its lock wait (engine.Server.SlotAcquire).
func slotSQL(table string, mariadb bool, v int) string { return queries.Slot(table, mariadb, v) }

// A call that needs a statement another call is preparing on a dead
// connection waits only as long as its own context allows.
func TestClient_stuckPrepare_waitsEndWithTheirContext(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		c, p := stalledClient(t, e)
		go func() { _, _ = c.TryAcquire(testCtx(t), "x", time.Minute) }()
		waitCommand(t, p, proxyComQuery) // the first use's check (first_use)
		calls := []struct {
			name string
			call func(ctx context.Context) error
		}{
			{"TryAcquire", func(ctx context.Context) error { _, err := c.TryAcquire(ctx, "x", time.Minute); return err }},
			{"Acquire", func(ctx context.Context) error { _, err := c.Acquire(ctx, "y", time.Minute); return err }},
			{"Inspect", func(ctx context.Context) error { _, err := c.Inspect(ctx, "x"); return err }},
		}
		for _, call := range calls {
			t.Run(call.name, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
				defer cancel()
				err := within(t, call.name, func() error { return call.call(ctx) })
				wantErrIs(t, err, context.DeadlineExceeded)
			})
		}
	})
}

// A call waiting for a prepare whose caller gave up prepares anew under its
// own context, rather than failing with the other caller's context's error.
func TestClient_stuckPrepare_waiterOutlivesPreparer(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		c, p := stalledClient(t, e)
		ctx := testCtx(t)
		first, cancelFirst := context.WithCancel(ctx)
		firstDone := make(chan error, 1)
		go func() {
			_, err := c.TryAcquire(first, "x", time.Minute)
			firstDone <- err
		}()
		waitCommand(t, p, proxyComQuery)
		secondDone := make(chan error, 1)
		go func() {
			_, err := c.TryAcquire(ctx, "y", time.Minute)
			secondDone <- err
		}()
		time.Sleep(100 * time.Millisecond) // let it join the prepare
		cancelFirst()
		wantErrIs(t, within(t, "first TryAcquire", func() error { return <-firstDone }), context.Canceled)
		p.Stall(false)
		if err := within(t, "second TryAcquire", func() error { return <-secondDone }); err != nil {
			t.Fatalf("second TryAcquire: got %v, want nil", err)
		}
	})
}

// A query whose statement Close closed under it (Once's check for a
// completion record, Inspect, List) reports ErrClosed, as a write does, not
// database/sql's "statement is closed".
func TestClient_query_statementClosedUnderIt(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		c := e.newClient(t)
		ctx := testCtx(t)
		st, err := c.eng.Stmt(ctx, qOnceDone)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		_, err = st.QueryContext(ctx, "job")
		if err == nil {
			t.Fatal("query on a statement Close closed: got no error")
		}
		wantErrIs(t, c.serverError("once", err), ErrClosed)
	})
}
