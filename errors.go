package sqllock

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Errors compared with [errors.Is]. An error that wraps one of them says
// more about what happened (which name, which driver error).
var (
	// ErrNotAcquired means another owner holds a live lease on the name.
	ErrNotAcquired = errors.New("sqllock: not acquired")
	// ErrNotHeld means the lease is no longer this Lock's: it expired and
	// someone else took the name over, or it was already released.
	ErrNotHeld = errors.New("sqllock: not held")
	// ErrClosed means the Client was closed.
	ErrClosed = errors.New("sqllock: client closed")
)

// Server error numbers sqllock acts on.
const (
	// Rolled back: the server undid the statement, and it may be sent
	// again at once with the same token.
	erLockWaitTimeout   = 1205 // InnoDB lock wait timeout
	erLockDeadlock      = 1213 // deadlock, or a Galera certification conflict
	erGRRollback        = 3101 // Group Replication rolled the transaction back
	erGRHookRollback    = 3100 // Group Replication refused the commit (member leaving the group)
	erErrorDuringCommit = 1180 // "Got error 149 ... during COMMIT": a Group Replication multi-primary conflict
	erRecordChanged     = 1020 // MariaDB 11.6+ snapshot isolation: "Record has changed since last read"
	erTiDBWriteConflict = 9007 // TiDB write conflict
	erQueryInterrupted  = 1317
	erStatementTimeout  = 1969 // MariaDB max_statement_time
	erQueryTimeout      = 3024 // MySQL max_execution_time

	// Refused: the server ran nothing and cannot now (a failover, a full
	// server); the same statement may succeed later, here or on the node
	// that takes over.
	// Too many connections (erConCount) too.
	erOptionPrevents = 1290 // --read-only, --super-read-only
	erReadOnlyTx     = 1792 // a read-only transaction
	erReadOnlyMode   = 1836 // innodb_read_only and the like
	erWsrepNotReady  = 1047 // Galera: the node is not in the primary component

	// Unknown: the connection ended while the statement may have run.
	erServerShutdown    = 1053
	erConnectionKilled  = 1927 // MariaDB: KILL CONNECTION while the statement ran
	erClientIdleTimeout = 4031 // MySQL 8.0: the server closed an idle session
	erNetReadError      = 1158 // 1158 to 1161: the server's reads or writes of the connection failed
	erNetWriteInterrupt = 1161

	// Final, with a hint of their own in serverError.
	erNoSuchTable = 1146
	erBadField    = 1054 // unknown column
	erUnknown     = 1105 // vtgate's own errors: "table X not found" when its vschema lacks the table

	// A server that refuses GET_LOCK (MariaDB Galera with wsrep on): the
	// Client's wake-up channels stay off (wake.go).
	erNotSupportedYet = 1235
)

// maxTransientAttempts bounds how often one operation sends its statement
// when the connection breaks: the server may be gone, and each attempt may
// wait for a connection.
const maxTransientAttempts = 4

// maxRetryBudget bounds how long one operation goes on sending its statement
// while the server rolls it back (deadlocks, cluster certification
// conflicts), when its context has no sooner deadline.
const maxRetryBudget = 5 * time.Second

