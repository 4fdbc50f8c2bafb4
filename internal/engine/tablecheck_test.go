package engine

import (
	"errors"
	"strings"
	"testing"

	"github.com/sqllock/sqllock/internal/testdsn"
)

// The first use checks the table and proves the statements, once, and
// leaves no proof row; a table that is not there is no error (the
// statement then says how to create it), and is checked again.
func TestServer_FirstUse_checksAndProves(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		db, table := serverTable(t, s)
		ctx := testCtx(t)
		missing := newTestServer(t, db, table+"_missing")
		if err := missing.FirstUse(ctx); err != nil {
			t.Fatalf("FirstUse without the table: %v, want nil", err)
		}
		if f := missing.Forms(); f.Checked || f.Proven || !f.Chosen {
			t.Errorf("without the table: checked %v proven %v chosen %v; want the forms chosen, nothing checked", f.Checked, f.Proven, f.Chosen)
		}
		srv := newTestServer(t, db, table)
		if err := srv.FirstUse(ctx); err != nil {
			t.Fatalf("FirstUse: %v", err)
		}
		if f := srv.Forms(); !f.Checked || !f.Proven || !strings.Contains(f.Table, "`"+table+"`") || f.DB == "" {
			t.Errorf("after FirstUse: %+v; want the table checked, the statements proven, the table in its database", *f)
		}
		var n int
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+table+"`").Scan(&n); err != nil || n != 0 {
			t.Errorf("rows left by the proof: %d (%v), want 0", n, err)
		}
	})
}

// A table that differs from schema.sql is refused at the first use, with
// each difference and the ALTER TABLE that mends it; the recheck finds an
// ALTER made while the Server runs, and a mended table serves again.
func TestServer_tableCheck_badTable(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		if s.Vitess || s.TiDB {
			t.Skip("it alters the table")
		}
		db, table := serverTable(t, s)
		ctx := testCtx(t)
		alter := func(def string) {
			t.Helper()
			if _, err := db.ExecContext(ctx, "ALTER TABLE `"+table+"` MODIFY COLUMN expires_at "+def); err != nil {
				t.Fatal(err)
			}
		}
		alter("DATETIME NOT NULL")
		err := newTestServer(t, db, table).FirstUse(ctx)
		wantErr(t, err, errBadTable, "column expires_at is DATETIME NOT NULL, must be DATETIME(6) NOT NULL", "MODIFY COLUMN expires_at DATETIME(6) NOT NULL")
		alter("DATETIME(6) NOT NULL")
		srv := newTestServer(t, db, table)
		if err := srv.FirstUse(ctx); err != nil {
			t.Fatalf("FirstUse of the mended table: %v", err)
		}
		alter("DATETIME NOT NULL")
		srv.SetRecheckDue(0)
		wantErr(t, srv.tableStillGood(ctx), errBadTable, "expires_at", "altered")
		alter("DATETIME(6) NOT NULL")
		srv.SetRecheckDue(0)
		if err := srv.tableStillGood(ctx); err != nil {
			t.Errorf("after mending it again: %v, want nil", err)
		}
	})
}

// A statement's error about the table says how to mend it: a missing
// table (Vitess's own words too), or one without schema.sql's columns.
func TestServer_TableProblem(t *testing.T) {
	srv := newTestServer(t, nil, "locks")
	for _, tc := range []struct{ err, want string }{
		{"Error 1146 (42S02): Table 'test.locks' doesn't exist", "table `locks` does not exist; create it"},
		{"Error 1054 (42S22): Unknown column 'kind' in 'where clause'", "does not have the columns of schema.sql"},
		{"Error 1105 (HY000): table locks not found", "Vitess knows no table `locks` in this keyspace"},
		{"Error 1105 (HY000): something else", ""},
		{"invalid connection", ""},
	} {
		got := srv.TableProblem(errors.New(tc.err))
		if tc.want == "" && got != "" || !strings.Contains(got, tc.want) {
			t.Errorf("%s: got %q, want %q", tc.err, got, tc.want)
		}
	}
}
