package sqllock

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"sync/atomic"
	"testing"

	"github.com/go-sql-driver/mysql"
)

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
