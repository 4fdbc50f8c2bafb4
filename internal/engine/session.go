package engine

import "github.com/sqllock/sqllock/internal/fault"

// The session guard: every statement that takes or extends a lease fails
// with error 1690, and writes nothing, when the session that runs it has
// autocommit off, an open transaction (MariaDB), or a clock of its own (a
// session timestamp), or when the server is read-only; queries.sql says
// how. The Client's read-only refusal wraps errReadOnlyServer, as the first use's
// does (facts.go): the waiting calls and the keep-alive pass over
// it to another connection, as over the server's own 1290. The pool is the application's,
// so such a setting may come to any connection at any time, after the
// Client's first use: only the statement itself can see the session it
// runs in. A guarded failure is a refusal that may pass (classify), like a
// read-only server's: another connection of the pool, or the same one once
// the application has put its session back, may succeed. The clock test
// also refuses a statement that waited over a second to start (a starved
// server, a row another transaction held): that refusal is sent again at
// once, a few times (fault.Retry), and the second send passes.

// SessionGuard returns what the session guard of a statement found, when
// err is the error it raised, and "" for any other error. Nothing was
// written: the server undid the statement.
func SessionGuard(err error) string {
	if n, ok := fault.Errno(err); !ok || n != fault.OutOfRange {
		return ""
	}
	if fault.GuardExpr(err.Error()) == "" {
		return ""
	}
	if fault.ReadOnlyGuard(err) {
		return "read_only or super_read_only was set after this Client's first use (a demoted primary?), " +
			"and an account with SUPER could still write there; nothing was written (another connection, or the new primary, may serve)"
	}
	if fault.ClockGuard(err) {
		return "the session's clock is not the server's: NOW() lay more than 1s from SYSDATE() " +
			"(a session timestamp, SET timestamp = ... on a connection of the pool or a DSN's timestamp=..., " +
			"or a statement that waited over a second to start); nothing was written"
	}
	return "the session has autocommit off (SET autocommit = 0 on a connection of the pool, or a DSN's autocommit=0) " +
		"or, on MariaDB, an open transaction (a BEGIN not ended): a lease written there would be undone by a ROLLBACK; nothing was written"
}
