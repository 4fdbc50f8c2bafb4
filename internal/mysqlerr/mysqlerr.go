// Package mysqlerr holds server errors as go-sql-driver/mysql returns them,
// for the tests of how sqllock reads a failed statement (internal/fault)
// and acts on it. The library itself imports no driver.
package mysqlerr

import "github.com/go-sql-driver/mysql"

// New returns the driver's error for server error n with SQLSTATE state.
func New(n uint16, state, msg string) *mysql.MySQLError {
	e := &mysql.MySQLError{Number: n, Message: msg}
	copy(e.SQLState[:], state)
	return e
}

// Errors the tests provoke by name, each with a real server's text.
var (
	Deadlock      = New(1213, "40001", "Deadlock found when trying to get lock; try restarting transaction")
	LockWait      = New(1205, "HY000", "Lock wait timeout exceeded; try restarting transaction")
	GRRollback    = New(3101, "HY000", "Plugin instructed the server to rollback the current transaction.")
	GRCommit      = New(1180, "HY000", "Got error 149 - 'Lock deadlock; Retry transaction' during COMMIT")
	RecordChanged = New(1020, "HY000", "Record has changed since last read in table 'sqllock'")
	TiDBConflict  = New(9007, "HY000", "Write conflict, txnStartTS=1, conflictStartTS=2, conflictCommitTS=3, key={tableID=1} primary=? [try again later]")
	ReadOnly      = New(1290, "HY000", "The MySQL server is running with the --super-read-only option so it cannot execute this statement")
	Syntax        = New(1064, "42000", "You have an error in your SQL syntax")
	NoSuchTable   = New(1146, "42S02", "Table 'test.my_locks' doesn't exist")
	// The session guard's refusals (queries.sql), as MySQL words them.
	GuardClock      = New(1690, "22003", "BIGINT UNSIGNED value is out of range in '((18446744073709551615 + (0 = 0)) + (abs(timestampdiff(MICROSECOND,now(6),sysdate(6))) > 1000000))'")
	GuardAutocommit = New(1690, "22003", "BIGINT UNSIGNED value is out of range in '(18446744073709551615 + (1 = 0))'")
)
