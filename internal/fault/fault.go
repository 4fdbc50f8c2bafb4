// Package fault tells what a failed statement may have done on the server,
// from the error alone (Classify), and sends a statement again while that
// is safe (Retry). sqllock imports no driver: it reads a server's error
// number from the text every MySQL driver for Go prints.
package fault

import (
	"context"
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"syscall"
)

// Server error numbers sqllock acts on.
const (
	// Rolled back: the server undid the statement, and it may be sent
	// again at once with the same token.
	LockWaitTimeout   = 1205 // InnoDB lock wait timeout
	Deadlock          = 1213 // deadlock, or a Galera certification conflict
	GRRollback        = 3101 // Group Replication rolled the transaction back
	GRHookRollback    = 3100 // Group Replication refused the commit (member leaving the group)
	ErrorDuringCommit = 1180 // "Got error 149 ... during COMMIT": a Group Replication multi-primary conflict
	RecordChanged     = 1020 // MariaDB 11.6+ snapshot isolation: "Record has changed since last read"
	TiDBWriteConflict = 9007 // TiDB write conflict
	QueryInterrupted  = 1317
	StatementTimeout  = 1969 // MariaDB max_statement_time
	QueryTimeout      = 3024 // MySQL max_execution_time

	// Refused: the server ran nothing and cannot now (a failover, a full
	// server); the same statement may succeed later, here or on the node
	// that takes over.
	// Too many connections (ConCount) too.
	OptionPrevents = 1290 // --read-only, --super-read-only
	ReadOnlyTx     = 1792 // a read-only transaction
	ReadOnlyMode   = 1836 // innodb_read_only and the like
	WsrepNotReady  = 1047 // Galera: the node is not in the primary component

	// Unknown: the connection ended while the statement may have run.
	ServerShutdown    = 1053
	ConnectionKilled  = 1927 // MariaDB: KILL CONNECTION while the statement ran
	ClientIdleTimeout = 4031 // MySQL 8.0: the server closed an idle session
	NetReadError      = 1158 // 1158 to 1161: the server's reads or writes of the connection failed
	NetWriteInterrupt = 1161

	// Final, with a hint of their own in serverError.
	NoSuchTable  = 1146
	BadField     = 1054 // unknown column
	UnknownError = 1105 // vtgate's own errors: "table X not found" when its vschema lacks the table

	// A server that refuses GET_LOCK (MariaDB Galera with wsrep on): the
	// Client's wake-up channels stay off (internal/wait).
	NotSupportedYet = 1235
)

// OutOfRange is "BIGINT UNSIGNED value is out of range": what all_acquire
// raises, on purpose, when a name of the set is held (queries.sql).
const OutOfRange = 1690

// DupEntry is a duplicate key: Once's record is already there.
const DupEntry = 1062

// Errno returns the MySQL error number err carries, if it carries one.
// The library imports no driver, so it reads the number from the text every
// MySQL driver for Go prints: "Error 1213 (40001): Deadlock found ...".
func Errno(err error) (int, bool) {
	for ; err != nil; err = errors.Unwrap(err) {
		rest, ok := strings.CutPrefix(err.Error(), "Error ")
		if !ok {
			continue
		}
		end := strings.IndexFunc(rest, func(r rune) bool { return r < '0' || r > '9' })
		if end <= 0 {
			continue
		}
		if n, err := strconv.Atoi(rest[:end]); err == nil {
			return n, true
		}
	}
	return 0, false
}

// Outcome says what a failed statement may have done on the server, and so
// whether trying again can help.
type Outcome int

const (
	// Final: the error is the answer, and trying again cannot change
	// it: a closed Client, bad input, a missing table or column, a refused
	// login or privilege, the caller's context.
	Final Outcome = iota
	// RolledBack: the server undid the statement; sending it again
	// at once is safe.
	RolledBack
	// Refused: nothing was applied, and the server cannot run the
	// statement now (read-only during a failover, too many connections, no
	// server listening); it may later.
	Refused
	// Unknown: the statement may or may not have committed (the
	// connection broke); a retry with the same token gives the answer the
	// first attempt would have.
	Unknown
)

