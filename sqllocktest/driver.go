package sqllocktest

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
)

// The database/sql/driver side: a Connector whose connections run
// statements on a Server. A connection breaks as a MySQL connection does:
// when the server goes down, when an injected fault loses it, or when the
// context of a statement under way ends (go-sql-driver/mysql closes the
// connection then). A broken connection answers driver.ErrBadConn to its
// next statement, before sending anything, so database/sql takes another.

type connector struct{ s *Server }

func (k connector) Connect(ctx context.Context) (driver.Conn, error) {
	s := k.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down || s.closed {
		// What a dial to a stopped server returns; sqllock takes it as
		// "nothing was sent".
		return nil, &net.OpError{Op: "dial", Net: "tcp", Addr: fakeAddr{}, Err: &net.OpError{Op: "connect", Err: syscall.ECONNREFUSED}}
	}
	s.nextID++
	c := &conn{s: s, id: s.nextID}
	s.conns[c] = true
	return c, nil
}

func (k connector) Driver() driver.Driver { return fakeDriver{k.s} }

type fakeDriver struct{ s *Server }

// Open ignores its name: the Server is the one the connector was made by.
func (d fakeDriver) Open(string) (driver.Conn, error) {
	return connector(d).Connect(context.Background())
}

type fakeAddr struct{}

func (fakeAddr) Network() string { return "tcp" }
func (fakeAddr) String() string  { return "sqllocktest" }

// conn is one connection: a session on the server.
type conn struct {
	s          *Server
	id         int64
	broken     bool
	tx         *txn
	waitingFor *conn // the connection whose transaction holds a row this one waits for
	// lastInsertID is the session's LAST_INSERT_ID() as the carries query
	// sets and reads it.
	lastInsertID uint64
}

// breakConn ends c on the server's side: its transaction rolls back and its
// named locks are freed; s.mu is held.
func (s *Server) breakConn(c *conn) {
	if c.broken {
		return
	}
	c.broken = true
	s.endTx(c, false)
	s.freeNamed(c)
	delete(s.conns, c)
	s.broadcast()
}

var (
	_ driver.Conn               = (*conn)(nil)
	_ driver.ConnPrepareContext = (*conn)(nil)
	_ driver.ConnBeginTx        = (*conn)(nil)
	_ driver.ExecerContext      = (*conn)(nil)
	_ driver.QueryerContext     = (*conn)(nil)
	_ driver.Pinger             = (*conn)(nil)
	_ driver.SessionResetter    = (*conn)(nil)
	_ driver.Validator          = (*conn)(nil)
	_ driver.NamedValueChecker  = (*conn)(nil)
)

func (c *conn) Prepare(query string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), query)
}

// PrepareContext recognises the statement, or refuses it as one the fake
// does not implement; like MySQL it also refuses a statement on a table that
// does not exist.
func (c *conn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	p, err := parse(query)
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	var unknown *unknownStatement
	if errors.As(err, &unknown) && c.s.handler != nil {
		if unknown.table = c.s.tableIn(query); unknown.table == "" {
			if c.broken {
				return nil, driver.ErrBadConn
			}
			return &userStmt{c: c, query: query}, nil
		}
	}
	if err != nil {
		return nil, err
	}
	if c.broken {
		return nil, driver.ErrBadConn
	}
	if h := handlers[p.t.name]; h.needsTable && c.s.tables[p.table] == nil {
		return nil, errNoTable(p.table)
	}
	return &stmt{c: c, p: p}, nil
}

func (c *conn) Close() error {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	c.s.breakConn(c)
	return nil
}

func (c *conn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

// BeginTx starts a transaction at any isolation level: the fake's
// statements run one at a time, which serves every level.
func (c *conn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	if c.broken {
		return nil, driver.ErrBadConn
	}
	if c.tx != nil {
		return nil, errors.New("sqllocktest: a transaction is already open on this connection")
	}
	c.tx = &txn{before: map[rowRef]*row{}, readOnly: opts.ReadOnly}
	return tx{c}, nil
}

func (c *conn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	st, err := c.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	return st.(driver.StmtExecContext).ExecContext(ctx, args)
}

func (c *conn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	st, err := c.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	return st.(driver.StmtQueryContext).QueryContext(ctx, args)
}

func (c *conn) Ping(ctx context.Context) error {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	if c.broken {
		return driver.ErrBadConn
	}
	return nil
}

func (c *conn) ResetSession(ctx context.Context) error {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	if c.broken {
		return driver.ErrBadConn
	}
	return nil
}

func (c *conn) IsValid() bool {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	return !c.broken
}

// CheckNamedValue takes unsigned numbers as they are, as
// go-sql-driver/mysql does, and the rest as database/sql would.
func (c *conn) CheckNamedValue(nv *driver.NamedValue) error {
	if _, ok := nv.Value.(uint64); ok {
		return nil
	}
	v, err := driver.DefaultParameterConverter.ConvertValue(nv.Value)
	if err != nil {
		return err
	}
	nv.Value = v
	return nil
}

type tx struct{ c *conn }

func (t tx) Commit() error   { return t.end(true) }
func (t tx) Rollback() error { return t.end(false) }

func (t tx) end(commit bool) error {
	s := t.c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if t.c.broken {
		return driver.ErrBadConn // the server rolled it back when the connection ended
	}
	s.endTx(t.c, commit)
	return nil
}

// stmt is a prepared statement; the table is looked up at each execution.
type stmt struct {
	c *conn
	p *parsed
}

func (st *stmt) Close() error  { return nil }
func (st *stmt) NumInput() int { return st.p.params }

func (st *stmt) Exec(args []driver.Value) (driver.Result, error) {
	return st.ExecContext(context.Background(), named(args))
}

func (st *stmt) Query(args []driver.Value) (driver.Rows, error) {
	return st.QueryContext(context.Background(), named(args))
}

func (st *stmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	out, err := st.run(ctx, args)
	if err != nil {
		return nil, err
	}
	return result{lastID: int64(out.lastID), affected: out.affected}, nil
}

func (st *stmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	out, err := st.run(ctx, args)
	if err != nil {
		return nil, err
	}
	return &rows{cols: out.cols, rows: out.rows}, nil
}

func (st *stmt) run(ctx context.Context, args []driver.NamedValue) (*outcome, error) {
	if len(args) != st.p.params {
		return nil, fmt.Errorf("sqllocktest: %s takes %d arguments, got %d", st.p.t.name, st.p.params, len(args))
	}
	vals := make([]driver.Value, len(args))
	for i, a := range args {
		if a.Name != "" {
			return nil, fmt.Errorf("sqllocktest: %s: named arguments are not supported (got %q)", st.p.t.name, a.Name)
		}
		vals[i] = a.Value
	}
	return st.c.s.execute(ctx, st.c, st.p, vals)
}

func named(args []driver.Value) []driver.NamedValue {
	out := make([]driver.NamedValue, len(args))
	for i, a := range args {
		out[i] = driver.NamedValue{Ordinal: i + 1, Value: a}
	}
	return out
}

type result struct{ lastID, affected int64 }

func (r result) LastInsertId() (int64, error) { return r.lastID, nil }
func (r result) RowsAffected() (int64, error) { return r.affected, nil }

type rows struct {
	cols []string
	rows [][]driver.Value
}

func (r *rows) Columns() []string { return r.cols }
func (r *rows) Close() error      { return nil }

func (r *rows) Next(dest []driver.Value) error {
	if len(r.rows) == 0 {
		return io.EOF
	}
	copy(dest, r.rows[0])
	r.rows = r.rows[1:]
	return nil
}
