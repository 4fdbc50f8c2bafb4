package sqllock

// The loops that keep trying (Elect, Acquire's polling, Once, the
// keep-alive) go on through errors that may pass and stop on final ones.
// sqlmock gives the errors a failover produces, which a server cannot be
// made to give on demand; errors_server_test.go checks the classification
// against the errors real servers give.

import (
	"context"
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
	return sqlmock.NewRows([]string{"holder", "fence", "held", "ttl", "ahead"})
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
