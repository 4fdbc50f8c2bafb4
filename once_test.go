package sqllock

import (
	"database/sql/driver"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
)

// Once waits out errors that may pass, on its record and on its lease.
func TestClient_Once_waitsOutPassableErrors(t *testing.T) {
	notDone := func() *sqlmock.Rows { return sqlmock.NewRows([]string{"1"}) }
	e := newMockEnv(t, WithRetry(LinearBackoff(time.Millisecond)))
	tok := &tokenArg{}
	e.expectPrepare("once_done")
	e.prepared["once_done"] = &sqlmock.ExpectedPrepare{}
	e.mock.ExpectQuery(e.sql("once_done")).WithArgs("seed").WillReturnError(errReadOnly)
	e.mock.ExpectQuery(e.sql("once_done")).WithArgs("seed").WillReturnRows(notDone())
	e.expectExec("acquire", acquireArgs("seed", mockHolder, onceTTL.Microseconds(), tok), errReply(errReadOnly), okReply(42, 1))
	e.mock.ExpectQuery(e.sql("once_done")).WithArgs("seed").WillReturnError(errReadOnly)
	e.mock.ExpectQuery(e.sql("once_done")).WithArgs("seed").WillReturnRows(notDone())
	e.expectExec("once_record", []driver.Value{"seed", tok}, okReply(1, 1))
	e.expectExec("release", releaseArgs("seed", tok), okReply(0, 1))
	ran, err := e.c.Once(t.Context(), "seed", noop)
	if !ran || err != nil {
		t.Fatalf("Once: got %v, %v, want true, nil", ran, err)
	}
	e.done()
}
