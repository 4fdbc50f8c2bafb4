package sqllock

import (
	"database/sql"
	"strings"
	"sync"
	"testing"

	"github.com/sqllock/sqllock/internal/engine"
	"github.com/sqllock/sqllock/internal/sqltext"
)

// The forms are chosen once: a second check's choice changes nothing, and
// calls reading them while they are chosen see one whole value (run with
// -race).
func TestClient_chooseForms_once(t *testing.T) {
	e := newMockEnv(t) // sends nothing here
	c := e.c
	if c.eng.Forms().Chosen {
		t.Fatal("chosen before any check")
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				f := c.eng.Forms()
				if f.LockWait != strings.HasPrefix(f.SQL[qAcquire], queries["lock_wait_mariadb"]) {
					t.Error("a reader saw the flags of one value and the text of another")
					return
				}
			}
		}()
	}
	c.chooseForms("10.11.19-MariaDB", "`test`.`sqllock`", "'test'", true)
	wg.Wait()
	c.chooseForms("8.0.11-TiDB-v9.0.0", "`test`.`sqllock`", "'test'", false)
	if f := c.eng.Forms(); !f.LockWait || f.TiDB || c.wait.Peek("").Refused {
		t.Errorf("after a second choice: %+v, channels refused %t; want MariaDB's forms kept", *f, c.wait.Peek("").Refused)
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
	if f := c.eng.Forms(); f.Checked || f.Proven || f.Later != [engine.NumLater]bool{} {
		t.Fatalf("a new Client: %+v; want nothing learned", *f)
	}
	c.eng.Mark(func(f *engine.Forms) *bool { return &f.Checked })
	var wg sync.WaitGroup
	for i := range engine.NumLater {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.eng.Mark(func(f *engine.Forms) *bool { return &f.Later[i] })
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		c.chooseForms("10.11.19-MariaDB", "`test`.`sqllock`", "'test'", true)
	}()
	c.markProven()
	wg.Wait()
	f := c.eng.Forms()
	if !f.Chosen || !f.LockWait || !f.Checked || !f.Proven || f.Later != [engine.NumLater]bool{true, true, true} {
		t.Errorf("after every mark and the choice: chosen %v (MariaDB's %v), checked %v, proven %v, later %v; want all",
			f.Chosen, f.LockWait, f.Checked, f.Proven, f.Later)
	}
}

// markProven makes c take the proof of its statements as made, for tests
// whose subject is not the proof.
func (c *Client) markProven() { c.eng.Mark(func(f *engine.Forms) *bool { return &f.Proven }) }

// chooseForms chooses c's forms as its first-use check does, and tells
// the Client, as the check does.
func (c *Client) chooseForms(version, qualified, db string, carries bool) {
	c.chosen(c.eng.Choose(version, qualified, db, carries), version)
}

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

// The forms' names and marks in queries.sql (sqltext), and the statements
// with a one-row form (engine.OneRowStmts).
const (
	tidbPrefix = sqltext.TiDBPrefix
	tidbHint   = sqltext.TiDBHint
)

var tidbStmts = engine.OneRowStmts
