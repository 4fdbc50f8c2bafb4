package sqllock

import (
	_ "embed"
	"fmt"
	"regexp"
	"strings"
)

//go:embed queries.sql
var queriesSQL string

//go:embed schema.sql
var schemaSQL string

// tablePlaceholder is how queries.sql and schema.sql name the table; a
// Client puts its own quoted table name in its place once, in New.
const tablePlaceholder = "`sqllock`"

// tableNameRE is what WithTable accepts. MySQL cannot bind identifiers, so
// the name is checked, backtick-quoted and substituted into the SQL text.
var tableNameRE = regexp.MustCompile(`^[A-Za-z0-9_]{1,64}$`)

// queries holds the statements of queries.sql by name.
var queries = mustSplitQueries(queriesSQL)

// schema is the CREATE TABLE statement of schema.sql.
var schema = mustSplitQueries("-- name: schema\n" + schemaSQL)["schema"]

func mustSplitQueries(text string) map[string]string {
	q, err := splitQueries(text)
	if err != nil {
		panic(err)
	}
	return q
}

// splitQueries splits text into the sections that start with a
// "-- name: X" line. Comment lines and blank lines are dropped and a final
// semicolon is cut, so each value is one statement ready to prepare. Text
// before the first marker may only be comments.
func splitQueries(text string) (map[string]string, error) {
	out := make(map[string]string)
	var name string
	var body []string
	flush := func() error {
		if name == "" {
			return nil
		}
		stmt := strings.TrimSuffix(strings.TrimSpace(strings.Join(body, "\n")), ";")
		if strings.TrimSpace(stmt) == "" {
			return fmt.Errorf("sqllock: query %q is empty", name)
		}
		if strings.Contains(stmt, ";") {
			return fmt.Errorf("sqllock: query %q holds more than one statement", name)
		}
		out[name] = stmt
		return nil
	}
	for i, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		if rest, ok := strings.CutPrefix(trimmed, "-- name:"); ok {
			if err := flush(); err != nil {
				return nil, err
			}
			name = strings.TrimSpace(rest)
			body = body[:0]
			if name == "" || strings.ContainsAny(name, " \t") {
				return nil, fmt.Errorf("sqllock: line %d: bad query name %q", i+1, name)
			}
			if _, dup := out[name]; dup {
				return nil, fmt.Errorf("sqllock: line %d: query %q defined twice", i+1, name)
			}
			continue
		}
		if trimmed == "" || strings.HasPrefix(trimmed, "--") {
			continue
		}
		if name == "" {
			return nil, fmt.Errorf("sqllock: line %d: statement text before the first \"-- name:\" marker", i+1)
		}
		body = append(body, line)
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return out, nil
}

// quoteTable checks name against tableNameRE and returns it backtick-quoted.
func quoteTable(name string) (string, error) {
	if !tableNameRE.MatchString(name) {
		return "", fmt.Errorf("sqllock: bad table name %q: want 1 to 64 of A-Z, a-z, 0-9 and _", name)
	}
	return "`" + name + "`", nil
}

// Statements of queries.sql, by index into Client.stmts.
const (
	qAcquire = iota
	qRefresh
	qRelease
	qInspect
	qReleaseAtLeast // do.go
	qCheck          // lock.go
	qList           // admin.go
	qOnceDone       // once.go
	qOnceRecord     // once.go
	qLease          // admin.go
	qOnceReset      // admin.go
	numStmts
)

var stmtNames = [numStmts]string{
	qAcquire: "acquire",
	qRefresh: "refresh",
	qRelease: "release",
	qInspect: "inspect",

	qReleaseAtLeast: "release_at_least",
	qCheck:          "check",
	qList:           "list",
	qOnceDone:       "once_done",
	qOnceRecord:     "once_record",
	qLease:          "lease",
	qOnceReset:      "once_reset",
}

// tidbPrefix names, in queries.sql, the statements that take the place of
// others on TiDB (tablecheck.go): a name has one row there.
const tidbPrefix = "tidb_"

// tidbHint begins each TiDB form that writes; other servers that take the
// one-row forms (tablecheck.go) take them without it.
const tidbHint = "/*+ SET_VAR(tidb_retry_limit=0) */ "

// tidbStmts are the statements with a TiDB form; the rest serve TiDB as
// they are.
var tidbStmts = []int{qAcquire, qRefresh, qRelease, qInspect, qReleaseAtLeast, qList, qLease, qOnceRecord}

// tidbAcquireArgs is how many of the acquire's arguments the one-row form
// (TiDB's) takes: the first four, which both forms begin with (queries.sql).
const tidbAcquireArgs = 4
