package sqllock

import (
	"database/sql"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// faultEnv is a Client whose connections pass through a proxy, and a witness
// Client on the same table that connects directly.
type faultEnv struct {
	p       *proxy
	c       *Client // through the proxy
	witness *Client
	table   string
	vitess  bool // through vtgate (vitess_test.go)
}

func newFaultEnv(t *testing.T, e *testEnv) *faultEnv {
	t.Helper()
	table := e.newTable(t)
	p := startProxy(t, e.serverAddr(t))
	db := e.openDBWith(t, func(c *mysql.Config) {
		c.Addr = p.Addr()
		c.TLS, c.TLSConfig = nil, "false"
	})
	return &faultEnv{p: p, c: e.client(t, db, table, WithHolder("faulty")), witness: e.client(t, e.openDB(t), table, WithHolder("witness")), table: table, vitess: e.server.Vitess}
}

// wantHeldBy checks, through the witness, that l's lease is live on the
// server with l's fence, and that nobody else can take it.
func (f *faultEnv) wantHeldBy(t *testing.T, l *Lock) {
	t.Helper()
	if got := inspect(t, f.witness, l.Name()); !got.Held || got.Fence != l.Fence() || got.Holder != "faulty" {
		t.Fatalf("Inspect(%q): got %+v, want held by faulty with fence %d", l.Name(), got, l.Fence())
	}
	_, err := f.witness.TryAcquire(testCtx(t), l.Name(), time.Minute)
	wantErrIs(t, err, ErrNotAcquired)
}

// wantFree checks that the witness can take name, with a fence above after.
func (f *faultEnv) wantFree(t *testing.T, name string, after uint64) {
	t.Helper()
	l := mustAcquire(t, f.witness, name, time.Minute)
	if l.Fence() <= after {
		t.Fatalf("witness got fence %d, want above %d", l.Fence(), after)
	}
	if err := l.Release(testCtx(t)); err != nil {
		t.Fatalf("witness Release: %v", err)
	}
}

// wantRetried checks that the statement was sent again after the cut, so
// that the test exercised the retry and not a lucky first reply.
func (f *faultEnv) wantRetried(t *testing.T) {
	t.Helper()
	if n := f.p.Commands()[proxyComStmtExecute]; n < 2 {
		t.Fatalf("statements executed through the cut: got %d, want the cut one and a retry", n)
	}
}

// killEnv is a Client whose pool holds one connection, so that the server's
// id of that connection is the Client's, and a direct connection to kill it.
type killEnv struct {
	c, witness *Client
	db, admin  *sql.DB
}

func newKillEnv(t *testing.T, e *testEnv) *killEnv {
	t.Helper()
	skipOnVitess(t, e, vitessNoKill)
	table := e.newTable(t)
	db := e.openDB(t)
	db.SetMaxOpenConns(1)
	return &killEnv{c: e.client(t, db, table, WithHolder("faulty")), witness: e.client(t, e.openDB(t), table, WithHolder("witness")), db: db, admin: e.openDB(t)}
}

// connID returns the server's id of the Client's one connection.
func (k *killEnv) connID(t *testing.T) int64 {
	t.Helper()
	var id int64
	if err := k.db.QueryRowContext(testCtx(t), "SELECT CONNECTION_ID()").Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

func (k *killEnv) kill(t *testing.T, id int64) {
	t.Helper()
	// MySQL takes no placeholder in KILL (error 6413: dynamic parameters
	// only in DML); MariaDB does. The id is a number read from the server.
	if _, err := k.admin.ExecContext(testCtx(t), fmt.Sprintf("KILL CONNECTION %d", id)); err != nil {
		t.Fatalf("KILL CONNECTION %d: %v", id, err)
	}
}

// blockRow holds the row lock on name's lease row in a transaction of its
// own until the returned function commits it, so that a statement on that
// row waits.
func (k *killEnv) blockRow(t *testing.T, table, name string) func() {
	t.Helper()
	ctx := testCtx(t)
	tx, err := k.admin.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+table+"` WHERE name = ? AND kind = 'L' FOR UPDATE", name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	commit := func() {
		once.Do(func() {
			if err := tx.Commit(); err != nil {
				t.Errorf("commit: %v", err)
			}
		})
	}
	t.Cleanup(commit)
	return commit
}

// waitRunning waits until connection id runs a statement on the server.
func (k *killEnv) waitRunning(t *testing.T, id int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := scanProcesslist(testCtx(t), k.admin, "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ? AND INFO IS NOT NULL", []any{id}, &n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("connection %d ran no statement within 10s", id)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// restartEnv names the command that restarts the test server; the restart
// test runs only when it is set, so a user's server is never restarted
// unless they ask. .ci/run sets it to scripts/testdb restart SERVER, for one
// private server at a time.
const restartEnv = "SQLLOCK_TEST_RESTART_CMD"

func serverUptime(t *testing.T, db *sql.DB) int64 {
	t.Helper()
	var name string
	var up int64
	if err := db.QueryRowContext(testCtx(t), "SHOW GLOBAL STATUS LIKE 'Uptime'").Scan(&name, &up); err != nil {
		t.Fatalf("uptime: %v", err)
	}
	return up
}

func serverNow(t *testing.T, db *sql.DB) float64 {
	t.Helper()
	var now float64
	if err := db.QueryRowContext(testCtx(t), "SELECT UNIX_TIMESTAMP(NOW(6))").Scan(&now); err != nil {
		t.Fatalf("server clock: %v", err)
	}
	return now
}

// A serverStart is when the server started, by its own clock, in seconds,
// read as now minus Uptime. Uptime counts whole seconds, so a reading is
// up to a second late and two readings of one run of the server differ by
// a little over a second at most.
type serverStart float64

// startBeforeRestart reads when the server started, once it has been up for
// restartGap: then a restart after the reading moves the start on by more
// than restartGap less a second, which no second reading of the same run
// can (a server restarted a moment ago and again quickly can read the same
// Uptime both times, so Uptime alone cannot tell).
func startBeforeRestart(t *testing.T, db *sql.DB) serverStart {
	t.Helper()
	for serverUptime(t, db) < restartGap {
		time.Sleep(200 * time.Millisecond)
	}
	// The clock first, Uptime second: the reading is not early.
	now := serverNow(t, db)
	return serverStart(now - float64(serverUptime(t, db)))
}

const restartGap = 4

// wantRestarted fails the test unless the server started again after
// before was read.
func wantRestarted(t *testing.T, db *sql.DB, before serverStart) {
	t.Helper()
	// Uptime first, the clock second: the reading is not early.
	up := serverUptime(t, db)
	after := serverStart(serverNow(t, db) - float64(up))
	t.Logf("server started at %.1f before the restart, %.1f after (up %ds)", float64(before), float64(after), up)
	if after-before < restartGap/2 {
		t.Fatalf("the server's start moved by %.1fs across the restart (up %ds now): it did not restart", float64(after-before), up)
	}
}
