package sqllock

// The loops that keep trying (Elect, Acquire's polling, Once, the
// keep-alive) go on through errors that may pass and stop on final ones.
// sqlmock gives the errors a failover produces, which a server cannot be
// made to give on demand; TestClassify_realServerErrors checks the classification
// against the errors real servers give.

import (
	"context"
	"database/sql/driver"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock/internal/fault"
)

// passableErrors are errors a failover or restart produces that applied
// nothing: none of them may end a loop that keeps trying. (Errors with an
// unknown outcome pass too; the fault tests give them through a proxy.)
var passableErrors = []struct {
	name string
	err  error
}{
	{"super read only", errReadOnly},
	{"read-only transaction", mysqlErr(1792, "25006", "Cannot execute statement in a READ ONLY transaction")},
	{"too many connections", mysqlErr(1040, "08004", "Too many connections")},
	{"dial refused", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}},
}

func emptyInspect() *sqlmock.Rows {
	return sqlmock.NewRows([]string{"holder", "fence", "held", "ttl", "ahead", "min_hold"})
}

// passedDeadline is a context whose deadline has passed while its timer has
// not yet fired (ctx.Err() is still nil), as happens for a moment with every
// deadline: a statement cut by it fails before the context says it ended.
type passedDeadline struct{ context.Context }

func (passedDeadline) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

// Each error the server gives here is classified as the loops need: final
// ones end them, the others are retried or waited out.
func TestClassify_realServerErrors(t *testing.T) {
	if os.Getenv(ownServerEnv) != "" {
		soleServer(t, "makes the server read-only and full under "+ownServerEnv)
	}
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		cases := []classifyCase{
			{"no server listening", func(t *testing.T, e *testEnv) error {
				db := e.openDBWith(t, func(c *mysql.Config) { c.Addr = closedAddr(t) })
				_, err := e.client(t, db, "sqllock").TryAcquire(testCtx(t), "job", time.Second)
				return err
			}, fault.Refused},
			{"read-only transaction", func(t *testing.T, e *testEnv) error {
				if e.server.TiDB {
					t.Skip("TiDB has no read-only transactions: transaction_read_only is a no-op function it refuses (1235)")
				}
				skipOnVitess(t, e, vitessNoReadOnly)
				v := "transaction_read_only"
				if e.server.MariaDB {
					v = "tx_read_only" // MariaDB 10.11's name
				}
				table := e.newTable(t)
				db := e.openDBWith(t, func(c *mysql.Config) { setParam(c, v, "1") })
				_, err := e.client(t, db, table).TryAcquire(testCtx(t), "job", time.Second)
				return wantErrno(t, err, 1792)
			}, fault.Refused},
			{"no such table", func(t *testing.T, e *testEnv) error {
				_, err := e.client(t, e.db, "sqllock_no_such_table").TryAcquire(testCtx(t), "job", time.Second)
				return wantErrno(t, err, e.noSuchTable())
			}, fault.Final},
			{"access denied", func(t *testing.T, e *testEnv) error {
				skipOnVitess(t, e, vitessNoAuth)
				db := e.openDBWith(t, func(c *mysql.Config) { c.User, c.Passwd = "sqllock_no_such_user", "wrong" })
				_, err := e.client(t, db, "sqllock").TryAcquire(testCtx(t), "job", time.Second)
				return wantErrno(t, err, 1045)
			}, fault.Final},
			{"statement time limit", statementTimeLimit, fault.RolledBack},
			{"connection killed while a statement runs", func(t *testing.T, e *testEnv) error {
				skipOnVitess(t, e, vitessNoKill)
				ctx := testCtx(t)
				conn, err := e.db.Conn(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close()
				var id int64
				if err := conn.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id); err != nil {
					t.Fatal(err)
				}
				time.AfterFunc(200*time.Millisecond, func() {
					_, _ = e.openDB(t).Exec(fmt.Sprintf("KILL CONNECTION %d", id))
				})
				var n int
				return conn.QueryRowContext(ctx, "SELECT SLEEP(10)").Scan(&n)
			}, fault.Unknown},
			{"idle session closed by the server", func(t *testing.T, e *testEnv) error {
				skipOnVitess(t, e, vitessNoIdleKill)
				ctx := testCtx(t)
				conn, err := e.db.Conn(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close()
				if _, err := conn.ExecContext(ctx, "SET SESSION wait_timeout = 1"); err != nil {
					t.Fatal(err)
				}
				time.Sleep(2500 * time.Millisecond)
				_, err = conn.ExecContext(ctx, "DO 1")
				return err
			}, fault.Unknown},
		}
		if os.Getenv(ownServerEnv) != "" {
			cases = append(cases, ownServerCases...)
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				err := tc.err(t, e)
				if err == nil {
					t.Fatalf("got no error, want one")
				}
				t.Logf("%s gave: %v", e.server.Label, err)
				if got := classify(err); got != tc.want {
					t.Errorf("classify(%v): got %s, want %s", err, outcomeNames[got], outcomeNames[tc.want])
				}
			})
		}
	})
}

