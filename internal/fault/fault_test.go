package fault

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock/internal/mysqlerr"
)

func TestServerErrno(t *testing.T) {
	tests := []struct {
		name   string
		err    error
		want   int
		wantOK bool
	}{
		{"MySQLError", mysqlerr.Deadlock, 1213, true},
		{"MySQLError without SQLSTATE", &mysql.MySQLError{Number: 1205, Message: "Lock wait timeout"}, 1205, true},
		{"wrapped", fmt.Errorf("exec: %w", mysqlerr.NoSuchTable), 1146, true},
		{"wrapped twice", fmt.Errorf("a: %w", fmt.Errorf("b: %w", mysqlerr.GRRollback)), 3101, true},
		{"text", errors.New("Error 1213 (40001): Deadlock found"), 1213, true},
		{"text without SQLSTATE", errors.New("Error 1205: Lock wait timeout exceeded"), 1205, true},
		{"text not at the start", errors.New("exec: Error 1213 (40001): Deadlock found"), 0, false},
		{"lowercase", errors.New("error 1213: deadlock"), 0, false},
		{"no number", errors.New("Error : nothing"), 0, false},
		{"nil", nil, 0, false},
		{"io.EOF", io.EOF, 0, false},
		{"random", errors.New("something broke"), 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := Errno(tt.err)
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("Errno(%v): got %d, %v, want %d, %v", tt.err, got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

func TestClassify(t *testing.T) {
	name := map[Outcome]string{Final: "final", RolledBack: "rolled back", Refused: "refused", Unknown: "unknown"}
	tests := []struct {
		name string
		err  error
		want Outcome
	}{
		{"deadlock", mysqlerr.Deadlock, RolledBack},
		{"lock wait timeout", mysqlerr.LockWait, RolledBack},
		{"group replication", mysqlerr.GRRollback, RolledBack},
		{"query interrupted", mysqlerr.New(1317, "70100", "Query execution was interrupted"), RolledBack},
		{"wrapped deadlock", fmt.Errorf("exec: %w", mysqlerr.Deadlock), RolledBack},
		{"deadlock as text", errors.New("Error 1213 (40001): Deadlock found"), RolledBack},
		{"GR commit conflict", mysqlerr.GRCommit, RolledBack},
		{"GR commit hook", mysqlerr.New(3100, "HY000", "Error on observer while running replication hook 'before_commit'."), RolledBack},
		{"other error during commit", mysqlerr.New(1180, "HY000", "Got error 28 \"No space left on device\" during COMMIT"), Unknown},
		{"record changed", mysqlerr.RecordChanged, RolledBack},
		{"TiDB write conflict", mysqlerr.TiDBConflict, RolledBack},
		{"MariaDB statement time limit", mysqlerr.New(1969, "70100", "Query execution was interrupted (max_statement_time exceeded)"), RolledBack},
		{"MySQL statement time limit", mysqlerr.New(3024, "HY000", "Query execution was interrupted, maximum statement execution time exceeded"), RolledBack},
		{"super read only", mysqlerr.ReadOnly, Refused},
		{"read-only transaction", mysqlerr.New(1792, "25006", "Cannot execute statement in a READ ONLY transaction"), Refused},
		{"read-only mode", mysqlerr.New(1836, "HY000", "Running in read-only mode"), Refused},
		{"too many connections", mysqlerr.New(1040, "08004", "Too many connections"), Refused},
		{"Galera node not ready", mysqlerr.New(1047, "08S01", "WSREP has not yet prepared node for application use"), Refused},
		{"dial refused", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, Refused},
		{"wrapped dial timeout", fmt.Errorf("connect: %w", &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}), Refused},
		{"no such host", &net.DNSError{Err: "no such host", Name: "db", IsNotFound: true}, Refused},
		{"server shutdown", mysqlerr.New(1053, "08S01", "Server shutdown in progress"), Unknown},
		{"network read error", mysqlerr.New(1158, "08S01", "Got an error reading communication packets"), Unknown},
		{"packets out of order", mysql.ErrPktSync, Unknown},
		{"packets out of order, multi", mysql.ErrPktSyncMul, Unknown},
		{"malformed packet", mysql.ErrMalformPkt, Unknown},
		{"busy buffer", mysql.ErrBusyBuffer, Unknown},
		{"packet too large", mysql.ErrPktTooLarge, Final},
		{"access denied", mysqlerr.New(1045, "28000", "Access denied for user 'app'@'localhost' (using password: YES)"), Final},
		{"command denied", mysqlerr.New(1142, "42000", "INSERT command denied to user 'app'@'localhost' for table 'sqllock'"), Final},
		{"unknown column", mysqlerr.New(1054, "42S22", "Unknown column 'kind' in 'field list'"), Final},
		{"connection killed", mysqlerr.New(1927, "70100", "Connection was killed"), Unknown},
		{"idle timeout", mysqlerr.New(4031, "HY000", "The client was disconnected by the server"), Unknown},
		{"syntax", mysqlerr.Syntax, Final},
		{"no such table", mysqlerr.NoSuchTable, Final},
		{"duplicate key", mysqlerr.New(1062, "23000", "Duplicate entry"), Final},
		{"io.EOF", io.EOF, Unknown},
		{"io.ErrUnexpectedEOF", io.ErrUnexpectedEOF, Unknown},
		{"driver.ErrBadConn", driver.ErrBadConn, Unknown},
		{"wrapped driver.ErrBadConn", fmt.Errorf("exec: %w", driver.ErrBadConn), Unknown},
		{"mysql.ErrInvalidConn", mysql.ErrInvalidConn, Unknown},
		{"ECONNRESET", syscall.ECONNRESET, Unknown},
		{"EPIPE", syscall.EPIPE, Unknown},
		{"net.OpError", &net.OpError{Op: "read", Net: "tcp", Err: errors.New("reset")}, Unknown},
		{"i/o timeout", os.ErrDeadlineExceeded, Unknown},
		{"context.Canceled", context.Canceled, Final},
		{"context.DeadlineExceeded", context.DeadlineExceeded, Final},
		{"wrapped context.Canceled", fmt.Errorf("exec: %w", context.Canceled), Final},
		{"random", errors.New("something broke"), Final},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Classify(tt.err); got != tt.want {
				t.Errorf("Classify(%v): got %v, want %v", tt.err, name[got], name[tt.want])
			}
		})
	}
}
