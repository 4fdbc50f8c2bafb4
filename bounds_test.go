package sqllock

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"sync/atomic"
	"testing"

	"github.com/go-sql-driver/mysql"
)

// stallingConnector connects through a proxy and, once armed, stalls the
// proxy (both ways, as a network partition) when a query is sent: the
// statements before it get their replies, the query and all after it wait.
type stallingConnector struct {
	driver.Connector
	p     *proxy
	armed atomic.Bool
}

func (sc *stallingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	c, err := sc.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &stallingConn{countedConn: countedConn{passConn: passConn{c}, cc: &countingConnector{}}, sc: sc}, nil
}

type stallingConn struct {
	countedConn
	sc *stallingConnector
}

func (c *stallingConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if c.sc.armed.Load() {
		c.sc.p.Stall(true)
	}
	return c.countedConn.QueryContext(ctx, query, args)
}

// stallingClient returns a Client on table through a proxy that a
// stallingConnector stalls at the first query once armed; the proxy heals
// in t.Cleanup.
func (e *testEnv) stallingClient(t *testing.T, table string, opts ...Option) (*Client, *stallingConnector) {
	t.Helper()
	p := startProxy(t, e.serverAddr(t))
	sc := &stallingConnector{Connector: e.quietConnector(t, func(c *mysql.Config) {
		c.Addr = p.Addr()
		c.TLS, c.TLSConfig = nil, "false"
	}), p: p}
	db := sql.OpenDB(sc)
	t.Cleanup(func() { p.Stall(false); db.Close() })
	return e.client(t, db, table, opts...), sc
}
