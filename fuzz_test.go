package sqllock

import (
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/DATA-DOG/go-sqlmock"
)

// Fuzz targets for the input the library checks before it sends anything.
// Each checks a property against a definition written out here by hand, not
// only that nothing panics. The seed corpus is in testdata/fuzz/<FuzzName>;
// .ci/run fuzzes each target briefly.

// FuzzCheckName: a lock name is accepted exactly when it is 1 to MaxNameLen
// bytes, whatever the bytes are (the column is VARBINARY), but for the
// endings that name a semaphore's rows (semaphore.go).
func FuzzCheckName(f *testing.F) {
	f.Add("job")
	f.Add("")
	f.Add(strings.Repeat("x", MaxNameLen))
	f.Add(strings.Repeat("x", MaxNameLen+1))
	f.Add("Job \x00\xff")
	f.Add(strings.Repeat("é", MaxNameLen/2+1)) // 256 bytes, 128 runes
	f.Add("job\x00slot07")
	f.Add("job\x00slot7")
	semaphoreRows := regexp.MustCompile(`\x00slot([0-9][0-9])?\z`)
	f.Fuzz(func(t *testing.T, name string) {
		err := checkName(name)
		if want := len(name) >= 1 && len(name) <= MaxNameLen && !semaphoreRows.MatchString(name); (err == nil) != want {
			t.Fatalf("checkName(%d bytes): got %v, want accepted=%v", len(name), err, want)
		}
		if err != nil && !strings.HasPrefix(err.Error(), "sqllock: ") {
			t.Fatalf("checkName error %q: want the package's prefix", err)
		}
	})
}

// tableNameOK is the definition quoteTable must follow, byte by byte.
func tableNameOK(name string) bool {
	if len(name) < 1 || len(name) > 64 {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// FuzzQuoteTable: quoteTable and WithTable accept exactly the names of
// ^[A-Za-z0-9_]{1,64}$, and a Client built with one puts the quoted name,
// and nothing else, where queries.sql names the table.
func FuzzQuoteTable(f *testing.F) {
	for _, s := range []string{"sqllock", "my_locks", "", "a`b", "locks\n", "x; DROP TABLE t", strings.Repeat("t", 64), strings.Repeat("t", 65), "ｔａｂｌｅ", "t\x00"} {
		f.Add(s)
	}
	db, _, err := sqlmock.New()
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { db.Close() })
	f.Fuzz(func(t *testing.T, name string) {
		want := tableNameOK(name)
		q, err := quoteTable(name)
		if (err == nil) != want {
			t.Fatalf("quoteTable(%q): got %v, want accepted=%v", name, err, want)
		}
		c, cerr := New(db, WithTable(name))
		if (cerr == nil) != want {
			t.Fatalf("New(WithTable(%q)): got %v, want accepted=%v", name, cerr, want)
		}
		if !want {
			if q != "" || c != nil {
				t.Fatalf("refused %q: got %q, %v, want nothing", name, q, c)
			}
			return
		}
		if q != "`"+name+"`" || strings.Count(q, "`") != 2 {
			t.Fatalf("quoteTable(%q) = %q, want the name between two backticks and none inside", name, q)
		}
		for i, stmtName := range stmtNames {
			if got, want := c.eng.Forms().SQL[i], strings.ReplaceAll(queries[stmtName], tablePlaceholder, q); got != want {
				t.Fatalf("%s with table %q: got %q, want %q", stmtName, name, got, want)
			}
		}
		if got, want := c.eng.Text().Substitute(schema), strings.ReplaceAll(schema, tablePlaceholder, q); got != want {
			t.Fatalf("schema with table %q: got %q, want %q", name, got, want)
		}
	})
}

// renderQueries writes sections back in the format of queries.sql.
func renderQueries(q map[string]string) string {
	var b strings.Builder
	b.WriteString("-- Rendered again by FuzzSplitQueries.\n")
	for _, name := range slices.Sorted(maps.Keys(q)) {
		b.WriteString("-- name: " + name + "\n-- A comment.\n\n" + q[name] + ";\n\n")
	}
	return b.String()
}

// FuzzSplitQueries: whatever splitQueries accepts comes out as named, single
// statements without comments, blank lines or semicolons, and reads back the
// same when written out again; what it refuses it refuses with an error.
func FuzzSplitQueries(f *testing.F) {
	f.Add(queriesSQL)
	f.Add("-- name: schema\n" + schemaSQL)
	f.Add("-- name: a\nSELECT 1;\n-- name: b\n  SELECT x,\n  -- c\n  y FROM t ;\n")
	f.Add("SELECT 1;\n-- name: a\nSELECT 2;\n")
	f.Add("-- name: a\nSELECT 1; SELECT 2\n")
	f.Add("-- name: a\n-- name: a\n")
	f.Add("-- name:\tx\r\nSELECT '--';\r\n")
	f.Fuzz(func(t *testing.T, text string) {
		q, err := splitQueries(text)
		if err != nil {
			if q != nil {
				t.Fatalf("error %v with queries %q, want nil queries", err, q)
			}
			return
		}
		for name, stmt := range q {
			if name == "" || strings.ContainsAny(name, " \t\n") || name != strings.TrimSpace(name) {
				t.Fatalf("got query name %q, want a word", name)
			}
			if strings.TrimSpace(stmt) == "" || strings.Contains(stmt, ";") || stmt != strings.TrimLeft(stmt, " \t\r\n") {
				t.Fatalf("query %q = %q, want one statement with no semicolon or leading space", name, stmt)
			}
			// Whitespace before the cut semicolon stays; it is harmless.
			for _, line := range strings.Split(strings.TrimRightFunc(stmt, unicode.IsSpace), "\n") {
				if l := strings.TrimSpace(line); l == "" || strings.HasPrefix(l, "--") {
					t.Fatalf("query %q = %q holds a blank or comment line %q", name, stmt, line)
				}
			}
			if !strings.Contains(text, "-- name:") {
				t.Fatalf("query %q came from text without a marker", name)
			}
		}
		again, err := splitQueries(renderQueries(q))
		if err != nil {
			t.Fatalf("split of the rendered %q: %v", q, err)
		}
		if !maps.Equal(again, q) {
			t.Fatalf("round trip: got %q, want %q", again, q)
		}
	})
}