// serverErrno returns the MySQL error number err carries, if it carries one.
// The library imports no driver, so it reads the number from the text every
// MySQL driver for Go prints: "Error 1213 (40001): Deadlock found ...".
func serverErrno(err error) (int, bool) {
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

// outcome says what a failed statement may have done on the server, and so
// whether trying again can help.
type outcome int

const (
	// failedFinal: the error is the answer, and trying again cannot change
	// it: a closed Client, bad input, a missing table or column, a refused
	// login or privilege, the caller's context.
	failedFinal outcome = iota
	// failedRolledBack: the server undid the statement; sending it again
	// at once is safe.
	failedRolledBack
	// failedRefused: nothing was applied, and the server cannot run the
	// statement now (read-only during a failover, too many connections, no
	// server listening); it may later.
	failedRefused
	// failedUnknown: the statement may or may not have committed (the
	// connection broke); a retry with the same token gives the answer the
	// first attempt would have.
	failedUnknown
)

// passable reports whether err may pass: whether a loop that keeps trying
// (Elect, Acquire's polling, Once, a keep-alive) should go on after it.
func passable(err error) bool { return classify(err) != failedFinal }

// classify tells what err says about the statement that returned it. A
// server error not named here is final: the server answered, and its answer
// will not change by itself.
func classify(err error) outcome {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrClosed) {
		return failedFinal
	}
	if n, ok := serverErrno(err); ok {
		switch n {
		case erLockDeadlock, erLockWaitTimeout, erGRRollback, erGRHookRollback, erRecordChanged,
			erTiDBWriteConflict, erQueryInterrupted, erStatementTimeout, erQueryTimeout:
			return failedRolledBack
		case erErrorDuringCommit:
			// Handler error 149 is HA_ERR_LOCK_DEADLOCK: the commit was
			// refused and the transaction undone. Another handler error
			// at commit leaves the outcome to be found out.
			if strings.Contains(err.Error(), "error 149") {
				return failedRolledBack
			}
			return failedUnknown
		case erOptionPrevents, erReadOnlyTx, erReadOnlyMode, erConCount, erWsrepNotReady:
			return failedRefused
		case erConnectionKilled, erServerShutdown, erClientIdleTimeout:
			return failedUnknown
		}
		if n >= erNetReadError && n <= erNetWriteInterrupt {
			return failedUnknown
		}
		return failedFinal
	}
	var (
		opErr  *net.OpError
		dnsErr *net.DNSError
		netErr net.Error
	)
	switch {
	case errors.As(err, &opErr) && opErr.Op == "dial", errors.As(err, &dnsErr):
		// No connection, so nothing was sent.
		return failedRefused
	case errors.Is(err, driver.ErrBadConn),
		errors.Is(err, io.EOF),
		errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE),
		errors.Is(err, syscall.ECONNREFUSED),
		errors.As(err, &netErr),
		isBrokenConn(err):
		return failedUnknown
	}
	return failedFinal
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

// prefix starts the text of every error the package makes.
const prefix = "sqllock: "

// errorf returns fmt.Errorf(format, args...) with the text prefixed by
// "sqllock: " once: an argument that is an error of this package is printed
// without its own prefix, so wrapping [ErrNotHeld] in [ErrLockLost] reads
// "sqllock: lock lost: not held: ...", not "sqllock:" twice. errors.Is and
// errors.As see every %w argument, as with fmt.Errorf. format starts with
// what comes after the prefix.
func errorf(format string, args ...any) error {
	text := make([]any, len(args))
	for i, a := range args {
		if err, ok := a.(error); ok {
			a = strings.TrimPrefix(err.Error(), prefix)
		}
		text[i] = a
	}
	return &prefixedError{
		msg: prefix + fmt.Sprintf(strings.ReplaceAll(format, "%w", "%v"), text...),
		err: fmt.Errorf(format, args...),
	}
}

// prefixedError is an error made by errorf: its own text, and the
// fmt.Errorf error that wraps the arguments.
type prefixedError struct {
	msg string
	err error
}

func (e *prefixedError) Error() string { return e.msg }
func (e *prefixedError) Unwrap() error { return e.err }

// erDupEntry is a duplicate key: Once's record is already there.
const erDupEntry = 1062

// Server errors that come while connecting, before any statement runs.
const (
	erConCount          = 1040 // too many connections
	erDBAccessDenied    = 1044
	erAccessDenied      = 1045
	erBadDB             = 1049
	erHostIsBlocked     = 1129
	erHostNotPrivileged = 1130
	erAccessDeniedNoPwd = 1698
	erAccountLocked     = 3118
)

// isConnectError reports whether err came from opening a connection: a
// refused dial, a wrong password, an unknown database.
func isConnectError(err error) bool {
	if n, ok := serverErrno(err); ok {
		switch n {
		case erConCount, erDBAccessDenied, erAccessDenied, erBadDB, erHostIsBlocked,
			erHostNotPrivileged, erAccessDeniedNoPwd, erAccountLocked:
			return true
		}
		return false
	}
	var opErr *net.OpError
	return errors.As(err, &opErr) && opErr.Op == "dial"
}