// classify adds this package's own errors to fault.Classify.
func TestClassify_ownErrors(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want fault.Outcome
	}{
		{fmt.Errorf("acquire: %w", ErrClosed), fault.Final},
		{fmt.Errorf("acquire: %w", errReadOnlyServer), fault.Refused},
		{errDeadlock, fault.RolledBack},
	} {
		if got := classify(tc.err); got != tc.want {
			t.Errorf("classify(%v): got %d, want %d", tc.err, got, tc.want)
		}
	}
}

// Every error path says "sqllock:" once per message, and still wraps what
// it wraps.
func TestClient_errors_prefixOnce(t *testing.T) {
	errAccess := mysqlErr(1045, "28000", "Access denied for user 'app'@'localhost' (using password: YES)")
	tests := []struct {
		name string
		run  func(t *testing.T, e *mockEnv) error
		is   []error
		want string
	}{
		{"not acquired", func(t *testing.T, e *mockEnv) error {
			e.expectExec("acquire", acquireArgs("job", mockHolder, 60_000_000, &tokenArg{}), okReply(0, 0))
			_, err := e.c.TryAcquire(t.Context(), "job", time.Minute)
			return err
		}, []error{ErrNotAcquired}, "not acquired"},
		{"acquire gave up at the deadline", func(t *testing.T, e *mockEnv) error {
			e.expectExec("acquire", acquireArgs("job", mockHolder, 60_000_000, &tokenArg{}), okReply(0, 0))
			e.c.retry = LinearBackoff(time.Hour) // the context ends first
			ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
			defer cancel()
			_, err := e.c.Acquire(ctx, "job", time.Minute)
			return err
		}, []error{ErrNotAcquired, context.DeadlineExceeded}, `acquire "job": not acquired`},
		{"refresh of a lost lease", func(t *testing.T, e *mockEnv) error {
			l, tok := e.acquired("job")
			e.expectExec("refresh", refreshArgs(60_000_000, "job", tok), okReply(0, 0))
			return l.Refresh(t.Context(), time.Minute)
		}, []error{ErrNotHeld}, "not held"},
		{"release after Close", func(t *testing.T, e *mockEnv) error {
			l, tok := e.acquired("job")
			e.expectExec("release", releaseArgs("job", tok), okReply(0, 1))
			if err := e.c.Close(); err != nil {
				t.Fatalf("Close: got %v, want nil", err)
			}
			return l.Release(t.Context())
		}, []error{ErrClosed, ErrNotHeld}, "client closed: not held"},
		{"Do that lost its lease", func(t *testing.T, e *mockEnv) error {
			tok := &tokenArg{}
			e.expectExec("acquire", acquireArgs("job", mockHolder, 60_000_000, tok), okReply(42, 1))
			e.expectExec("release", releaseArgs("job", tok), okReply(0, 0))
			return e.c.Do(t.Context(), "job", time.Minute, func(_ context.Context, _ *Lock) error { return nil })
		}, []error{ErrLockLost, ErrNotHeld}, "lock lost: not held"},
		{"Once record refused", func(t *testing.T, e *mockEnv) error {
			l, tok := e.acquired("job")
			e.expectExec("once_record", []driver.Value{"job", tok}, okReply(0, 1))
			return l.recordOnce(t.Context())
		}, []error{ErrLockLost, ErrNotHeld}, "lock lost: not held"},
		{"missing table", func(t *testing.T, e *mockEnv) error {
			e.expectPrepareError("acquire", errNoSuchTable)
			_, err := e.c.TryAcquire(t.Context(), "job", time.Minute)
			return err
		}, []error{errNoSuchTable}, "CreateTable"},
		{"wrong password", func(t *testing.T, e *mockEnv) error {
			e.mock.ExpectQuery(firstUseSQL(e.table)).WillReturnError(errAccess)
			_, err := e.c.TryAcquire(t.Context(), "job", time.Minute)
			return err
		}, []error{errAccess}, `acquire "job": connect to the server: Error 1045`},
		{"wrong password at prepare", func(t *testing.T, e *mockEnv) error {
			e.expectPrepareError("inspect", errAccess)
			_, err := e.c.Inspect(t.Context(), "job")
			return err
		}, []error{errAccess}, `inspect "job": connect to the server: Error 1045`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newMockEnv(t)
			err := tt.run(t, e)
			assertPrefixOnce(t, err)
			assertErrIs(t, err, tt.is...)
			assertErrContains(t, err, tt.want)
		})
	}
}

