package sqllock

import (
	"context"
	"errors"
	"fmt"

	"github.com/sqllock/sqllock/internal/engine"
	"github.com/sqllock/sqllock/internal/fault"
)

// Every statement a Client sends goes through its engine (internal/engine),
// which makes the first-use check and the proofs, prepares each statement
// once, and sends it again while the server rolls it back or the connection
// breaks before the reply. serverError says what a failure means.

// newEngine returns the engine that checks the server and table, proves
// the statements, and prepares and sends them.
func (c *Client) newEngine() *engine.Server {
	return engine.New(engine.Config{
		DB:        c.db,
		Queries:   queries,
		Table:     c.table,
		Holder:    c.holder,
		NameLen:   MaxNameLen,
		HolderLen: maxHolderLen,
		Classify:  classify,
		Retried:   c.logRetry,
		Chosen:    c.chosen,
		Log:       c.log,
		Frozen:    c.frozenSeen,
		Errorf:    errorf,
		Errors: engine.Errors{
			Unsupported:   ErrUnsupportedServer,
			BadTable:      ErrBadTable,
			ReadOnly:      errReadOnlyServer,
			AutocommitOff: errAutocommitOff,
		},
		Token:          newToken,
		Released:       releasedToken,
		Closed:         ErrClosed,
		Budget:         c.budget,
		CleanupTimeout: cleanupTimeout,
	})
}

// chosen is told the forms the first-use check chose for the server that
// answered version: where the wake-up channels do not serve
// (engine.Forms.Channels: TiDB, Vitess; wake_test.go) they stay off and
// waiters poll.
func (c *Client) chosen(f *engine.Forms, version string) {
	if !f.Channels() {
		c.wait.Channels.Refuse()
	}
}

// errReadOnlyServer means the server refuses writes, or would refuse them
// to an account without administrative privileges: a replica, or a primary
// during a failover. Classified as the server's own refusal (1290) is, so
// the calls that wait out a failover keep trying.
var errReadOnlyServer = errors.New("sqllock: the server is read-only")

// poolFull returns, for the error of a call that ended with its context,
// a note that every connection the pool may open was in use, as when the
// caller holds the last in a transaction: the call may have waited for one
// all along. "" otherwise.
func (c *Client) poolFull() string {
	s := c.db.Stats()
	if s.MaxOpenConnections <= 0 || s.InUse < s.MaxOpenConnections {
		return ""
	}
	return fmt.Sprintf(" (every connection of the pool was in use, at its limit SetMaxOpenConns(%d): the call may have waited for one the caller holds, in a transaction?)", s.MaxOpenConnections)
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
	if c.eng.Closed() {
		// Close closed the statement under this call: database/sql says
		// "sql: statement is closed", which is ErrClosed, as exec says.
		return ErrClosed
	}
	if g := engine.SessionGuard(err); g != "" {
		if fault.ReadOnlyGuard(err) {
			return errorf("%s: %w (%s): %w", op, errReadOnlyServer, g, err)
		}
		return errorf("%s: %s: %w", op, g, err)
	}
	if p := c.eng.TableProblem(err); p != "" {
		return errorf("%s: %s: %w", op, p, err)
	}
	if fault.IsConnectError(err) {
		return errorf("%s: connect to the server: %w", op, err)
	}
	return errorf("%s: %w", op, err)
}
