package main

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/go-sql-driver/mysql"
)

// A countingConnector counts what a Client sends through the *sql.DB:
// statements (executions and queries, direct or prepared, and transactions'
// begin, commit and rollback), among them the shared renewal's (renews),
// prepares, and connections opened.
type countingConnector struct {
	driver.Connector
	stmts, renews, prepares, dials atomic.Int64

	mu  sync.Mutex
	ids []int64 // the server's CONNECTION_ID of each connection opened
}

func newCountingConnector(dsn string) (*countingConnector, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("-dsn: %w", err)
	}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	return &countingConnector{Connector: conn}, nil
}

func (cc *countingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	c, err := cc.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	cc.dials.Add(1)
	// The connection's id finds the server's thread serving it
	// (threadCPU); the query is not counted.
	if id, err := connectionID(ctx, c); err == nil {
		cc.mu.Lock()
		cc.ids = append(cc.ids, id)
		cc.mu.Unlock()
	}
	return &countedConn{Conn: c, cc: cc}, nil
}

func connectionID(ctx context.Context, c driver.Conn) (int64, error) {
	rows, err := c.(driver.QueryerContext).QueryContext(ctx, "SELECT CONNECTION_ID()", nil)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	v := make([]driver.Value, 1)
	if err := rows.Next(v); err != nil {
		return 0, err
	}
	switch id := v[0].(type) {
	case int64:
		return id, nil
	case []byte:
		return strconv.ParseInt(string(id), 10, 64)
	}
	return 0, fmt.Errorf("CONNECTION_ID() is %T", v[0])
}

// A threadSampler adds up the CPU time of the server's threads serving the
// Client's connections: each sample finds them (MariaDB lists them in
// information_schema's PROCESSLIST, MySQL in performance_schema.threads)
// over a connection of its own, which is not counted, and adds what each
// thread found in the sample before used since. A connection opened
// between two samples loses its first interval; one the server cached a
// thread for does not bring that thread's past.
type threadSampler struct {
	mon     *sql.DB
	cc      *countingConnector
	pid     int
	last    map[int]int64 // thread id: ticks at the last sample
	ticks   int64
	threads map[int]bool // every thread seen
	err     error        // the first sample's failure, if any
}

func (ts *threadSampler) sample(ctx context.Context) {
	if ts.err != nil {
		return
	}
	tids, err := ts.serverThreads(ctx)
	if err != nil {
		ts.err = err
		return
	}
	now := map[int]int64{}
	for _, tid := range tids {
		t, err := statCPU(fmt.Sprintf("/proc/%d/task/%d/stat", ts.pid, tid))
		if err != nil {
			continue // the thread ended since the query
		}
		now[tid] = t
		if prev, ok := ts.last[tid]; ok && t >= prev {
			ts.ticks += t - prev
		}
		ts.threads[tid] = true
	}
	ts.last = now
}

func (ts *threadSampler) serverThreads(ctx context.Context) ([]int, error) {
	ts.cc.mu.Lock()
	ids := make([]string, len(ts.cc.ids))
	for i, id := range ts.cc.ids {
		ids[i] = strconv.FormatInt(id, 10)
	}
	ts.cc.mu.Unlock()
	if len(ids) == 0 {
		return nil, errors.New("no connection's id known")
	}
	in := strings.Join(ids, ",")
	var errs []error
	for _, q := range []string{
		"SELECT TID FROM information_schema.PROCESSLIST WHERE ID IN (" + in + ")",
		"SELECT THREAD_OS_ID FROM performance_schema.threads WHERE PROCESSLIST_ID IN (" + in + ")",
	} {
		rows, err := ts.mon.QueryContext(ctx, q)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var tids []int
		for rows.Next() {
			var tid sql.NullInt64
			if err := rows.Scan(&tid); err == nil && tid.Valid {
				tids = append(tids, int(tid.Int64))
			}
		}
		rows.Close()
		if len(tids) > 0 {
			return tids, nil
		}
	}
	return nil, fmt.Errorf("the server's threads not found: %w", errors.Join(errs...))
}

// count counts a statement the driver sent, query: one it skipped
// (driver.ErrSkip) database/sql sends again prepared, counted there.
func (cc *countingConnector) count(err error, query string) {
	if errors.Is(err, driver.ErrSkip) {
		return
	}
	cc.stmts.Add(1)
	if isRenewal(query) {
		cc.renews.Add(1)
	}
}

// isRenewal reports whether query is a statement of the shared renewal
// (queries.sql): renew_many, or a session's renewal, session_renew, by what
// no other statement holds.
func isRenewal(query string) bool {
	return strings.Contains(query, "UPDATE") &&
		(strings.Contains(query, "CONCAT(owner, name) IN (") || strings.Contains(query, "AND kind = 'S' AND owner = "))
}

// A countedConn passes everything to the driver's connection, counting.
type countedConn struct {
	driver.Conn
	cc *countingConnector
}

func (c *countedConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	st, err := c.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	c.cc.prepares.Add(1)
	return &countedStmt{Stmt: st, cc: c.cc, query: query}, nil
}

func (c *countedConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	rows, err := c.Conn.(driver.QueryerContext).QueryContext(ctx, query, args)
	c.cc.count(err, query)
	return rows, err
}

func (c *countedConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	res, err := c.Conn.(driver.ExecerContext).ExecContext(ctx, query, args)
	c.cc.count(err, query)
	return res, err
}

func (c *countedConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	tx, err := c.Conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
	c.cc.count(err, "")
	if err != nil {
		return nil, err
	}
	return &countedTx{Tx: tx, cc: c.cc}, nil
}

func (c *countedConn) ResetSession(ctx context.Context) error {
	return c.Conn.(driver.SessionResetter).ResetSession(ctx)
}

func (c *countedConn) IsValid() bool { return c.Conn.(driver.Validator).IsValid() }

func (c *countedConn) CheckNamedValue(nv *driver.NamedValue) error {
	return c.Conn.(driver.NamedValueChecker).CheckNamedValue(nv)
}

type countedStmt struct {
	driver.Stmt
	cc    *countingConnector
	query string
}

func (s *countedStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	res, err := s.Stmt.(driver.StmtExecContext).ExecContext(ctx, args)
	s.cc.count(err, s.query)
	return res, err
}

func (s *countedStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	rows, err := s.Stmt.(driver.StmtQueryContext).QueryContext(ctx, args)
	s.cc.count(err, s.query)
	return rows, err
}

type countedTx struct {
	driver.Tx
	cc *countingConnector
}

func (t *countedTx) Commit() error {
	err := t.Tx.Commit()
	t.cc.count(err, "")
	return err
}

func (t *countedTx) Rollback() error {
	err := t.Tx.Rollback()
	t.cc.count(err, "")
	return err
}
