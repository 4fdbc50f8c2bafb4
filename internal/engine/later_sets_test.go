package engine

import (
	"testing"

	"github.com/sqllock/sqllock/internal/testdsn"
)

// The sets' statements are proven once, at the first set: the proof
// leaves no row, and a second call sends nothing (here, on a pool closed
// in between, it would fail if it sent).
func TestServer_ProveSets_once(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		db, table, srv := usedServer(t, s)
		ctx := testCtx(t)
		if srv.Forms().RefusesSets() {
			t.Skip("the Client refuses sets here before their proof")
		}
		if err := srv.ProveSets(ctx); err != nil {
			t.Fatal(err)
		}
		if !srv.Forms().Later[LaterSets] {
			t.Fatal("the set proof passed, not marked")
		}
		var n int
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+table+"`").Scan(&n); err != nil || n != 0 {
			t.Errorf("after the set proof: %d rows (%v), want 0", n, err)
		}
		srv.Close(ctx)
		db.Close()
		if err := srv.ProveSets(ctx); err != nil {
			t.Errorf("the second set proof, on a closed pool: %v, want nothing sent", err)
		}
	})
}
