package engine

import (
	"context"
	"testing"

	"github.com/sqllock/sqllock/internal/sqltext"
	"github.com/sqllock/sqllock/internal/testdsn"
)

// Through Vitess the two-row forms are refused by the statements' own
// answers, without the version that names vtgate: the acquire reads there
// the mark its first row set, which vtgate replaces with its own.
func TestServer_proveStatements_twoRowFormsOnVitess(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		if !s.Vitess {
			t.Skip("the two-row forms pass everywhere but through Vitess")
		}
		db, table := serverTable(t, s)
		srv := newTestServer(t, db, table)
		ctx := testCtx(t)
		var database string
		if err := db.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&database); err != nil {
			t.Fatal(err)
		}
		qualified, lit, err := sqltext.Qualify(srv.cfg.Table, database)
		if err != nil {
			t.Fatal(err)
		}
		srv.Choose("9.7.4", qualified, lit, true) // as if the first-use check had seen LAST_INSERT_ID() carry
		for i := range 3 {
			conn, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			a, _ := srv.cfg.Token()
			b, _ := srv.cfg.Token()
			text := srv.Forms().SQL
			err = srv.proveStatements(ctx, conn, &text, "vitess", ProofPrefix+a, a, b)
			conn.Close()
			t.Logf("proof %d of the two-row forms without the version: %v", i, err)
			wantErr(t, err, errUnsupported)
			_, _ = db.ExecContext(context.WithoutCancel(ctx), srv.Text().Substitute(testQueries["proof_clear"]), ProofPrefix+a)
		}
	})
}
