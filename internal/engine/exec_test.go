package engine

import (
	"errors"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/testdsn"
)

// Stmt prepares each statement of queries.sql once and hands it out
// prepared again; Exec sends one; after Close nothing is sent, and both say
// the Client is closed.
func TestServer_Stmt_preparesOnceThenClosed(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		db, table := serverTable(t, s)
		srv := newTestServer(t, db, table)
		ctx := testCtx(t)
		if srv.Prepared(Inspect) != nil {
			t.Fatal("before any use: inspect is prepared already")
		}
		first, err := srv.Stmt(ctx, Inspect)
		if err != nil {
			t.Fatal(err)
		}
		again, err := srv.Stmt(ctx, Inspect)
		if err != nil {
			t.Fatal(err)
		}
		if again != first || srv.Prepared(Inspect) != first {
			t.Error("the second use prepared inspect again")
		}
		res, _, err := srv.Exec(ctx, Send{Stmt: Release, Name: "n", Args: []any{"n", "no-such-token"}})
		if err != nil {
			t.Fatal(err)
		}
		if n, err := res.RowsAffected(); err != nil || n != 0 {
			t.Errorf("release of a name nobody holds: %d rows (%v), want 0", n, err)
		}
		srv.Close(ctx)
		if !srv.Closed() || srv.Prepared(Inspect) != nil {
			t.Error("after Close: the statements stay open")
		}
		if _, err := srv.Stmt(ctx, Inspect); !errors.Is(err, errClosed) {
			t.Errorf("Stmt after Close: got %v, want the Client's closed error", err)
		}
		if _, _, err := srv.Exec(ctx, Send{Stmt: Release, Name: "n", Args: []any{"n", "no-such-token"}}); !errors.Is(err, errClosed) {
			t.Errorf("Exec after Close: got %v, want the Client's closed error", err)
		}
	})
}

// Ahead checks the table again when its check comes due within half its
// period, and not otherwise: a waiter calls it before every wait.
func TestServer_Ahead_checksOnlyWhenDueSoon(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		_, _, srv := usedServer(t, s)
		ctx := testCtx(t)
		far := time.Now().Add(time.Hour).UnixNano()
		srv.SetRecheckDue(far)
		srv.Ahead(ctx)
		if got := srv.RecheckDue(); got != far {
			t.Errorf("due in an hour: Ahead moved the check to %v, want it left", time.Unix(0, got))
		}
		soon := time.Now().Add(TableRecheckEvery / 4).UnixNano()
		srv.SetRecheckDue(soon)
		srv.Ahead(ctx)
		if got := srv.RecheckDue(); got <= soon {
			t.Errorf("due within half its period: Ahead left the check due at %v, want it made and the next one later", time.Unix(0, got))
		}
	})
}
