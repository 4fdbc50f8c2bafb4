package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"
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
	c.mu.Lock()
	checked := c.checked
	c.mu.Unlock()
	if !checked {
		found, err := c.checkFirstUse(ctx)
		if err != nil {
			return nil, err
		}
		c.mu.Lock()
		c.checked = found
		c.mu.Unlock()
		checked = found
	}
	if checked && writes(i) {
		if err := c.proveOnce(ctx); err != nil {
			return nil, err
		}
	}
	c.mu.Lock()
	text := c.sql[i] // a first-use check of another call may be choosing the forms
	c.mu.Unlock()
	var st *sql.Stmt
	err := retryTransient(ctx, func() (err error) {
		st, err = c.db.PrepareContext(ctx, text)
		return err
	})
	if err != nil {
		if isConnectError(err) {
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
	if err := ctx.Err(); err != nil {
		return nil, false, err // nothing sent, nothing to clean up
	}
	st, err := c.stmt(ctx, i)
	if err != nil {
		return nil, false, err
	}
	if i == qAcquire && c.oneRow.Load() {
		args = args[:tidbAcquireArgs]
	}
	name, _ := args[0].(string) // most statements start with the name
	if i == qRefresh || i == qReleaseAtLeast {
		name, _ = args[1].(string)
	}
	return c.send(ctx, until, stmtNames[i], name, i == qAcquire, func() (sql.Result, error) {
		return st.ExecContext(ctx, args...)
	})
}

// execText is exec for a statement sent as text (a set's, acquire_all.go),
// named stmt for logs and the Observer, about the set labelled name.
func (c *Client) execText(ctx context.Context, stmt, name, text string) (res sql.Result, maybeApplied bool, err error) {
	return c.execTextUntil(ctx, time.Time{}, stmt, name, text)
}

// execTextUntil is execText whose retries also end at until, as execUntil's.
func (c *Client) execTextUntil(ctx context.Context, until time.Time, stmt, name, text string) (res sql.Result, maybeApplied bool, err error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	return c.send(ctx, until, stmt, name, strings.HasPrefix(stmt, "all_acquire"), func() (sql.Result, error) {
		return c.db.ExecContext(ctx, text)
	})
}

// send runs do, which sends statement stmt about name, with exec's retries.
// An acquire (acquire) whose row stays locked past its bound is not retried.
func (c *Client) send(ctx context.Context, until time.Time, stmt, name string, acquire bool, do func() (sql.Result, error)) (res sql.Result, maybeApplied bool, err error) {
	var rowBusy error
	err = retry(ctx, until, func() error {
		var err error
		if res, err = do(); err == nil {
			return nil
		}
		if n, ok := serverErrno(err); ok && n == erLockWaitTimeout && acquire {
			// The acquire's row stayed locked past its bound (queries.sql,
			// lock_wait_mariadb): another transaction writes it.
			// The acquire was undone; the attempt reports the name held.
			rowBusy = err
			return errRowBusy
		}
		switch classify(err) {
		case failedUnknown:
			maybeApplied = true
			c.logRetry(ctx, stmt, name, err)
		case failedRolledBack:
			c.logRetry(ctx, stmt, name, err)
		case failedFinal:
			if ctx.Err() != nil {
				// A context that ended while the statement was on its
				// way made the driver cut the connection: the outcome
				// is unknown. (Never reset: an earlier attempt may also
				// have been applied.)
				maybeApplied = true
			}
		}
		if c.stmtsClosed() {
			return ErrClosed // "sql: statement is closed", or a retry would say so
		}
		return err
	})
	if rowBusy != nil {
		return nil, maybeApplied, rowBusy
	}
	if err != nil {
		return nil, maybeApplied, err
	}
	return res, maybeApplied, nil
}

// errRowBusy stops exec's retries of an acquire whose row stayed locked.
var errRowBusy = errors.New("sqllock: the lease row stayed locked")

// retryTransient runs f, which changes nothing on the server (a prepare, a
// read), again while it fails with a broken connection or a rollback, as
// retry does.
func retryTransient(ctx context.Context, f func() error) error {
	return retry(ctx, time.Time{}, f)
}

// retry runs f again while it fails in a way the same statement may get
// past at once: a rollback (deadlock, lock wait timeout, cluster
// certification conflict) until the budget ends, a broken connection up to
// maxTransientAttempts times. The budget ends at ctx's deadline, at until
// if that is sooner and set, and at the latest maxRetryBudget from now; a
// pause that would end past it is not taken. A refusal (a read-only
// server, no server) is returned at once: a failover outlasts any pause
// here, and the loops that keep trying (Acquire, Elect, the keep-alive)
// pace themselves.
func retry(ctx context.Context, until time.Time, f func() error) error {
	budget := time.Now().Add(maxRetryBudget)
	if d, ok := ctx.Deadline(); ok && d.Before(budget) {
		budget = d
	}
	if !until.IsZero() && until.Before(budget) {
		budget = until
	}
	broken := 0
	var last error // of the attempt before, for when ctx cuts this one
	for attempt := 1; ; attempt++ {
		err := f()
		if err == nil {
			return nil
		}
		switch classify(err) {
		case failedFinal, failedRefused:
			if last != nil && ctx.Err() != nil {
				return fmt.Errorf("%w (last error: %w)", err, last)
			}
			return err
		case failedUnknown:
			if broken++; broken >= maxTransientAttempts {
				return err
			}
		}
		wait := transientBackoff(attempt)
		if time.Now().Add(wait).After(budget) {
			return err
		}
		if werr := sleepCtx(ctx, wait); werr != nil {
			return fmt.Errorf("%w (last error: %w)", werr, err)
		}
		last = err
	}
}

// maxTransientBackoff caps the pause between attempts of one statement.
const maxTransientBackoff = 64 * time.Millisecond

// transientBackoff is the pause before sending a rolled-back or cut
// statement again: from about a millisecond, doubling up to
// maxTransientBackoff, each drawn at random from the upper half of its step,
// so that writers that conflicted (two sides of a deadlock, writers on
// several cluster nodes) spread out instead of colliding again.
func transientBackoff(attempt int) time.Duration {
	d := maxTransientBackoff
	if attempt < 7 {
		d = min(time.Millisecond<<attempt, d)
	}
	return d/2 + rand.N(d/2+1)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ctxErr is ctx.Err, and DeadlineExceeded once ctx's deadline has passed
// though ctx has not yet ended: a dial or a read cut by that deadline fails
// with a timeout of its own a moment before ctx's timer fires.
func ctxErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

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
	if n, ok := serverErrno(err); ok {
		switch n {
		case erNoSuchTable:
			return errorf("%s: table %s does not exist; create it with Client.CreateTable or by running schema.sql: %w", op, c.table, err)
		case erBadField:
			return errorf("%s: table %s does not have the columns of schema.sql (another tool's table, or one made by hand?): %w", op, c.table, err)
		case erUnknown:
			if strings.Contains(err.Error(), "table "+strings.Trim(c.table, "`")+" not found") {
				return errorf("%s: Vitess knows no table %s in this keyspace: create it with Client.CreateTable or by running schema.sql, "+
					"in a sharded keyspace after giving it a vindex on name (ALTER VSCHEMA ON keyspace.%s ADD VINDEX xxhash(name) USING xxhash; docs/servers.md): %w",
					op, c.table, strings.Trim(c.table, "`"), err)
			}
		}
	}
	if isConnectError(err) {
		return errorf("%s: connect to the server: %w", op, err)
	}
	return errorf("%s: %w", op, err)
}