// classifyCase is an error a real server gave, and the class it must have.
type classifyCase struct {
	name string
	err  func(t *testing.T, e *testEnv) error
	want fault.Outcome
}

var outcomeNames = map[fault.Outcome]string{fault.Final: "final", fault.RolledBack: "rolled back", fault.Refused: "refused", fault.Unknown: "unknown"}

// wantErrno fails the test unless err carries server error n, and returns
// err.
func wantErrno(t *testing.T, err error, n int) error {
	t.Helper()
	if got, ok := fault.Errno(err); !ok || got != n {
		t.Fatalf("got %v, want server error %d", err, n)
	}
	return err
}

// statementTimeLimit makes the server end a statement for its time limit:
// MariaDB's max_statement_time (1969), MySQL's max_execution_time, which
// ends only SELECTs (3024).
func statementTimeLimit(t *testing.T, e *testEnv) error {
	if e.server.TiDB {
		// Twice in one day, under CI's load, TiDB let this query run past
		// the test's minute. The errno is MySQL's, and classify reads only
		// the errno: MySQL 9.7 proves it.
		t.Skip("TiDB's MAX_EXECUTION_TIME does not always interrupt this query in time; 3024 is proven on MySQL")
	}
	const heavy = "SELECT COUNT(*) FROM information_schema.COLUMNS a, information_schema.COLUMNS b, information_schema.COLUMNS c"
	q, errno := "SELECT /*+ MAX_EXECUTION_TIME(20) */"+heavy[len("SELECT"):], 3024
	if e.server.MariaDB {
		q, errno = "SET STATEMENT max_statement_time = 0.02 FOR "+heavy, 1969
	}
	var n int64
	return wantErrno(t, e.db.QueryRowContext(testCtx(t), q).Scan(&n), errno)
}

// ownServerCases change the server's global variables: only on the tests'
// own server.
var ownServerCases = []classifyCase{
	{"read-only server", func(t *testing.T, e *testEnv) error {
		table := e.newTable(t)
		db := limitedUser(t, e, table)
		setGlobal(t, e, "read_only", "ON", "OFF")
		// The server's own refusal, which the first use's proof would
		// find first (TestClient_firstUse_refusesReadOnlyServer).
		c := e.client(t, db, table)
		c.markProven()
		_, err := c.TryAcquire(testCtx(t), "job", time.Second)
		return wantErrno(t, err, 1290)
	}, fault.Refused},
	{"too many connections", func(t *testing.T, e *testEnv) error {
		table := e.newTable(t)
		db := limitedUser(t, e, table)
		// MariaDB's least max_connections is 10: hold that many open, so
		// that the next login of an account without administrative
		// privileges is refused.
		setGlobal(t, e, "max_connections", "10", "151")
		for {
			var (
				name string
				n    int
			)
			if err := e.db.QueryRow("SHOW GLOBAL STATUS LIKE 'Threads_connected'").Scan(&name, &n); err != nil {
				t.Fatal(err)
			}
			if n >= 10 {
				break
			}
			conn, err := e.db.Conn(testCtx(t))
			if err != nil {
				t.Fatal(err)
			}
			if err := conn.PingContext(testCtx(t)); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { conn.Close() })
		}
		_, err := e.client(t, db, table).TryAcquire(testCtx(t), "job", time.Second)
		return wantErrno(t, err, 1040)
	}, fault.Refused},
}
