package sqllock

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"sync/atomic"
	"testing"
	"time"

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

// A refused TryAcquireSet reads who holds its names, and that look ends
// with the caller's context: on a server that stops answering after the
// refusal, a call whose context ends after 200 ms returns the refusal (no
// holders) within that context and a margin, not after the look's own
// timeout (5 s).
func TestClient_TryAcquireSet_refusedLookEndsWithCtx(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipSetsOnVitess(t, e)
		table := e.newTable(t)
		holder := e.client(t, e.openDB(t), table, WithHolder("holder"))
		c, sc := e.stallingClient(t, table, WithHolder("refused"))
		mustAcquire(t, holder, "b", time.Minute)
		// The first refusal proves the set forms and warms the connection.
		_, err := c.TryAcquireSet(testCtx(t), []string{"a", "b"}, time.Minute)
		wantHeld(t, err, "b")

		sc.armed.Store(true)
		ctx, cancel := context.WithTimeout(testCtx(t), 200*time.Millisecond)
		defer cancel()
		began := time.Now()
		_, err = c.TryAcquireSet(ctx, []string{"a", "b"}, time.Minute)
		took := time.Since(began)
		if !errors.Is(err, ErrNotAcquired) {
			t.Fatalf("TryAcquireSet: got %v, want ErrNotAcquired", err)
		}
		if took > 200*time.Millisecond+time.Second {
			t.Fatalf("refused TryAcquireSet with a 200ms context took %v, want the context and a margin of 1s", took)
		}
	})
}

// Release ends within ReleaseTimeout on a connection that stops answering,
// the channel's let-go included: the let-go is cut at the release's bound
// and discards the channel's connection, with which its named lock dies.
// Before, the let-go's own second came on top (6 s).
func TestWakeups_releaseOnStalledServerWithinReleaseTimeout(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipChannelsOnTiDB(t, e)
		table := e.newTable(t)
		c, p := e.proxiedClient(t, table)
		l := holdAfterWaitingFor(t, e, c, table, "n", time.Minute)
		p.Stall(true)
		t.Cleanup(func() { p.Stall(false) })
		began := time.Now()
		err := l.Release(testCtx(t))
		took := time.Since(began)
		if err == nil {
			t.Errorf("Release against a server that does not answer: got nil, want an error")
		}
		if took > ReleaseTimeout+500*time.Millisecond {
			t.Errorf("Release of a Lock holding a channel, on a stalled server, took %v, want at most ReleaseTimeout (%v) and 500ms", took, ReleaseTimeout)
		}
	})
}

// A Do whose acquire waited (so the Lock would hold the name's wake-up
// channel), on a pool of two connections, whose fn holds a transaction of
// the same pool: the keep-alive's Refresh must find a connection, and fn
// runs to its end. Before, the channel kept the second connection for the
// Lock's life, the Refresh waited for one until its deadline, and fn was
// cancelled 540 ms into a 600 ms lease.
func TestWakeups_boundedPoolDoKeepsLeaseConnection(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipChannelsOnTiDB(t, e)
		table := e.newTable(t)
		db := e.openDB(t)
		db.SetMaxOpenConns(2)
		c := e.client(t, db, table)
		ctx := testCtx(t)
		first := mustAcquire(t, e.client(t, e.openDB(t), table, WithWakeups(0)), "n", time.Minute)
		done := make(chan error, 1)
		var fnErr atomic.Value
		go func() {
			done <- c.Do(ctx, "n", 600*time.Millisecond, func(ctx context.Context, _ *Lock) error {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				defer tx.Rollback() // BeginTx took a connection of the pool, held until then
				select {
				case <-ctx.Done():
					fnErr.Store(context.Cause(ctx))
					return ctx.Err()
				case <-time.After(3 * time.Second):
				}
				return tx.Commit()
			})
		}()
		waitFor(t, time.Minute, "the Do waits", func() bool { return headAttempts(c, "n") > 0 })
		if err := first.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("Do on a pool of two whose fn holds a transaction: %v (fn's context: %v)", err, fnErr.Load())
		}
	})
}
