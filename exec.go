package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/sqllock/sqllock/internal/fault"
)

// Statement preparation and execution: every statement a Client sends goes
// through stmt, which prepares it once (after the first-use check of the
// table, tablecheck.go, and the proof of the statements, proof.go), and
// exec, which sends it again while the server rolls it back or the
// connection breaks before the reply. serverError says what a failure means.

// A prepareFlight is one prepare of a statement under way. Every caller
// that needs the statement waits for it, each as long as its own context
// allows; st and err are set when done is closed.
type prepareFlight struct {
	done chan struct{}
	st   *sql.Stmt
	err  error
}

// stmt returns statement i, preparing it on first use. The first use also
// makes the first-use check of the session, server and table (tablecheck.go). Callers that need a statement
// another caller is preparing wait for that prepare, as long as ctx allows;
// if the preparing caller's context ends first, a waiter prepares it anew.
func (c *Client) stmt(ctx context.Context, i int) (*sql.Stmt, error) {
	for {
		if st := c.stmts[i].Load(); st != nil {
			return st, nil
		}
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return nil, ErrClosed
		}
		f := c.prepares[i]
		lead := f == nil
		if lead {
			f = &prepareFlight{done: make(chan struct{})}
			c.prepares[i] = f
		}
		c.mu.Unlock()
		if lead {
			c.prepare(ctx, i, f)
		}
		select {
		case <-f.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if f.err != nil && !lead && isContextErr(f.err) {
			continue // the preparing caller gave up; ours is still live
		}
		return f.st, f.err
	}
}

// prepare runs the prepare flight f of statement i and publishes its result.
func (c *Client) prepare(ctx context.Context, i int, f *prepareFlight) {
	st, err := c.prepareStmt(ctx, i)
	c.mu.Lock()
	c.prepares[i] = nil
	closed := c.closed
	if err == nil && !closed {
		c.stmts[i].Store(st)
	}
	c.mu.Unlock()
	if err == nil && closed {
		// Close finished while this prepare ran: nobody else will close it.
		_ = st.Close()
		st, err = nil, ErrClosed
	}
	f.st, f.err = st, err
	close(f.done)
}

// prepareStmt makes the first-use check (tablecheck.go), until it has found
// the table as it should be, and prepares statement i.
func (c *Client) prepareStmt(ctx context.Context, i int) (*sql.Stmt, error) {
	checked := c.learned().checked
	if !checked {
		found, err := c.checkFirstUse(ctx)
		if err != nil {
			return nil, err
		}
		if found {
			c.mark(func(f *forms) *bool { return &f.checked })
		}
		checked = found
	}
	if checked && writes(i) {
		if err := c.proveOnce(ctx); err != nil {
			return nil, err
		}
	}
	text := c.learned().sql[i]
	var st *sql.Stmt
	err := fault.Transient(ctx, func() (err error) {
		st, err = c.db.PrepareContext(ctx, text)
		return err
	})
	if err != nil {
		if fault.IsConnectError(err) {
			return nil, err
		}
		return nil, fmt.Errorf("prepare: %w", err)
	}
	return st, nil
}

// closeStmts closes the Client's statements. database/sql makes closing a
// statement wait for the executions of it under way, and one may hang on a
// dead connection until its context ends: so each statement is closed on a
// goroutine of its own, and closeStmts waits for them only until ctx ends.
// (Closing a *sql.Stmt that was prepared reports no error.)
func (c *Client) closeStmts(ctx context.Context) {
	var wg sync.WaitGroup
	for i := range c.stmts {
		if st := c.stmts[i].Swap(nil); st != nil {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = st.Close()
			}()
		}
	}
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// stmtsClosed reports whether Close has closed the statements.
func (c *Client) stmtsClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// exec runs statement i, retrying it (see retry) while the server rolls it
// back (deadlock, lock wait timeout, cluster conflict) or the connection
// breaks before the reply. The caller's arguments carry its
// token, so a retry gives the answer the first attempt would have.
// maybeApplied reports whether an attempt that failed may have committed.
func (c *Client) exec(ctx context.Context, i int, args ...any) (res sql.Result, maybeApplied bool, err error) {
	return c.execUntil(ctx, time.Time{}, i, args...)
}

// execUntil is exec whose retries of a rolled-back statement also end at
// until, when it is set: a refresh's retries end when the lease could.
func (c *Client) execUntil(ctx context.Context, until time.Time, i int, args ...any) (res sql.Result, maybeApplied bool, err error) {
	res, unknown, err := c.execSends(ctx, until, i, args...)
	return res, unknown > 0, err
}

