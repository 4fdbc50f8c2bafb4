package sqllocktest

import (
	"context"
	"database/sql/driver"
	"errors"
	"strings"
)

// A Handler answers the SQL that is not sqllock's: your code's own
// statements, such as the writes of a Lock.Check transaction (usage.md's
// recommended pattern: check the lease and write in one transaction). Set
// it with [WithHandler]. It is called without the fake's lock held, so it
// may block and may call the Server (Expire, Advance, Down); it may be
// called concurrently from several connections.
//
// An error it returns is the statement's, as the driver's would be (a
// [ServerError] reads as the server's). The fake keeps no state for these
// statements: the Handler keeps its own tables, and makes them follow the
// transaction with [Tx.OnCommit] and [Tx.OnRollback].
type Handler func(ctx context.Context, st Statement) (Answer, error)

// A Statement is one statement a Handler answers.
type Statement struct {
	Query string         // as sent
	Args  []driver.Value // its ? arguments
	// Tx is the transaction the statement runs in; nil outside one.
	Tx *Tx
}

// An Answer is a Handler's answer: for a query, its columns and rows; for
// anything else, the rows affected and the insert id of the OK packet.
type Answer struct {
	Columns      []string
	Rows         [][]driver.Value
	RowsAffected int64
	LastInsertID int64
}

// A Tx is a transaction that ran a Handler's statement. It ends with the
// transaction of sqllock's statements it shares a connection with: commit,
// rollback, or the connection's loss (a rollback). The zero value is not
// used; the fake makes one per transaction.
type Tx struct {
	commit, rollback []func()
}

// OnCommit makes f run when the transaction commits, once. f runs while
// the fake holds its lock: it must be fast and must not call the Server
// or the database (apply the writes the Handler kept aside, say).
func (t *Tx) OnCommit(f func()) { t.commit = append(t.commit, f) }

// OnRollback makes f run when the transaction rolls back (by Rollback, a
// deadlock the fake rolled back, or a lost connection), once, as OnCommit's
// f does.
func (t *Tx) OnRollback(f func()) { t.rollback = append(t.rollback, f) }

// WithHandler makes the fake answer the SQL it does not run itself with
// h, instead of failing it as not implemented; SQL that names one of the
// fake's tables (the lock table is sqllock's) stays refused, never h's. A
// nil h changes nothing.
func WithHandler(h Handler) Option {
	return func(s *Server) error {
		s.handler = h
		return nil
	}
}

// userTx returns the Tx of c's open transaction, made on first use; nil
// outside a transaction. s.mu is held.
func (c *conn) userTx() *Tx {
	if c.tx == nil {
		return nil
	}
	if c.tx.user == nil {
		c.tx.user = &Tx{}
	}
	return c.tx.user
}

// endUserTx runs the callbacks of tx's Tx, if it has one; s.mu is held.
func endUserTx(tx *txn, commit bool) {
	if tx.user == nil {
		return
	}
	fs := tx.user.rollback
	if commit {
		fs = tx.user.commit
	}
	tx.user.commit, tx.user.rollback = nil, nil
	for _, f := range fs {
		f()
	}
}

// userStmt is a statement the Handler answers.
type userStmt struct {
	c     *conn
	query string
}

func (st *userStmt) Close() error  { return nil }
func (st *userStmt) NumInput() int { return -1 }

func (st *userStmt) Exec(args []driver.Value) (driver.Result, error) {
	return st.ExecContext(context.Background(), named(args))
}

func (st *userStmt) Query(args []driver.Value) (driver.Rows, error) {
	return st.QueryContext(context.Background(), named(args))
}

func (st *userStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	a, err := st.run(ctx, args)
	if err != nil {
		return nil, err
	}
	return result{lastID: a.LastInsertID, affected: a.RowsAffected}, nil
}

func (st *userStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	a, err := st.run(ctx, args)
	if err != nil {
		return nil, err
	}
	return &rows{cols: a.Columns, rows: a.Rows}, nil
}

func (st *userStmt) run(ctx context.Context, args []driver.NamedValue) (Answer, error) {
	s := st.c.s
	s.mu.Lock()
	if st.c.broken {
		s.mu.Unlock()
		return Answer{}, driver.ErrBadConn
	}
	stmt := Statement{Query: st.query, Args: make([]driver.Value, len(args)), Tx: st.c.userTx()}
	h := s.handler
	s.mu.Unlock()
	for i, a := range args {
		if a.Name != "" {
			return Answer{}, errors.New("sqllocktest: named arguments are not supported")
		}
		stmt.Args[i] = a.Value
	}
	return h(ctx, stmt)
}

// tableIn returns the name of one of the fake's tables that query names,
// or "": SQL on the fake's tables that is not sqllock's stays refused as
// not implemented, never the Handler's, so that a Handler cannot answer
// for the lock table. s.mu is held.
func (s *Server) tableIn(query string) string {
	for _, name := range s.tableNames() {
		if strings.Contains(query, "`"+name+"`") {
			return name
		}
	}
	return ""
}
