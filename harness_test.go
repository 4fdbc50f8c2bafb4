package sqllock

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

func mustAcquire(t testing.TB, c *Client, name string, ttl time.Duration) *Lock {
	t.Helper()
	l, err := c.TryAcquire(testCtx(t), name, ttl)
	if err != nil {
		t.Fatalf("TryAcquire(%q): %v", name, err)
	}
	return l
}

func wantErrIs(t testing.TB, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("got %v, want an error wrapping %v", err, target)
	}
}

// checkedTx begins a transaction on c's pool and runs l.Check in it, as a
// holder does before its protected writes: l's lease row stays locked
// until the transaction ends. The test's end rolls it back, if the test
// has not ended it.
func checkedTx(t testing.TB, c *Client, l *Lock) *sql.Tx {
	t.Helper()
	ctx := testCtx(t)
	tx, err := c.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback() })
	if err := l.Check(ctx, tx); err != nil {
		t.Fatalf("Check: %v", err)
	}
	return tx
}

func inspect(t testing.TB, c *Client, name string) Info {
	t.Helper()
	info, err := c.Inspect(testCtx(t), name)
	if err != nil {
		t.Fatalf("Inspect(%q): %v", name, err)
	}
	return info
}

// twoClients returns two Clients on one fresh table, each with a *sql.DB of
// its own, as two processes would have, holding as "a" and "b"; b has
// bOpts too.
func (e *testEnv) twoClients(t testing.TB, bOpts ...Option) (a, b *Client) {
	t.Helper()
	table := e.newTable(t)
	return e.client(t, e.db, table, WithHolder("a")), e.client(t, e.openDB(t), table, append([]Option{WithHolder("b")}, bOpts...)...)
}

// openDBWith opens a *sql.DB on the environment's DSN changed by f.
func (e *testEnv) openDBWith(t testing.TB, f func(*mysql.Config)) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", e.dsnWith(t, f))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// serverAddr is the host:port of the environment's server.
func (e *testEnv) serverAddr(t testing.TB) string {
	t.Helper()
	skipFakeFor(t, e, "it needs the server's TCP address")
	cfg, err := mysql.ParseDSN(e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Addr
}

// pollAcquire makes b try to take name until it succeeds and returns when
// the successful attempt was sent: the takeover committed after that.
func pollAcquire(t *testing.T, b *Client, name string, ttl time.Duration) (*Lock, time.Time) {
	t.Helper()
	ctx := testCtx(t)
	for {
		sent := time.Now()
		l, err := b.TryAcquire(ctx, name, ttl)
		if err == nil {
			return l, sent
		}
		wantErrIs(t, err, ErrNotAcquired)
		time.Sleep(2 * time.Millisecond)
	}
}

// isolationLevels are the levels a session may run at, as the server's
// isolation variable spells them.
var isolationLevels = []string{"READ-COMMITTED", "REPEATABLE-READ", "SERIALIZABLE"}

// isolated returns a *sql.DB on the environment's DSN whose sessions run at
// level (one of isolationLevels).
func (e *testEnv) isolated(t testing.TB, level string) *sql.DB {
	t.Helper()
	if level == "SERIALIZABLE" && e.server.TiDB {
		t.Skipf("%s is %s: TiDB refuses SERIALIZABLE (error 8048)", e.server.Label, e.server.Version)
	}
	return e.openDBWith(t, func(c *mysql.Config) { setParam(c, isolationVariable(e.server), "'"+level+"'") })
}

// guardUnsafe reports whether a Note 1592's reason is one the session guard
// gives: a system variable (@@autocommit) or a system function (SYSDATE()).
func guardUnsafe(msg string) bool {
	return strings.Contains(msg, "system variable") || strings.Contains(msg, "system function")
}

// stuckLimit is how long a call may take, in these tests, before it counts
// as held up by another that waits on a stalled connection.
const stuckLimit = 20 * time.Second

// within runs f in a goroutine and returns its error, failing the test if f
// has not returned after stuckLimit.
func within(t *testing.T, what string, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(stuckLimit):
		t.Fatalf("%s still blocked after %v", what, stuckLimit)
		return nil
	}
}

// waitCommand waits until the proxy has received a command with code since
// its counts were reset.
func waitCommand(t *testing.T, p *proxy, code byte) {
	t.Helper()
	waitFor(t, stuckLimit, fmt.Sprintf("command 0x%02x at the proxy", code), func() bool {
		return p.Commands()[code] > 0
	})
}

// stalledClient returns a fresh Client whose every connection goes through
// a proxy, and the proxy, stalled; the stall ends when the test does.
func stalledClient(t *testing.T, e *testEnv) (*Client, *proxy) {
	t.Helper()
	c, p := e.proxiedClient(t, e.newTable(t))
	// A connection in the pool, so that the Client's first command reaches
	// the proxy; a new connection's handshake would stall before it.
	if err := c.db.PingContext(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	p.ResetCounts()
	p.Stall(true)
	t.Cleanup(func() { p.Stall(false) })
	return c, p
}

// countingConnector connects to the environment's server and counts the
// connections open at once, and the most there ever were.
type countingConnector struct {
	driver.Connector
	open, most, dials atomic.Int64
}

func (cc *countingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	c, err := cc.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	cc.dials.Add(1)
	n := cc.open.Add(1)
	for m := cc.most.Load(); n > m && !cc.most.CompareAndSwap(m, n); m = cc.most.Load() {
	}
	return &countedConn{passConn: passConn{c}, cc: cc}, nil
}

type countedConn struct {
	passConn
	cc     *countingConnector
	closed atomic.Bool
}

func (c *countedConn) Close() error {
	if !c.closed.Swap(true) {
		c.cc.open.Add(-1)
	}
	return c.Conn.Close()
}

func (c *countedConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	return c.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, query)
}

func (c *countedConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	return c.Conn.(driver.QueryerContext).QueryContext(ctx, query, args)
}

func (c *countedConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	return c.Conn.(driver.ExecerContext).ExecContext(ctx, query, args)
}

// countedDB opens the environment's server with database/sql's default
// pool (no limit on open connections, two kept idle), counting connections.
func (e *testEnv) countedDB(t *testing.T) (*sql.DB, *countingConnector) {
	t.Helper()
	cc := &countingConnector{Connector: e.quietConnector(t, func(*mysql.Config) {})}
	db := sql.OpenDB(cc)
	t.Cleanup(func() { db.Close() })
	return db, cc
}

// ctx returns a context that ends with the test, at most a minute on.
func testCtx(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// waitFor polls cond every few milliseconds until it holds, failing the test
// after limit.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("still waiting after %v for %s", limit, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// warm makes each Client's first use now, so that a test's timing starts
// from warm Clients: a first use proves the server in several statements,
// which take seconds on a loaded machine and would eat a short lease or
// lock-delay the test measures.
func warm(t testing.TB, cs ...*Client) {
	t.Helper()
	for _, c := range cs {
		if err := mustAcquire(t, c, "warm-up", time.Minute).Release(testCtx(t)); err != nil {
			t.Fatalf("warm-up release: %v", err)
		}
	}
}

// lostForNoRenewal reports whether cause is the loss a keep-alive reports
// when no renewal answered before its deadline (ErrLockLost, "no renewal
// of"), rather than a lease found gone (ErrNotHeld): on a loaded machine a
// short lease is lost so, rightly, and a test of something else makes its
// setup again with a longer lease.
func lostForNoRenewal(cause error) bool {
	return errors.Is(cause, ErrLockLost) && !errors.Is(cause, ErrNotHeld) && strings.Contains(cause.Error(), "no renewal of")
}
