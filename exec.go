package sqllock

import (
	"context"
	"errors"
	"strings"

	"github.com/sqllock/sqllock/internal/engine"
	"github.com/sqllock/sqllock/internal/fault"
)

// Every statement a Client sends goes through its engine (internal/engine),
// which prepares it once, after ready, and sends it again while the server
// rolls it back or the connection breaks before the reply. serverError says
// what a failure means.

// newEngine returns the engine that prepares and sends c's statements.
func (c *Client) newEngine() *engine.Server {
	return engine.New(engine.Config{
		DB:        c.db,
		Queries:   queries,
		Table:     c.table,
		Ready:     c.ready,
		StillGood: c.tableStillGood,
		Classify:  classify,
		Retried:   c.logRetry,
		Closed:    ErrClosed,
		Budget:    c.budget,
	})
}

// ready makes the first-use check (tablecheck.go), until it has found the
// table as it should be, and the proof before the first statement that
// writes (proof.go), before statement i is first prepared.
func (c *Client) ready(ctx context.Context, i int) error {
	checked := c.eng.Forms().Checked
	if !checked {
		found, err := c.checkFirstUse(ctx)
		if err != nil {
			return err
		}
		if found {
			c.eng.Mark(func(f *engine.Forms) *bool { return &f.Checked })
		}
		checked = found
	}
	if checked && writes(i) {
		if err := c.proveOnce(ctx); err != nil {
			return err
		}
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
