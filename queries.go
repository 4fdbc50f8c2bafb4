package sqllock

import (
	_ "embed"
	"encoding/hex"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
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

// guardApplierMariaDB is the session guard's test for a replica's applier
// on MariaDB, a comment MySQL skips, in every guarded statement; on MySQL
// the Client puts guard_applier_mysql after it (queries.sql, withGuard).
const guardApplierMariaDB = "/*M! @@session.server_id = @@global.server_id AND */"

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

// The text of the statements a Client sends: its table and, on MySQL, its
// applier test put in (substitute, withGuard), and the statements sent as
// text with literals bound in place of their placeholders (bind): a set's
// (setSQL), the semaphore's (slotSQL) and the first use's.

// substitute puts the Client's quoted table name into a statement.
func (c *Client) substitute(stmt string) string {
	return c.withGuard(strings.ReplaceAll(stmt, tablePlaceholder, c.table))
}

// withGuard returns stmt with MySQL's test for a replica's applier in its
// session guard, on MySQL (queries.sql, guard_applier_mysql); stmt as it is
// elsewhere, or before the first use has found the server.
func (c *Client) withGuard(stmt string) string {
	if !c.mysqlGuard.Load() {
		return stmt
	}
	return strings.ReplaceAll(stmt, guardApplierMariaDB, guardApplierMariaDB+" "+queries["guard_applier_mysql"])
}

// firstUseSQL returns the first_use query about table.
func firstUseSQL(table string) string { return tableNamedSQL("first_use", table) }

// tableNamedSQL returns statement name of queries.sql with table, a name
// tableNameRE allows (no quoting needed inside a string literal), in place
// of the string 'sqllock': the statements that name the table in a string
// (first_use's reads of information_schema, the wake-up channels' lock
// names).
func tableNamedSQL(name, table string) string {
	return strings.ReplaceAll(queries[name], "'sqllock'", "'"+table+"'")
}

// acquireAllSQL returns the text of the acquire of set s for ttl.
func (c *Client) acquireAllSQL(s *lockSet, ttl time.Duration) string {
	us := strconv.FormatInt(ttl.Microseconds(), 10)
	holder := hexLiteral(c.holder)
	var rows []string
	if c.oneRow.Load() {
		for _, n := range s.lits {
			rows = append(rows, bind(queries["tidb_all_acquire_row"], n, s.tokenLit, holder, us))
		}
		return c.setSQL("tidb_all_acquire", strings.Join(rows, ",\n  "))
	}
	for _, n := range s.lits {
		rows = append(rows, bind(queries["all_acquire_lease"], n, s.tokenLit, holder, us))
	}
	for i, n := range s.lits {
		first := "all_acquire_fence"
		if i == 0 {
			first = "all_acquire_fence_first"
		}
		rows = append(rows, bind(queries[first], n))
	}
	for _, n := range s.lits {
		rows = append(rows, bind(queries["all_acquire_fence_write"], n))
	}
	q := c.setSQL("all_acquire", strings.Join(rows, ",\n  "), s.tokenLit, holder, s.tokenLit, us)
	if c.lockWait.Load() {
		// As the single acquire: a holder's Check holds a lease row for a
		// second at most, and the set is then reported held.
		q = queries["lock_wait_mariadb"] + "\n" + q
	}
	return q
}

// releaseAllSQL returns the statement that deletes the leases of set s.
func (c *Client) releaseAllSQL(s *lockSet) string {
	if c.tidb.Load() || c.oneRow.Load() {
		return c.setSQL("tidb_all_release", s.tokenLit, s.in)
	}
	return c.setSQL("all_release", s.tokenLit, s.in)
}

// refreshAllSQL returns the statement that extends the leases of set s to
// ttl (all_refresh; on the one-row forms, where no fence row is written,
// tidb_all_refresh).
func (c *Client) refreshAllSQL(s *lockSet, ttl string) string {
	if c.tidb.Load() || c.oneRow.Load() {
		return c.setSQL("tidb_all_refresh", ttl, s.tokenLit, s.in)
	}
	return c.setSQL("all_refresh", s.union, ttl, s.tokenLit)
}

// setSQL returns set statement name of queries.sql with lits in place of
// its placeholders, on the Client's table. The TiDB hint stays on TiDB
// alone, as in chooseForms.
func (c *Client) setSQL(name string, lits ...string) string {
	q := queries[name]
	if !c.tidb.Load() {
		q = strings.ReplaceAll(q, tidbHint, "")
	}
	return c.substitute(bind(q, lits...))
}

// slotSQLs caches slot_acquire's text by table, server and visit.
var slotSQLs sync.Map // slotSQLKey -> string

type slotSQLKey struct {
	table   string
	mariadb bool
	v       int
}

// slotSQL returns slot_acquire for table with its slot row written v times.
func slotSQL(table string, mariadb bool, v int) string {
	k := slotSQLKey{table, mariadb, v}
	if s, ok := slotSQLs.Load(k); ok {
		return s.(string)
	}
	q := queries["slot_acquire"]
	start := strings.Index(q, "(LAST_INSERT_ID(IF(")
	end := start + strings.Index(q[start:], "MICROSECOND),\n") + len("MICROSECOND),\n")
	row := q[start:end]
	text := q[:start] + strings.Repeat(row, v) + q[end:]
	if mariadb {
		text = queries["lock_wait_mariadb"] + "\n" + text
	}
	text = strings.ReplaceAll(text, tablePlaceholder, table)
	slotSQLs.Store(k, text)
	return text
}

// bind puts literals in place of the placeholders of stmt, in order. The
// literals are made here (hex digits, numbers), never taken from a caller.
func bind(stmt string, lits ...string) string {
	var b strings.Builder
	for _, l := range lits {
		i := strings.IndexByte(stmt, '?')
		b.WriteString(stmt[:i])
		b.WriteString(l)
		stmt = stmt[i+1:]
	}
	b.WriteString(stmt)
	return b.String()
}

// hexLiteral writes name as a hex literal, X'...', whatever bytes it holds.
func hexLiteral(name string) string { return "X'" + hex.EncodeToString([]byte(name)) + "'" }
