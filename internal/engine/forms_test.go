package engine

import (
	"os"
	"strings"
	"testing"

	"github.com/sqllock/sqllock/internal/sqltext"
)

// queries are the statements of the root's queries.sql.
var queries = func() sqltext.Statements {
	b, err := os.ReadFile("../../queries.sql")
	if err != nil {
		panic(err)
	}
	return sqltext.MustSplit(string(b))
}()

// Each server's forms, as the first-use check chooses them: the text of
// the statements and the flags read with them agree.
func TestServerForms_byServer(t *testing.T) {
	const table, qualified, db = "`t`", "`app`.`t`", "'app'"
	initial := initialForms(queries, table)
	for _, tc := range []struct {
		version string
		carries bool
		check   func(t *testing.T, f *Forms)
	}{
		{"8.0.11-TiDB-v9.0.0", false, func(t *testing.T, f *Forms) {
			if !f.TiDB || !f.OneRow || f.LockWait {
				t.Errorf("flags: %+v", *f)
			}
			if !strings.HasPrefix(f.SQL[Acquire], "INSERT "+sqltext.TiDBHint) || !strings.Contains(f.SQL[Acquire], table) {
				t.Errorf("acquire: got %q, want TiDB's form with its hint on the table", f.SQL[Acquire])
			}
		}},
		{"8.4.6-Vitess", false, func(t *testing.T, f *Forms) {
			if f.TiDB || !f.OneRow || !f.OnceByRows {
				t.Errorf("flags: %+v", *f)
			}
			if strings.Contains(f.SQL[Acquire], sqltext.TiDBHint) || f.SQL[Acquire] == initial.SQL[Acquire] {
				t.Errorf("acquire: got %q, want the one-row form without TiDB's hint", f.SQL[Acquire])
			}
			if f.SQL[OnceRecord] != strings.ReplaceAll(initial.SQL[OnceRecord], table, qualified) {
				t.Errorf("once_record: got the one-row form, want the plain one")
			}
		}},
		{"10.11.19-MariaDB", true, func(t *testing.T, f *Forms) {
			if !f.LockWait || f.OneRow {
				t.Errorf("flags: %+v", *f)
			}
			inDB := func(text string) string { return strings.ReplaceAll(text, table, qualified) }
			if f.SQL[Acquire] != queries["lock_wait_mariadb"]+"\n"+inDB(initial.SQL[Acquire]) || f.SQL[Refresh] != inDB(initial.SQL[Refresh]) {
				t.Errorf("acquire: got %q, want the lock wait bound before the initial form, and the rest as they were", f.SQL[Acquire])
			}
		}},
		{"8.4.3", true, func(t *testing.T, f *Forms) {
			if !f.MySQL || f.LockWait || f.OneRow || f.TiDB {
				t.Errorf("flags: %+v", *f)
			}
			for i, text := range f.SQL {
				if text != strings.ReplaceAll(initial.SQL[i], table, qualified) {
					t.Errorf("%s: got %q, want the initial form in the database", Names[i], text)
				}
			}
		}},
	} {
		t.Run(tc.version, func(t *testing.T) {
			f := serverForms(queries, table, qualified, db, tc.version, tc.carries)
			if !f.Chosen || f.Table != qualified || f.DB != db {
				t.Errorf("chosen %v, table %s, database %s: want true, %s, %s", f.Chosen, f.Table, f.DB, qualified, db)
			}
			for i, text := range f.SQL {
				if strings.Contains(text, table) && !strings.Contains(text, qualified) {
					t.Errorf("%s: got %q, want the table named in its database", Names[i], text)
				}
			}
			tc.check(t, f)
		})
	}
}
