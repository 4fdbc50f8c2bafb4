// Package sqltext builds the text of every statement a Client sends, from
// the statements of queries.sql and schema.sql, which the root package
// embeds and hands in: a Client's table put in place of the files' own
// name, the session guard's test for MySQL's replica applier, the forms a
// server needs (TiDB's hint, MariaDB's lock-wait bound), and the statements
// sent as text, with literals bound in place of their placeholders (a
// set's, a semaphore's). It reads no server and holds no state but a cache
// of the semaphore statement's texts: what the Client has learned about
// its server comes in a Forms value.
package sqltext

import (
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"
	"sync"
)

// Placeholder is how queries.sql and schema.sql name the table; a Client
// puts its own quoted table name in its place (Forms.Substitute).
const Placeholder = "`sqllock`"

// tableNameRE is what a table name may be. MySQL cannot bind identifiers,
// so the name is checked, backtick-quoted and substituted into the text.
var tableNameRE = regexp.MustCompile(`^[A-Za-z0-9_]{1,64}$`)

// QuoteTable checks name and returns it backtick-quoted.
func QuoteTable(name string) (string, error) {
	if !tableNameRE.MatchString(name) {
		return "", fmt.Errorf("sqllock: bad table name %q: want 1 to 64 of A-Z, a-z, 0-9 and _", name)
	}
	return "`" + name + "`", nil
}

// Statements are the statements of queries.sql, by name.
type Statements map[string]string

// MustSplit is Split, for the files the root package embeds: an error is
// the package's own, and panics.
func MustSplit(text string) Statements {
	q, err := Split(text)
	if err != nil {
		panic(err)
	}
	return q
}

