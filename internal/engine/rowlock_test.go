package engine

import (
	"database/sql/driver"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/sqllock/sqllock/internal/fault"
)

// The row lock's proof decides on every pair of answers as it must: what a
// real server gives is shown by TestClient_firstUse_provesStatements (every
// server and DSN variant passes) and TestClient_firstUse_refusesGoMySQLServer
// (an engine without the lock is refused); the mock gives the answers an
// optimistic engine gives, and the timings, on demand.
func TestServer_proveConcurrency_answers(t *testing.T) {
	conflict := errors.New("Error 9007 (HY000): Write conflict")
	tests := []struct {
		name      string
		second    int64         // the second acquire's insert id
		secondErr error         // or its error
		delay     time.Duration // before the second's answer
		commitErr error
		wantOwner string // "a" or "b"
		wantErr   string // in an ErrUnsupportedServer, or ""
	}{
		{name: "taken while the first is open, both commit", second: 8,
			wantErr: "two connections both took one name: an acquire inside a transaction took it (fence 7), an acquire on another connection reported it taken too (fence 8) while the first's transaction was still open"},
		// Past the longest wait, so that the first commits before the
		// answer whatever the first's acquire took on a loaded machine.
		{name: "taken after the first committed", second: 8, delay: maxConcurrencyWait + 200*time.Millisecond,
			wantErr: "reported it taken too (fence 8) once the first had committed"},
		{name: "taken, and the first's commit conflicts", second: 8, commitErr: conflict, wantOwner: "b"},
		{name: "refused", second: 0, wantOwner: "a"},
		{name: "refused after waiting", second: 0, delay: 100 * time.Millisecond, wantOwner: "a"},
		{name: "row lock wait timed out", secondErr: errors.New("Error 1205 (HY000): Lock wait timeout exceeded"), wantOwner: "a"},
		{name: "another refusal", secondErr: errors.New("Error 1062 (23000): Duplicate entry"), wantOwner: "a"},
		{name: "the second's connection broke", secondErr: errors.New("invalid connection"), wantErr: "-"},
		{name: "a mark", second: 1, wantErr: "reported 1, neither a fence nor refused"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			db, mock, err := sqlmock.New(sqlmock.QueryMatcherOption(sqlmock.QueryMatcherEqual))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = db.Close() })
			// The two connections share the mock's one: the second's
			// statement may come before or after the first's commit.
			mock.MatchExpectationsInOrder(false)
			srv := newTestServer(t, db, "sqllock")
			ctx := testCtx(t)
			conn1, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn1.Close()
			conn2, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn2.Close()
			args := func(token string) []driver.Value {
				var vs []driver.Value
				for _, a := range srv.acquireArgs("proof", token, proofTTL.Microseconds()) {
					vs = append(vs, a)
				}
				return vs
			}
			mock.ExpectBegin()
			// Each acquire prepared, as the Client sends it.
			mock.ExpectPrepare(inTransaction(srv.Forms().SQL[Acquire])).ExpectExec().WithArgs(args("a")...).WillReturnResult(sqlmock.NewResult(7, 1))
			second := mock.ExpectPrepare(srv.Forms().SQL[Acquire]).ExpectExec().WithArgs(args("b")...).WillDelayFor(tt.delay)
			if tt.secondErr != nil {
				second.WillReturnError(tt.secondErr)
			} else {
				second.WillReturnResult(sqlmock.NewResult(tt.second, 1))
			}
			if tt.commitErr != nil {
				mock.ExpectCommit().WillReturnError(tt.commitErr)
			} else {
				mock.ExpectCommit()
			}
			owner, err := srv.proveConcurrency(ctx, conn1, conn2, 0, &srv.Forms().SQL, "8.0.31", "proof", "a", "b")
			if tt.wantErr == "-" {
				if err == nil || errors.Is(err, errUnsupported) || srv.cfg.Classify(err) != fault.Unknown {
					t.Errorf("proveConcurrency: got %v, want the broken connection's error, for another attempt", err)
				}
			} else if tt.wantErr != "" {
				wantErr(t, err, errUnsupported, tt.wantErr)
			} else if err != nil || owner != tt.wantOwner {
				t.Errorf("proveConcurrency: got %q, %v; want %q, nil", owner, err, tt.wantOwner)
			}
			if err := mock.ExpectationsWereMet(); err != nil {
				t.Error(err)
			}
		})
	}
}

// The row lock's proof takes the acquire inside a transaction, which the
// session guard refuses on MariaDB: it must find the guard's part to leave
// out in every form of the acquire that guards it.
func TestInTransaction_dropsTheGuard(t *testing.T) {
	for _, name := range []string{"acquire", "tidb_acquire"} {
		q := testQueries[name]
		if !strings.Contains(q, "@@in_transaction") {
			continue
		}
		if got := inTransaction(q); got == q || strings.Contains(got, "@@in_transaction") {
			t.Errorf("%s: inTransaction left the open-transaction guard in place:\n%s", name, got)
		}
	}
	if !strings.Contains(testQueries["acquire"], inTransactionGuard) {
		t.Errorf("acquire: got no %q, want the guard the row lock's proof leaves out", inTransactionGuard)
	}
}