// Classify tells what err says about the statement that returned it. A
// server error not named here is final: the server answered, and its answer
// will not change by itself.
func Classify(err error) Outcome {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return Final
	}
	if n, ok := Errno(err); ok {
		switch n {
		case Deadlock, LockWaitTimeout, GRRollback, GRHookRollback, RecordChanged,
			TiDBWriteConflict, QueryInterrupted, StatementTimeout, QueryTimeout:
			return RolledBack
		case ErrorDuringCommit:
			// Handler error 149 is HA_ERR_LOCK_DEADLOCK: the commit was
			// refused and the transaction undone. Another handler error
			// at commit leaves the outcome to be found out.
			if strings.Contains(err.Error(), "error 149") {
				return RolledBack
			}
			return Unknown
		case OptionPrevents, ReadOnlyTx, ReadOnlyMode, ConCount, WsrepNotReady:
			return Refused
		case OutOfRange:
			if GuardExpr(err.Error()) != "" {
				// The connection's session refused the statement; another
				// connection of the pool, or the same one later, may not.
				return Refused
			}
		case ConnectionKilled, ServerShutdown, ClientIdleTimeout:
			return Unknown
		}
		if n >= NetReadError && n <= NetWriteInterrupt {
			return Unknown
		}
		return Final
	}
	var (
		opErr  *net.OpError
		dnsErr *net.DNSError
		netErr net.Error
	)
	switch {
	case errors.As(err, &opErr) && opErr.Op == "dial", errors.As(err, &dnsErr):
		// No connection, so nothing was sent.
		return Refused
	case errors.Is(err, driver.ErrBadConn),
		errors.Is(err, io.EOF),
		errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE),
		errors.Is(err, syscall.ECONNREFUSED),
		errors.As(err, &netErr),
		isBrokenConn(err):
		return Unknown
	}
	return Final
}

// brokenConnTexts are go-sql-driver/mysql's errors for a connection that
// broke or lost its place in the protocol (ErrInvalidConn, ErrPktSync,
// ErrPktSyncMul, ErrMalformPkt, ErrBusyBuffer): the statement's outcome is
// unknown. The library imports no driver, so it knows them by their text.
var brokenConnTexts = []string{
	"invalid connection",
	"commands out of sync",
	"malformed packet",
	"busy buffer",
}

// isBrokenConn reports whether err is, or wraps, one of the driver errors
// of brokenConnTexts.
func isBrokenConn(err error) bool {
	for ; err != nil; err = errors.Unwrap(err) {
		msg := err.Error()
		for _, t := range brokenConnTexts {
			if strings.HasPrefix(msg, t) {
				return true
			}
		}
	}
	return false
}

// Server errors that come while connecting, before any statement runs.
const (
	ConCount          = 1040 // too many connections
	DBAccessDenied    = 1044
	AccessDenied      = 1045
	BadDB             = 1049
	HostIsBlocked     = 1129
	HostNotPrivileged = 1130
	AccessDeniedNoPwd = 1698
	AccountLocked     = 3118
)

// IsConnectError reports whether err came from opening a connection: a
// refused dial, a wrong password, an unknown database.
func IsConnectError(err error) bool {
	if n, ok := Errno(err); ok {
		switch n {
		case ConCount, DBAccessDenied, AccessDenied, BadDB, HostIsBlocked,
			HostNotPrivileged, AccessDeniedNoPwd, AccountLocked:
			return true
		}
		return false
	}
	var opErr *net.OpError
	return errors.As(err, &opErr) && opErr.Op == "dial"
}

// guardMark begins the session guard's expression in the text of the error
// 1690 it raises (queries.sql, the session guard), after its opening
// parentheses; no other statement's does (theirs end with the number).
// TiDB folds the constant parts first, so there the number is followed by
// what remained: "(18446744073709551615 + 1)" for autocommit off, or the
// clock's test.
const guardMark = "18446744073709551615 + "

// readOnlyMark begins the read-only term of the guard in the same way: a
// signed number, so that the error names it apart from the session's.
const readOnlyMark = "9223372036854775807 + "

// GuardExpr returns the expression an error 1690's text says is out of
// range, when it is the session guard's, and "" otherwise. Only that
// quoted expression is read: through Vitess the text goes on with the
// whole statement, guard included, whatever overflowed.
func GuardExpr(msg string) string {
	const in = "out of range in '"
	i := strings.Index(msg, in)
	if i < 0 {
		return ""
	}
	expr := msg[i+len(in):]
	if j := strings.IndexByte(expr, '\''); j >= 0 {
		expr = expr[:j]
	}
	if e := strings.TrimLeft(expr, "("); !strings.HasPrefix(e, guardMark) && !strings.HasPrefix(e, readOnlyMark) {
		return ""
	}
	return expr
}

// ReadOnlyGuard reports whether err is the guard's 1690 for its read-only
// term: the server was read-only (read_only, super_read_only) when the
// statement ran, which wrote nothing; a refusal like the server's own
// 1290, which an account with SUPER (MariaDB) would not have met.
func ReadOnlyGuard(err error) bool {
	if n, ok := Errno(err); !ok || n != OutOfRange {
		return false
	}
	return strings.HasPrefix(strings.TrimLeft(GuardExpr(err.Error()), "("), readOnlyMark)
}

// ClockGuard reports whether err is the session guard's 1690 for its clock
// test: NOW(6), the statement's start on the session's clock, lay more than
// a second from SYSDATE(6). The statement wrote nothing. A session with a
// clock of its own fails it every time; a statement that waited over a
// second before the test (a starved server, a row another transaction
// locked) fails it once, and sent again need not wait.
func ClockGuard(err error) bool {
	if n, ok := Errno(err); !ok || n != OutOfRange {
		return false
	}
	return strings.Contains(strings.ToLower(GuardExpr(err.Error())), "sysdate")
}
