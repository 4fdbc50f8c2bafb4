package sqllock

// sqlmock tests of the statements behind Do, Once, Check and List, and of
// the keep-alive's decisions: the exact SQL and arguments, and how each
// result and error is read.

import (
	"context"
	"database/sql/driver"

	"github.com/DATA-DOG/go-sqlmock"
)

// expectQuery expects query name to run once with args, answered by rows,
// preparing it first if the Client has not yet.
func (e *mockEnv) expectQuery(name string, args []driver.Value, rows *sqlmock.Rows) {
	if e.prepared[name] == nil {
		e.expectPrepare(name)
	}
	e.mock.ExpectQuery(e.sql(name)).WithArgs(args...).WillReturnRows(rows)
}

func noop(context.Context, *Lock) error { return nil }
