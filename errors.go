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
	erLockWaitTimeout   = 1205 // InnoDB lock wait timeout; statement rolled back
	erLockDeadlock      = 1213 // deadlock, or a Galera certification conflict; rolled back
	erGRRollback        = 3101 // Group Replication rolled the transaction back
	erNoSuchTable       = 1146
	erBadField          = 1054 // unknown column
	erServerShutdown    = 1053
	erConnectionKilled  = 1927 // MariaDB: KILL CONNECTION while the statement ran
	erQueryInterrupted  = 1317
	erClientIdleTimeout = 4031 // MySQL 8.0: the server closed an idle session
)

// maxTransientAttempts bounds how often one operation sends its statement
// when the server rolls it back or the connection breaks.
const maxTransientAttempts = 4

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

// outcome says what a failed statement may have done on the server.
type outcome int

const (
	// failedFinal: the error is the answer; do not retry.
	failedFinal outcome = iota
	// failedRolledBack: the server undid the statement; retrying is safe.
	failedRolledBack
	// failedUnknown: the statement may or may not have committed (the
	// connection broke); a retry with the same token gives the answer the
	// first attempt would have.
	failedUnknown
)

// classify tells what err says about the statement that returned it.
func classify(err error) outcome {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return failedFinal
	}
	if n, ok := serverErrno(err); ok {
		switch n {
		case erLockDeadlock, erLockWaitTimeout, erGRRollback, erQueryInterrupted:
			return failedRolledBack
		case erConnectionKilled, erServerShutdown, erClientIdleTimeout:
			return failedUnknown
		}
		return failedFinal
	}
	var netErr net.Error
	switch {
	case errors.Is(err, driver.ErrBadConn),
		errors.Is(err, io.EOF),
		errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE),
		errors.Is(err, syscall.ECONNREFUSED),
		errors.As(err, &netErr),
		isInvalidConn(err):
		return failedUnknown
	}
	return failedFinal
}

// isInvalidConn reports whether err is, or wraps, go-sql-driver/mysql's
// ErrInvalidConn: the connection broke before the reply came. The library
// imports no driver, so it knows the error by its text.
func isInvalidConn(err error) bool {
	for ; err != nil; err = errors.Unwrap(err) {
		if err.Error() == "invalid connection" {
			return true
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
