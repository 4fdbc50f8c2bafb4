package sqllock

import (
	"database/sql"
	"strings"
	"sync"
	"testing"

	"github.com/sqllock/sqllock/internal/sqltext"
)

// Each server's forms, as the first-use check chooses them: the text of
// the statements and the flags read with them agree.
func TestServerForms_byServer(t *testing.T) {
	const table, qualified, db = "`t`", "`app`.`t`", "'app'"
	initial := initialForms(table)
	for _, tc := range []struct {
		version string
		carries bool
		check   func(t *testing.T, f *forms)
	}{
		{"8.0.11-TiDB-v9.0.0", false, func(t *testing.T, f *forms) {
			if !f.tidb || !f.oneRow || f.lockWait {
				t.Errorf("flags: %+v", *f)
			}
			if !strings.HasPrefix(f.sql[qAcquire], "INSERT "+tidbHint) || !strings.Contains(f.sql[qAcquire], table) {
				t.Errorf("acquire: got %q, want TiDB's form with its hint on the table", f.sql[qAcquire])
			}
		}},
		{"8.4.6-Vitess", false, func(t *testing.T, f *forms) {
			if f.tidb || !f.oneRow || !f.onceByRows {
				t.Errorf("flags: %+v", *f)
			}
			if strings.Contains(f.sql[qAcquire], tidbHint) || f.sql[qAcquire] == initial.sql[qAcquire] {
				t.Errorf("acquire: got %q, want the one-row form without TiDB's hint", f.sql[qAcquire])
			}
			if f.sql[qOnceRecord] != strings.ReplaceAll(initial.sql[qOnceRecord], table, qualified) {
				t.Errorf("once_record: got the one-row form, want the plain one")
			}
		}},
		{"10.11.19-MariaDB", true, func(t *testing.T, f *forms) {
			if !f.lockWait || f.oneRow {
				t.Errorf("flags: %+v", *f)
			}
			inDB := func(text string) string { return strings.ReplaceAll(text, table, qualified) }
			if f.sql[qAcquire] != queries["lock_wait_mariadb"]+"\n"+inDB(initial.sql[qAcquire]) || f.sql[qRefresh] != inDB(initial.sql[qRefresh]) {
				t.Errorf("acquire: got %q, want the lock wait bound before the initial form, and the rest as they were", f.sql[qAcquire])
			}
		}},
		{"8.4.3", true, func(t *testing.T, f *forms) {
			if !f.mysql || f.lockWait || f.oneRow || f.tidb {
				t.Errorf("flags: %+v", *f)
			}
			for i, text := range f.sql {
				if text != strings.ReplaceAll(initial.sql[i], table, qualified) {
					t.Errorf("%s: got %q, want the initial form in the database", stmtNames[i], text)
				}
			}
		}},
	} {
		t.Run(tc.version, func(t *testing.T) {
			f := serverForms(table, qualified, db, tc.version, tc.carries)
			if !f.chosen || f.table != qualified || f.db != db {
				t.Errorf("chosen %v, table %s, database %s: want true, %s, %s", f.chosen, f.table, f.db, qualified, db)
			}
			for i, text := range f.sql {
				if strings.Contains(text, table) && !strings.Contains(text, qualified) {
					t.Errorf("%s: got %q, want the table named in its database", stmtNames[i], text)
				}
			}
			tc.check(t, f)
		})
	}
}

// The forms are chosen once: a second check's choice changes nothing, and
// calls reading them while they are chosen see one whole value (run with
// -race).
func TestClient_chooseForms_once(t *testing.T) {
	e := newMockEnv(t) // sends nothing here
	c := e.c
	if c.learned().chosen {
		t.Fatal("chosen before any check")
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				f := c.learned()
				if f.lockWait != strings.HasPrefix(f.sql[qAcquire], queries["lock_wait_mariadb"]) {
					t.Error("a reader saw the flags of one value and the text of another")
					return
				}
			}
		}()
	}
	c.chooseForms("10.11.19-MariaDB", "`test`.`sqllock`", "'test'", true)
	wg.Wait()
	c.chooseForms("8.0.11-TiDB-v9.0.0", "`test`.`sqllock`", "'test'", false)
	if f := c.learned(); !f.lockWait || f.tidb || c.wait.Channels.Refused() {
		t.Errorf("after a second choice: %+v, channels refused %t; want MariaDB's forms kept", *f, c.wait.Channels.Refused())
	}
}

// What a check or a proof learned is never lost: marks made at once by
// many calls all stay, and choosing the forms keeps those made before it
// (run with -race).
func TestClient_mark_keptByEveryChange(t *testing.T) {
	c, err := New(newMockEnv(t).db) // sends nothing here
	if err != nil {
		t.Fatal(err)
	}
	if f := c.learned(); f.checked || f.proven || f.later != [numLaterProofs]bool{} {
		t.Fatalf("a new Client: %+v; want nothing learned", *f)
	}
	c.mark(func(f *forms) *bool { return &f.checked })
	var wg sync.WaitGroup
	for i := range numLaterProofs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.mark(func(f *forms) *bool { return &f.later[i] })
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		c.chooseForms("10.11.19-MariaDB", "`test`.`sqllock`", "'test'", true)
	}()
	c.markProven()
	wg.Wait()
	f := c.learned()
	if !f.chosen || !f.lockWait || !f.checked || !f.proven || f.later != [numLaterProofs]bool{true, true, true} {
		t.Errorf("after every mark and the choice: chosen %v (MariaDB's %v), checked %v, proven %v, later %v; want all",
			f.chosen, f.lockWait, f.checked, f.proven, f.later)
	}
}

// markProven makes c take the proof of its statements as made, for tests
// whose subject is not the proof.
func (c *Client) markProven() { c.mark(func(f *forms) *bool { return &f.proven }) }

// chooseFormsOn chooses c's forms for version as its first-use check
// would, in the database db's connections have.
func chooseFormsOn(t *testing.T, c *Client, db *sql.DB, version string, carries bool) {
	t.Helper()
	var name string
	if err := db.QueryRow("SELECT DATABASE()").Scan(&name); err != nil {
		t.Fatal(err)
	}
	qualified, lit, err := sqltext.Qualify(c.table, name)
	if err != nil {
		t.Fatal(err)
	}
	c.chooseForms(version, qualified, lit, carries)
}
