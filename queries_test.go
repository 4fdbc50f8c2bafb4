package sqllock

import (
	"context"
	"testing"
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
		if _, err := c.stmt(ctx, qAcquire); err != nil { // the first use: the server's forms
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
			if _, err := conn.ExecContext(ctx, c.learned().sql[s.q], s.args...); err != nil {
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