// execSends is execUntil that counts the sends whose outcome is unknown:
// each of them may still commit.
func (c *Client) execSends(ctx context.Context, until time.Time, i int, args ...any) (res sql.Result, unknown int, err error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err // nothing sent, nothing to clean up
	}
	st, err := c.stmt(ctx, i)
	if err != nil {
		return nil, 0, err
	}
	if i == qAcquire || i == qRefresh {
		if err := c.tableStillGood(ctx); err != nil {
			return nil, 0, err
		}
	}
	if i == qAcquire && c.learned().oneRow {
		args = args[:tidbAcquireArgs]
	}
	name, _ := args[0].(string) // most statements start with the name
	switch i {
	case qRefresh, qReleaseAtLeast:
		name, _ = args[1].(string)
	case qLockDelay:
		name, _ = args[3].(string)
	}
	return c.send(ctx, until, stmtNames[i], name, i == qAcquire, func() (sql.Result, error) {
		return st.ExecContext(ctx, args...)
	})
}

// execText is exec for a statement sent as text (a set's, acquire_set.go),
// named stmt for logs and the Observer, about the set labelled name.
func (c *Client) execText(ctx context.Context, stmt, name, text string) (res sql.Result, maybeApplied bool, err error) {
	return c.execTextUntil(ctx, time.Time{}, stmt, name, text)
}

// execTextUntil is execText whose retries also end at until, as execUntil's.
func (c *Client) execTextUntil(ctx context.Context, until time.Time, stmt, name, text string) (res sql.Result, maybeApplied bool, err error) {
	res, unknown, err := c.execTextSends(ctx, until, stmt, name, text)
	return res, unknown > 0, err
}

// execTextSends is execTextUntil that counts the sends whose outcome is
// unknown, as execSends.
func (c *Client) execTextSends(ctx context.Context, until time.Time, stmt, name, text string) (res sql.Result, unknown int, err error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	switch stmt {
	case "all_acquire", "all_refresh":
		if err := c.tableStillGood(ctx); err != nil {
			return nil, 0, err
		}
	}
	return c.send(ctx, until, stmt, name, strings.HasPrefix(stmt, "all_acquire"), func() (sql.Result, error) {
		return c.db.ExecContext(ctx, text)
	})
}

// send runs do, which sends statement stmt about name, through
// fault.Send: exec's resends, each failed one told to the log and the
// Observer's Retried, ending with ErrClosed once Close has closed the
// statements. An acquire (acquire) whose row stays locked past its bound
// is not sent again: it returns the server's 1205.
func (c *Client) send(ctx context.Context, until time.Time, stmt, name string, acquire bool, do func() (sql.Result, error)) (res sql.Result, unknown int, err error) {
	return fault.Send(ctx, fault.Sending{
		Until:    until,
		Budget:   c.budget,
		Acquire:  acquire,
		Classify: classify,
		Retried:  func(err error) { c.logRetry(ctx, stmt, name, err) },
		Closed:   c.closedErr,
	}, do)
}

// closedErr is ErrClosed once Close has closed the statements, else nil.
func (c *Client) closedErr() error {
	if c.stmtsClosed() {
		return ErrClosed
	}
	return nil
}

// ctxErr is fault.CtxErr: ctx's error, or DeadlineExceeded once its
// deadline has passed though its timer has not yet fired.
func ctxErr(ctx context.Context) error { return fault.CtxErr(ctx) }

func isContextErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

var errAutocommitOff = errors.New("the session has autocommit off (a DSN's autocommit=0 or the server's default); sqllock's statements must commit on their own")

// serverError wraps an error from preparing or running a statement with the
// operation, once, and says how to mend a missing or foreign table.
func (c *Client) serverError(op string, err error) error {
	if errors.Is(err, ErrClosed) {
		return err
	}
	if c.stmtsClosed() {
		// Close closed the statement under this call: database/sql says
		// "sql: statement is closed", which is ErrClosed, as exec says.
		return ErrClosed
	}
	if g := sessionGuard(err); g != "" {
		if fault.ReadOnlyGuard(err) {
			return errorf("%s: %w (%s): %w", op, errReadOnlyServer, g, err)
		}
		return errorf("%s: %s: %w", op, g, err)
	}
	if n, ok := fault.Errno(err); ok {
		switch n {
		case fault.NoSuchTable:
			return errorf("%s: table %s does not exist; create it with Client.CreateTable or by running schema.sql: %w", op, c.table, err)
		case fault.BadField:
			return errorf("%s: table %s does not have the columns of schema.sql (another tool's table, or one made by hand?): %w", op, c.table, err)
		case fault.UnknownError:
			if strings.Contains(err.Error(), "table "+strings.Trim(c.table, "`")+" not found") {
				return errorf("%s: Vitess knows no table %s in this keyspace: create it with Client.CreateTable or by running schema.sql, "+
					"in a sharded keyspace after giving it a vindex on name (ALTER VSCHEMA ON keyspace.%s ADD VINDEX xxhash(name) USING xxhash; docs/servers.md): %w",
					op, c.table, strings.Trim(c.table, "`"), err)
			}
		}
	}
	if fault.IsConnectError(err) {
		return errorf("%s: connect to the server: %w", op, err)
	}
	return errorf("%s: %w", op, err)
}
