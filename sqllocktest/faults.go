package sqllocktest

import (
	"errors"
	"fmt"
	"strings"
)

// A ServerError is an error as the server sends it, and as
// go-sql-driver/mysql's *mysql.MySQLError prints it: "Error 1213 (40001):
// Deadlock found ...". sqllock reads the number from that text (it imports
// no driver), so it classifies a ServerError as it would the driver's.
type ServerError struct {
	Number   uint16
	SQLState string // five characters; "HY000" when empty
	Message  string
}

func (e ServerError) Error() string {
	state := e.SQLState
	if state == "" {
		state = "HY000"
	}
	return fmt.Sprintf("Error %d (%s): %s", e.Number, state, e.Message)
}

// Server errors a test may inject, as MySQL 8.4 words them. Any other
// ServerError serves as well.
var (
	// Deadlock: the server rolled the statement (and its transaction)
	// back; the library sends it again.
	Deadlock = ServerError{1213, "40001", "Deadlock found when trying to get lock; try restarting transaction"}
	// LockWaitTimeout: a row lock waited too long; rolled back.
	LockWaitTimeout = ServerError{1205, "HY000", "Lock wait timeout exceeded; try restarting transaction"}
	// ReadOnly: a failover made the server read-only; nothing ran.
	ReadOnly = ServerError{1290, "HY000", "The MySQL server is running with the --read-only option so it cannot execute this statement"}
	// TooManyConnections: nothing ran.
	TooManyConnections = ServerError{1040, "08004", "Too many connections"}
	// ServerShutdown: the connection ends as the server stops; the outcome
	// is unknown.
	ServerShutdown = ServerError{1053, "08S01", "Server shutdown in progress"}
)

// ErrLostConnection is what a statement returns when its connection broke
// while it ran, as go-sql-driver/mysql's ErrInvalidConn reads ("invalid
// connection"): the client cannot tell whether the statement committed.
// Inject it with [Fault], choosing with Applied what the server did.
var ErrLostConnection = errors.New("invalid connection")

// A Fault makes a statement fail, once: the next statement of the kind
// Statement names, on any connection. Inject queues it with [Server.Inject].
type Fault struct {
	// Statement is the name of a statement in sqllock's queries.sql
	// ("acquire", "refresh", "release", "check", "inspect", ...), or one
	// of the fake's own ("schema", "version"), or "" for the next
	// statement of any kind.
	Statement string
	// Err is what the statement returns: a ServerError, or
	// ErrLostConnection, which also breaks the connection (its
	// transaction, if any, rolls back; its GET_LOCK locks are freed).
	Err error
	// Applied runs the statement, and commits it outside a transaction,
	// before Err comes back: a reply lost after the server did the work.
	// Without it nothing is done.
	Applied bool
}

// Inject queues faults, each to fire once, on the first statement it
// matches, in the order given. It returns an error, and queues none, when
// a fault names no statement the fake knows or carries no error.
func (s *Server) Inject(faults ...Fault) error {
	names := statementNames()
	for _, f := range faults {
		if f.Err == nil {
			return fmt.Errorf("sqllocktest: Inject: a Fault for %q with no Err", f.Statement)
		}
		var se ServerError
		if !errors.Is(f.Err, ErrLostConnection) && !errors.As(f.Err, &se) {
			return fmt.Errorf("sqllocktest: Inject: Err %q is neither a ServerError nor ErrLostConnection; a server sends nothing else", f.Err)
		}
		if f.Statement == "" {
			continue
		}
		found := false
		for _, n := range names {
			found = found || n == f.Statement
		}
		if !found {
			return fmt.Errorf("sqllocktest: Inject: no statement is called %q; the names are: %s", f.Statement, strings.Join(names, ", "))
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, faults...)
	return nil
}

// Pending returns how many injected faults have not fired yet.
func (s *Server) Pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.faults)
}

// takeFault removes and returns the first fault for statement name; s.mu is
// held.
func (s *Server) takeFault(name string) (Fault, bool) {
	for i, f := range s.faults {
		if f.Statement == "" || f.Statement == name {
			s.faults = append(s.faults[:i:i], s.faults[i+1:]...)
			return f, true
		}
	}
	return Fault{}, false
}

// errTimedOut is a wait that ran out of time.
var errTimedOut = errors.New("sqllocktest: timed out")

// Errors of the server's own.
func errNoTable(table string) error {
	return ServerError{1146, "42S02", fmt.Sprintf("Table '%s.%s' doesn't exist", Database, table)}
}

func errUnknownTable(table string) error {
	return ServerError{1051, "42S02", fmt.Sprintf("Unknown table '%s.%s'", Database, table)}
}

func errDuplicate(table, name string, kind byte) error {
	return ServerError{1062, "23000", fmt.Sprintf("Duplicate entry '%s-%c' for key '%s.PRIMARY'", name, kind, table)}
}

func errOutOfRange(expr string) error {
	return ServerError{1690, "22003", fmt.Sprintf("BIGINT UNSIGNED value is out of range in '%s'", expr)}
}

// errInTransaction is MariaDB's answer to a statement whose session guard
// found a transaction open: the guard's first term, as MariaDB prints it.
var errInTransaction = errOutOfRange("18446744073709551615 + (@@autocommit = 0 or @@in_transaction = 1 and ascii(right(user(),1)) not in (0,64))")

// errTruncated is strict sql_mode's error for a value that does not convert
// to type whole.
func errTruncated(typ, value string) error {
	return ServerError{1292, "22007", fmt.Sprintf("Truncated incorrect %s value: '%s'", typ, value)}
}

// errOverflow is MariaDB's error where MySQL's is errTruncated's for a
// DECIMAL: a value past a BIGINT's range in LAST_INSERT_ID(expr).
func errOverflow(value string) error {
	return ServerError{1916, "22003", fmt.Sprintf("Got overflow when converting '%s' to INT. Value truncated", value)}
}

// errBadBase64 is MariaDB's FROM_BASE64 failing a statement that writes,
// under a strict sql_mode.
func errBadBase64(at int64) error {
	return ServerError{1958, "HY000", fmt.Sprintf("Bad base64 data as position %d", at)}
}

func errNull(column string) error {
	return ServerError{1048, "23000", fmt.Sprintf("Column '%s' cannot be null", column)}
}

func errSyntax(near string) error {
	if len(near) > 80 {
		near = near[:80]
	}
	return ServerError{1064, "42000", fmt.Sprintf("You have an error in your SQL syntax; check the manual that corresponds to your MySQL server version for the right syntax to use near '%s' at line 1", near)}
}

var errReadOnlyTx = ServerError{1792, "25006", "Cannot execute statement in a READ ONLY transaction."}

var errGetLockRefused = ServerError{1235, "42000", "This version of MySQL doesn't yet support 'GET_LOCK on this server (sqllocktest.WithoutGetLock)'"}
