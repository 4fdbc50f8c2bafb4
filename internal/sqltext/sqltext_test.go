package sqltext

import (
	"maps"
	"strings"
	"testing"
)

func TestSplit_errors(t *testing.T) {
	tests := []struct {
		name, text, want string
	}{
		{"text before the first marker", "SELECT 1;\n-- name: a\nSELECT 2;\n", `line 1: statement text before the first "-- name:" marker`},
		{"comment-only section", "-- name: a\n-- nothing\n\n-- name: b\nSELECT 1;\n", `query "a" is empty`},
		{"empty last section", "-- name: a\nSELECT 1;\n-- name: b\n", `query "b" is empty`},
		{"semicolon only", "-- name: a\n;\n", `query "a" is empty`},
		{"duplicate name", "-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;\n", `line 3: query "a" defined twice`},
		{"two statements", "-- name: a\nSELECT 1;\nSELECT 2;\n", `query "a" holds more than one statement`},
		{"two statements on a line", "-- name: a\nSELECT 1; SELECT 2\n", `query "a" holds more than one statement`},
		{"no name", "-- name:\nSELECT 1;\n", `line 1: bad query name ""`},
		{"name with a space", "-- name: a b\nSELECT 1;\n", `bad query name "a b"`},
		{"name with a tab", "-- name: a\tb\nSELECT 1;\n", `bad query name "a\tb"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Split(tt.text)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error: got %v, want one with %q", err, tt.want)
			}
			if got != nil {
				t.Errorf("queries: got %v, want nil", got)
			}
		})
	}
	t.Run("MustSplit panics", func(t *testing.T) {
		defer func() {
			if r := recover(); r == nil {
				t.Errorf("recover: got nil, want a panic")
			}
		}()
		MustSplit("SELECT 1;")
	})
}

func TestSplit_dropsCommentsAndSemicolon(t *testing.T) {
	text := `-- A header of comments is allowed.

-- name: a
-- About a.
SELECT x,
  -- between lines
  y
FROM t;

-- name:   b
  SELECT 1 ;
-- trailing comment
`
	got, err := Split(text)
	if err != nil {
		t.Fatalf("Split: got %v, want nil", err)
	}
	want := Statements{"a": "SELECT x,\n  y\nFROM t", "b": "SELECT 1 "}
	if !maps.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

// Bind fills the placeholders in order and leaves the rest of the text.
func TestBind(t *testing.T) {
	if got := Bind("a ? b ? c", "1", Hex("n")); got != "a 1 b X'6e' c" {
		t.Errorf("got %q", got)
	}
}

// Substitute puts the table in, and once the database is known, its
// literal in place of DATABASE(); Set drops the TiDB hint elsewhere than
// on TiDB.
func TestForms_Substitute(t *testing.T) {
	q := Statements{"s": "UPDATE " + TiDBHint + Placeholder + " SET x = ? WHERE y = DATABASE()", "n": "SELECT 'sqllock', DATABASE() FROM " + Placeholder}
	f := Forms{Q: q, Table: "`t`", Name: "t"}
	if got, want := f.Set("s", "1"), "UPDATE `t` SET x = 1 WHERE y = DATABASE()"; got != want {
		t.Errorf("before the first use: got %q, want %q", got, want)
	}
	var err error
	if f.Table, f.DB, err = Qualify("`t`", "app-1"); err != nil {
		t.Fatal(err)
	}
	f.TiDB = true
	if got, want := f.Set("s", "1"), "UPDATE "+TiDBHint+"`app-1`.`t` SET x = 1 WHERE y = 'app-1'"; got != want {
		t.Errorf("TiDB, the database known: got %q, want %q", got, want)
	}
	if got, want := f.Named("n"), "SELECT 't', 'app-1' FROM `app-1`.`t`"; got != want {
		t.Errorf("Named: got %q, want %q", got, want)
	}
}

// Qualify refuses a database no literal holds the same under every
// sql_mode, naming it.
func TestQualify_refused(t *testing.T) {
	for _, db := range []string{"", "it's", `back\slash`, "tick`", "nl\n"} {
		if _, _, err := Qualify("`t`", db); err == nil || !strings.Contains(err.Error(), "database") {
			t.Errorf("Qualify(%q): got %v, want an error naming the database", db, err)
		}
	}
}

// Slot writes its slot row v times, on the table given, with MariaDB's
// lock wait bound first there, and gives the same text again from its
// cache.
func TestStatements_Slot(t *testing.T) {
	q := Statements{"lock_wait_mariadb": "SET STATEMENT x FOR", "slot_acquire": "INSERT INTO " + Placeholder + " VALUES\n(LAST_INSERT_ID(IF(?)) + INTERVAL ? MICROSECOND),\nEND"}
	got := q.Slot("`t`", true, 3)
	if strings.Count(got, "(LAST_INSERT_ID(IF(") != 3 || !strings.HasPrefix(got, "SET STATEMENT x FOR\nINSERT INTO `t` VALUES") {
		t.Errorf("got %q", got)
	}
	if again := q.Slot("`t`", true, 3); again != got {
		t.Errorf("again: got %q, want %q", again, got)
	}
}

// QuoteTable takes the names a table may have, quoted, and refuses others
// by name.
func TestQuoteTable(t *testing.T) {
	if got, err := QuoteTable("locks_1"); err != nil || got != "`locks_1`" {
		t.Errorf("locks_1: got %q, %v", got, err)
	}
	for _, bad := range []string{"", "a-b", "a`b", strings.Repeat("x", 65)} {
		if _, err := QuoteTable(bad); err == nil || !strings.Contains(err.Error(), "bad table name") {
			t.Errorf("%q: got %v, want a bad table name error", bad, err)
		}
	}
}