// Split splits text into the sections that start with a "-- name: X" line.
// Comment lines and blank lines are dropped and a final semicolon is cut,
// so each value is one statement ready to prepare. Text before the first
// marker may only be comments.
func Split(text string) (Statements, error) {
	out := make(Statements)
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

// TiDBPrefix names, in queries.sql, the statements that take the place of
// others on TiDB: a name has one row there.
const TiDBPrefix = "tidb_"

// TiDBHint begins each TiDB form that writes; other servers that take the
// one-row forms take them without it.
const TiDBHint = "/*+ SET_VAR(tidb_retry_limit=0) */ "

// RangeHint lifts, for one statement, the bound on the memory MySQL's
// range optimizer plans with (queries.sql, renew_many): it stays on MySQL
// 8.0 and later alone.
const RangeHint = "/*+ SET_VAR(range_optimizer_max_mem_size=0) */ "

// Forms is what the text of a Client's statements depends on: its
// statements, its quoted table, and what the first use found of the
// server.
type Forms struct {
	Q     Statements
	Table string // quoted: `name`, or `database`.`name` once the first use found the database
	Name  string // the table's own name, unquoted
	// DB is the database the first use found, as a string literal, in
	// place of DATABASE() in the statements that read it; "" before.
	DB string
	// TiDB: the server is TiDB, whose forms keep their hint.
	TiDB bool
	// OneRow: the server takes the one-row forms (TiDB, Vitess): a name
	// has no fence row.
	OneRow bool
	// LockWait: MariaDB, whose acquires bound their row lock wait.
	LockWait bool
	// MySQL: MySQL 8.0 or later itself, whose statements keep RangeHint.
	MySQL bool
}

// database is what a statement that reads the connection's database
// says, replaced by Forms.DB.
const database = "DATABASE()"

// Substitute puts the table into stmt, and the database in place of
// DATABASE(), so that no statement depends on the database a connection
// of the pool has chosen (USE).
func (f Forms) Substitute(stmt string) string {
	stmt = strings.ReplaceAll(stmt, Placeholder, f.Table)
	if f.DB != "" {
		stmt = strings.ReplaceAll(stmt, database, f.DB)
	}
	return stmt
}

// Qualify returns the quoted table, `table`, in database db: `db`.`table`,
// and db as a string literal, which Forms.Table and Forms.DB then hold. It
// fails for a name that no literal can hold the same under every sql_mode
// (a quote, a backslash, a backtick, a control character).
func Qualify(table, db string) (qualified, literal string, err error) {
	if db == "" || strings.ContainsAny(db, "'\\`") || strings.ContainsFunc(db, func(r rune) bool { return r < ' ' }) {
		return "", "", fmt.Errorf("sqllock: the database %q has a character sqllock cannot quote in every sql_mode (a quote, a backslash, a backtick, a control character): keep the table in a database of another name", db)
	}
	return "`" + db + "`." + table, "'" + db + "'", nil
}

// Named returns statement name with the table's name in place of the
// string 'sqllock' (TableNamed) and the database in place of DATABASE():
// the statements that name the table in a string (the first use's reads
// of information_schema, the wake-up channels' lock names), and look. On
// the one-row forms a statement that has a form of its own there (look's:
// Vitess's sharded keyspace refuses its session read) is that form.
func (f Forms) Named(name string) string {
	if _, ok := f.Q[TiDBPrefix+name]; ok && f.OneRow {
		name = TiDBPrefix + name
	}
	return f.Substitute(f.Q.TableNamed(name, f.Name))
}

// Set returns set statement name with lits in place of its placeholders,
// on the table. The TiDB hint stays on TiDB alone, RangeHint on MySQL.
func (f Forms) Set(name string, lits ...string) string {
	q := f.Q[name]
	if !f.TiDB {
		q = strings.ReplaceAll(q, TiDBHint, "")
	}
	if !f.MySQL {
		q = strings.ReplaceAll(q, RangeHint, "")
	}
	return f.Substitute(Bind(q, lits...))
}

// AcquireSet returns the acquire of the set whose names are the literals
// names, under the literal token for us microseconds (a number's text), by
// the literal holder.
func (f Forms) AcquireSet(names []string, token, holder, us string) string {
	var rows []string
	if f.OneRow {
		for _, n := range names {
			rows = append(rows, Bind(f.Q["tidb_all_acquire_row"], n, token, holder, us))
		}
		return f.Set("tidb_all_acquire", strings.Join(rows, ",\n  "))
	}
	for _, n := range names {
		rows = append(rows, Bind(f.Q["all_acquire_lease"], n, token, holder, us))
	}
	for i, n := range names {
		first := "all_acquire_fence"
		if i == 0 {
			first = "all_acquire_fence_first"
		}
		rows = append(rows, Bind(f.Q[first], n))
	}
	for _, n := range names {
		rows = append(rows, Bind(f.Q["all_acquire_fence_write"], n))
	}
	q := f.Set("all_acquire", strings.Join(rows, ",\n  "), token, holder, us, token)
	if f.LockWait {
		// As the single acquire: a holder's Check holds a lease row for a
		// second at most, and the set is then reported held.
		q = f.Q["lock_wait_mariadb"] + "\n" + q
	}
	return q
}

// ReleaseAll returns the statement that deletes the set's leases: token
// and in are literals (in, the names' list).
func (f Forms) ReleaseAll(token, in string) string {
	if f.TiDB || f.OneRow {
		return f.Set("tidb_all_release", token, in)
	}
	return f.Set("all_release", token, in)
}

// RefreshAll returns the statement that extends the set's leases to ttl
// (all_refresh, which reads the names from union; on the one-row forms,
// where no fence row is written, tidb_all_refresh, from in).
func (f Forms) RefreshAll(union, in, token, ttl string) string {
	if f.TiDB || f.OneRow {
		return f.Set("tidb_all_refresh", ttl, token, in)
	}
	return f.Set("all_refresh", union, ttl, token)
}

// TableNamed returns statement name of q with table, a name QuoteTable
// allows (no quoting needed inside a string literal), in place of the
// string 'sqllock': the statements that name the table in a string (the
// first use's reads of information_schema, the wake-up channels' lock
// names).
func (q Statements) TableNamed(name, table string) string {
	return strings.ReplaceAll(q[name], "'sqllock'", "'"+table+"'")
}

// slots caches slot_acquire's text by table, server and visit.
var slots sync.Map // slotKey -> string

type slotKey struct {
	table   string
	mariadb bool
	v       int
}

// Slot returns q's slot_acquire for table (quoted) with its slot row
// written v times; on MariaDB, with the lock wait bound first.
func (q Statements) Slot(table string, mariadb bool, v int) string {
	k := slotKey{table, mariadb, v}
	if s, ok := slots.Load(k); ok {
		return s.(string)
	}
	text := q["slot_acquire"]
	start := strings.Index(text, "(LAST_INSERT_ID(IF(")
	end := start + strings.Index(text[start:], "MICROSECOND),\n") + len("MICROSECOND),\n")
	row := text[start:end]
	text = text[:start] + strings.Repeat(row, v) + text[end:]
	if mariadb {
		text = q["lock_wait_mariadb"] + "\n" + text
	}
	text = strings.ReplaceAll(text, Placeholder, table)
	slots.Store(k, text)
	return text
}

// Bind puts literals in place of the placeholders of stmt, in order. The
// literals are made by the caller's code (hex digits, numbers), never
// taken from a user.
func Bind(stmt string, lits ...string) string {
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

// Hex writes name as a hex literal, X'...', whatever bytes it holds.
func Hex(name string) string { return "X'" + hex.EncodeToString([]byte(name)) + "'" }
