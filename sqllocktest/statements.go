package sqllocktest

import (
	_ "embed"
	"encoding/hex"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// queries.sql and schema.sql here are copies of the library's own files: the
// fake knows a statement by its text, exactly, with only the table's name
// (and, in the statements the library sends as text, the literals it puts in
// place of the placeholders) free. The library's tests hold the copies
// against the originals (fake_drift_test.go in the root package), so a statement
// changed there and not here fails a test, and every statement the library
// sends is one the fake recognises or refuses by name.

//go:embed queries.sql
var queriesSQL string

//go:embed schema.sql
var schemaSQL string

// notImplemented are the sections of queries.sql that the fake does not
// run, and why; every other statement of the file has a handler in handlers.go
// (a set's in sets.go, a semaphore's in semaphores.go, renew_many's and
// renew_found's in renew.go), or is a row of all_acquire (setRows).
var notImplemented = map[string]string{
	"lock_wait_mariadb":  "it is only a prefix of the acquire, run as part of it on MariaDB",
	"renew_many_mariadb": "it is only a prefix of renew_many and renew_found, run as part of them on MariaDB",
	// all_fences reads back the fences of a set taken with the one-row
	// form (tidb_all_acquire), whose insert id cannot carry them; the fake
	// says it is MySQL or MariaDB, so a Client takes the two-row form, whose insert
	// id carries the set's fence, and never sends it.
	"all_fences": "only a Client on the one-row forms (TiDB, Vitess) sends it, and the fake says it is MySQL or MariaDB",
	// A frozen holder's blocker is named by frozen_blocker_mysql or
	// frozen_blocker_mariadb, which name nobody here (frozen.go).
	"frozen_kill": "a Client sends it only for a connection a frozen_blocker statement named, which names none here",
	// The fake keeps no session (queries.sql, Sessions): it refuses the
	// first statement of one as a server that cannot would (1235), and a
	// Client then renews every lease with renew_many.
	"session_open":   sessionsRefused,
	"session_renew":  sessionsRefused,
	"session_attach": sessionsRefused,
	"session_found":  sessionsRefused,
	"session_detach": sessionsRefused,
	"session_close":  sessionsRefused,
}

const sessionsRefused = "the fake keeps no session; a Client renews every lease with renew_many"

// errSessionsRefused is the fake's answer to a session's statement.
var errSessionsRefused = ServerError{1235, "42000", "This version of MySQL doesn't yet support 'sessions (sqllocktest keeps none)'"}

// notSent are the sections of notImplemented that are whole statements: the
// fake knows them, to refuse them by name.
var notSent = map[string]bool{"all_fences": true, "session_open": true, "session_renew": true,
	"session_attach": true, "session_found": true, "session_detach": true, "session_close": true}

// setRows are the rows of all_acquire's VALUES list: templates of their
// own, matched in place of its rows hole (holeRows), not statements.
var setRows = map[string]bool{
	"all_acquire_lease":       true,
	"all_acquire_fence_first": true,
	"all_acquire_fence":       true,
	"all_acquire_fence_write": true,
}

// tidbPrefix begins the names of TiDB's forms, which a Client chooses only
// when the server says it is TiDB: the fake says it is MySQL or MariaDB.
const tidbPrefix = "tidb_"

// inTransactionGuard is the session guard's MariaDB-only test for an open
// transaction, which the first use's row-lock proof leaves out of the
// acquire it sends inside a transaction of its own (the library's
// inTransaction): the fake knows the acquire without it too.
const inTransactionGuard = " /*M! OR @@in_transaction = 1 AND ASCII(RIGHT(USER(), 1)) NOT IN (0, 64) */"

// tidbHint is the hint that only TiDB's statements keep.
const tidbHint = "/*+ SET_VAR(tidb_retry_limit=0) */ "

// rangeHint is the hint that only MySQL's statements keep (renew_many).
const rangeHint = "/*+ SET_VAR(range_optimizer_max_mem_size=0) */ "

// textStatements are sent as text with literals in place of their
// placeholders; the rest are prepared and take bound arguments.
var textStatements = map[string]bool{
	"wake_wait": true, "wake_release": true, "wake_probe": true, "look": true,
	"all_acquire": true, "all_refresh": true, "all_release": true, "all_release_at_least": true, "all_check": true,
	"all_fences": true, "renew_many": true, "renew_found": true, "force_release": true,
	"session_open": true, "session_renew": true, "session_attach": true, "session_found": true, "session_detach": true,
	"session_close": true,
}

// listStatements take a list of literals, separated by commas, in place of
// each of their last placeholders, as many as the value says (a set's
// names, in IN (?); renew_many's and renew_found's names, then their
// owner-and-name pairs).
var listStatements = map[string]int{
	"look": 1, "all_release": 1, "all_release_at_least": 1, "all_check": 1, "all_fences": 1,
	"renew_many": 2, "renew_found": 2, "session_attach": 2, "session_found": 2, "session_detach": 2,
}

// unionStatements take a list of literals, separated by " UNION ALL
// SELECT ", in place of their first placeholder (a set's names, as the
// derived table of all_refresh).
var unionStatements = map[string]bool{"all_refresh": true}

// rowsStatements take a list of rows, each one of setRows, separated by
// commas, in place of their first placeholder (VALUES ?).
var rowsStatements = map[string]bool{"all_acquire": true}

// A hole is a part of a statement's text that may vary.
type hole int

const (
	holeNone         hole = iota
	holeTable             // `name`: the Client's table
	holeTableString       // 'name': the table's name in a string literal
	holeDatabase          // DATABASE(), or the database as a string literal, as a Client sends it once it knows it
	holeLiteral           // X'hex' or a whole number, put in place of a placeholder
	holeLiteralList       // one literal or more, separated by ", "
	holeLiteralUnion      // one literal or more, separated by " UNION ALL SELECT "
	holeUint              // an unsigned whole number written in the text (#UINT# in a template)
	holeRows              // one row or more, each one of setRows, separated by ", "
	holeSlotRows          // slot_acquire's slot row, one or more times, each with its own bound arguments
)

type segment struct {
	text string // when hole is holeNone; for holeSlotRows, the row
	hole hole
}

// A template is a statement the fake recognises.
type template struct {
	name     string // as in queries.sql, or one of the fake's own (schema, version, ...)
	segments []segment
	params   int  // bound placeholders, but those of a holeSlotRows
	mariadb  bool // with MariaDB's lock-wait prefix, which MySQL (and the fake but WithMariaDB) refuses
	// guarded: the statement carries the session guard's MariaDB part,
	// which fails it inside a transaction there (call.guard).
	guarded bool
	// refused says why a Client never sends the statement to MySQL or
	// MariaDB, which the fake says it is: it is known only to be refused
	// by name.
	refused string
}

// A parsed statement is a template matched against a statement's text.
type parsed struct {
	t     *template
	table string   // the table's name, without quotes; "" if none
	lits  []string // the literals' values, decoded
	// lists is how many literals each holeLiteralList or holeLiteralUnion
	// took, in order: they are in lits with the others.
	lists  []int
	rows   []parsedRow // the rows of a holeRows, in order
	params int         // bound placeholders, each slot row's included
	// slotRows is how many times a holeSlotRows' row is written.
	slotRows int
}

// A parsedRow is one row of all_acquire's VALUES list: which of setRows it
// is, and its literals.
type parsedRow struct {
	name string
	lits []string
}

// Statements of the fake's own, outside queries.sql: the schema's CREATE
// TABLE, and the few a test harness sends around the library's.
var ownStatements = map[string]string{
	"version":              "SELECT VERSION()",
	"drop_table":           "DROP TABLE `sqllock`",
	"drop_table_if_exists": "DROP TABLE IF EXISTS `sqllock`",
	// Which connection holds a table's wake-up channel for a name: the
	// library's own tests ask it.
	"wake_holder": "SELECT IS_USED_LOCK(CONCAT('sqllock:', LEFT(SHA2(CONCAT_WS(0x00, DATABASE(), ?, ?), 256), 56)))",
	// A fence set ahead and the lease expired, as two of the library's
	// fence tests do (integration_test.go), by name bound or 'g'.
	// The fence goes as text (#UINT#: an unsigned whole number), the name
	// bound.
	"test_set_fence":   "UPDATE `sqllock` SET fence = IF(kind = 'F', #UINT#, 0), expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE name = ?",
	"test_set_fence_g": "UPDATE `sqllock` SET fence = IF(kind = 'F', ?, 0), expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE name = 'g'",
	// How many other sessions wait in wake_wait for a name of the table
	// bound: the same tests ask the processlist this one question, and the
	// fake knows no other. The table matters, for tests run side by side on
	// one server.
	"wake_waiters": "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE 'SELECT IS_FREE_LOCK(CONCAT(''sqllock:''%' AND ID <> CONNECTION_ID() AND INFO LIKE CONCAT('%''', ?, '''%')",
}

var templates = mustTemplates()

// rowTemplates are setRows' templates, matched in a holeRows.
var rowTemplates []*template

func mustTemplates() []*template {
	qs, err := splitQueries(queriesSQL)
	if err != nil {
		panic(err)
	}
	schema, err := splitQueries("-- name: schema\n" + schemaSQL)
	if err != nil {
		panic(err)
	}
	var out []*template
	var addOne func(name, text string, mariadb bool)
	add := func(name, text string, mariadb bool) {
		// TiDB's hint stays on TiDB's server alone: a Client sends the
		// statement without it to any other (queries.go, tidbHint).
		text = strings.ReplaceAll(text, tidbHint, "")
		addOne(name, text, mariadb)
	}
	addOne = func(name, text string, mariadb bool) {
		t := newTemplate(name, text, textStatements[name], mariadb)
		// all_acquire carries the guard in its rows (all_acquire_lease).
		t.guarded = strings.Contains(normalize(text), normalize(inTransactionGuard)) ||
			rowsStatements[name] && strings.Contains(normalize(qs["all_acquire_lease"]), normalize(inTransactionGuard))
		lists := listStatements[name]
		for i := len(t.segments) - 1; i >= 0 && lists > 0; i-- {
			if t.segments[i].hole == holeLiteral {
				t.segments[i].hole = holeLiteralList
				lists--
			}
		}
		if lists > 0 {
			panic(fmt.Sprintf("sqllocktest: queries.sql's statement %q has fewer placeholders than its lists (listStatements)", name))
		}
		if unionStatements[name] {
			for i := range t.segments {
				if t.segments[i].hole == holeLiteral {
					t.segments[i].hole = holeLiteralUnion
					break
				}
			}
		}
		if rowsStatements[name] {
			for i := range t.segments {
				if t.segments[i].hole == holeLiteral {
					t.segments[i].hole = holeRows
					break
				}
			}
		}
		for i, seg := range t.segments {
			if seg.hole == holeSlotRows {
				t.segments[i].text = normalize(slotRow(qs["slot_acquire"]))
			}
		}
		out = append(out, t)
	}
	for name, text := range qs {
		switch {
		case strings.HasPrefix(name, tidbPrefix), notSent[name]:
			// Known, as sent (TiDB's with its hint), to be refused by name.
			why := notImplemented[name]
			if why == "" {
				why = "TiDB's form of a statement, which a Client sends only to TiDB (the fake says it is MySQL or MariaDB)"
			}
			addOne(name, text, false)
			out[len(out)-1].refused = why
			continue
		case notImplemented[name] != "":
			continue
		case name == "slot_acquire":
			addSlotAcquire(qs, text, add)
			continue
		case setRows[name]:
			rowTemplates = append(rowTemplates, newTemplate(name, text, true, false))
			continue
		case handlers[name] == nil:
			panic(fmt.Sprintf("sqllocktest: queries.sql's statement %q has no handler: implement it in handlers.go or say why in notImplemented", name))
		}
		add(name, text, false)
		if name == "acquire" {
			add(name, strings.Replace(text, inTransactionGuard, "", 1), false)
		}
	}
	// MariaDB's forms: the acquires with the lock wait bound first (a
	// semaphore's in addSlotAcquire),
	prefix := qs["lock_wait_mariadb"] + "\n"
	add("acquire", prefix+qs["acquire"], true)
	add("acquire", prefix+strings.Replace(qs["acquire"], inTransactionGuard, "", 1), true)
	add("acquire_attached", prefix+qs["acquire_attached"], true)
	add("all_acquire", prefix+qs["all_acquire"], true)
	// and the shared renewal's, after their own prefix, without MySQL's hint.
	for _, name := range []string{"renew_many", "renew_found"} {
		add(name, qs["renew_many_mariadb"]+"\n"+strings.ReplaceAll(qs[name], rangeHint, ""), true)
	}
	mariadbLockWait = lockWaitOf(qs["lock_wait_mariadb"])
	add("schema", schema["schema"], false)
	for name, text := range ownStatements {
		add(name, text, false)
	}
	// Longest first, so that a statement is never taken for a shorter one
	// it begins with.
	sort.Slice(out, func(i, j int) bool { return len(out[i].segments) > len(out[j].segments) })
	return out
}

// mariadbLockWait is how long MariaDB's forms of the acquires wait for a
// row lock: the innodb_lock_wait_timeout their prefix sets
// (lock_wait_mariadb).
var mariadbLockWait time.Duration

// lockWaitOf reads the seconds of lock_wait_mariadb's prefix.
func lockWaitOf(prefix string) time.Duration {
	m := regexp.MustCompile(`innodb_lock_wait_timeout = ([0-9]+) FOR`).FindStringSubmatch(normalize(prefix))
	if m == nil {
		panic("sqllocktest: queries.sql's lock_wait_mariadb sets no innodb_lock_wait_timeout in whole seconds: make the fake read it")
	}
	n, _ := strconv.Atoi(m[1])
	return time.Duration(n) * time.Second
}

// splitQueries splits text into its "-- name: X" sections as the library
// does (queries.go): comments and blank lines dropped, the final semicolon cut.
func splitQueries(text string) (map[string]string, error) {
	out := map[string]string{}
	var name string
	var body []string
	flush := func() {
		if name != "" {
			out[name] = strings.TrimSuffix(strings.TrimSpace(strings.Join(body, "\n")), ";")
		}
	}
	for _, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		if rest, ok := strings.CutPrefix(trimmed, "-- name:"); ok {
			flush()
			name, body = strings.TrimSpace(rest), nil
			continue
		}
		if trimmed == "" || strings.HasPrefix(trimmed, "--") {
			continue
		}
		if name == "" {
			return nil, fmt.Errorf("sqllocktest: statement text before the first name marker")
		}
		body = append(body, line)
	}
	flush()
	return out, nil
}

// normalize collapses every run of white space to one space: the fake
// compares statements word for word, not by layout.
func normalize(q string) string { return strings.Join(strings.Fields(q), " ") }

func newTemplate(name, text string, literals, mariadb bool) *template {
	t := &template{name: name, mariadb: mariadb}
	rest := normalize(text)
	var lit strings.Builder
	flush := func() {
		if lit.Len() > 0 {
			t.segments = append(t.segments, segment{text: lit.String()})
			lit.Reset()
		}
	}
	for rest != "" {
		switch {
		case strings.HasPrefix(rest, "`sqllock`"):
			flush()
			t.segments = append(t.segments, segment{hole: holeTable})
			rest = rest[len("`sqllock`"):]
		case strings.HasPrefix(rest, "DATABASE()"):
			flush()
			t.segments = append(t.segments, segment{hole: holeDatabase})
			rest = rest[len("DATABASE()"):]
		case strings.HasPrefix(rest, "'sqllock'"):
			flush()
			t.segments = append(t.segments, segment{hole: holeTableString})
			rest = rest[len("'sqllock'"):]
		case strings.HasPrefix(rest, "#UINT#"):
			flush()
			t.segments = append(t.segments, segment{hole: holeUint})
			rest = rest[len("#UINT#"):]
		case strings.HasPrefix(rest, slotRowsMark):
			flush()
			t.segments = append(t.segments, segment{hole: holeSlotRows})
			rest = rest[len(slotRowsMark):]
		case rest[0] == '?' && literals:
			flush()
			t.segments = append(t.segments, segment{hole: holeLiteral})
			rest = rest[1:]
		default:
			if rest[0] == '?' {
				t.params++
			}
			lit.WriteByte(rest[0])
			rest = rest[1:]
		}
	}
	flush()
	return t
}

// parse finds the template query is, or returns an error naming the
// statement the fake does not implement: a statement of queries.sql that a
// Client sends only to another server, by its name, and any other SQL as
// an *unknownStatement.
func parse(query string) (*parsed, error) {
	q := normalize(query)
	for _, t := range templates {
		if p, ok := t.match(q); ok {
			if t.refused == sessionsRefused {
				return nil, errSessionsRefused
			}
			if t.refused != "" {
				return nil, fmt.Errorf("sqllocktest: not implemented: %s (queries.sql): %s", t.name, t.refused)
			}
			return p, nil
		}
	}
	return nil, &unknownStatement{q: q}
}

// An unknownStatement is SQL that is none of sqllock's statements as a
// Client sends them to MySQL or MariaDB. table, when not "", is the fake's table it
// names, which keeps it from a Handler.
type unknownStatement struct{ q, table string }

func (e *unknownStatement) Error() string {
	const max = 200
	q := e.q
	if len(q) > max {
		q = q[:max] + "..."
	}
	if e.table != "" {
		return fmt.Sprintf("sqllocktest: not implemented: the statement names the fake's table %s but is not one of sqllock's statements in the forms a Client sends to MySQL or MariaDB, and the fake hands no SQL that names its tables to the Handler: %s", e.table, q)
	}
	return fmt.Sprintf("sqllocktest: not implemented: the fake knows sqllock's statements (queries.sql, schema.sql) in the forms a Client sends to MySQL or MariaDB, and this is not one of them; other SQL needs a Handler (WithHandler): %s", q)
}

func (t *template) match(q string) (*parsed, bool) {
	p := &parsed{t: t, params: t.params}
	rest, ok := t.matchPrefix(q, p)
	return p, ok && rest == ""
}

// matchPrefix matches the template against the start of q, into p, and
// returns the rest of q.
func (t *template) matchPrefix(q string, p *parsed) (string, bool) {
	for _, s := range t.segments {
		switch s.hole {
		case holeNone:
			if !strings.HasPrefix(q, s.text) {
				return "", false
			}
			q = q[len(s.text):]
			continue
		case holeDatabase:
			rest, ok := strings.CutPrefix(q, "DATABASE()")
			if !ok {
				rest, ok = strings.CutPrefix(q, "'"+Database+"'")
			}
			if !ok {
				return "", false
			}
			q = rest
		case holeTable, holeTableString:
			quote := byte('`')
			if s.hole == holeTableString {
				quote = '\''
			} else {
				// A Client names its table in the database its first use
				// found (the fake's only one).
				q = strings.TrimPrefix(q, "`"+Database+"`.")
			}
			if q == "" || q[0] != quote {
				return "", false
			}
			end := strings.IndexByte(q[1:], quote)
			if end < 0 || !validTable(q[1:1+end]) {
				return "", false
			}
			name := q[1 : 1+end]
			if p.table != "" && p.table != name {
				return "", false // one statement, one table
			}
			p.table = name
			q = q[end+2:]
		case holeLiteral:
			v, n, ok := readLiteral(q)
			if !ok {
				return "", false
			}
			p.lits = append(p.lits, v)
			q = q[n:]
		case holeUint:
			n := 0
			for n < len(q) && q[n] >= '0' && q[n] <= '9' {
				n++
			}
			if _, err := strconv.ParseUint(q[:n], 10, 64); n == 0 || err != nil {
				return "", false
			}
			p.lits = append(p.lits, q[:n])
			q = q[n:]
		case holeSlotRows:
			// The rows follow one another, a space between them.
			for {
				if !strings.HasPrefix(q, s.text) {
					return "", false
				}
				q = q[len(s.text):]
				p.slotRows++
				p.params += strings.Count(s.text, "?")
				if !strings.HasPrefix(q, " "+s.text) {
					break
				}
				q = q[1:]
			}
		case holeRows:
			for {
				rest, ok := matchRow(q, p)
				if !ok {
					return "", false
				}
				q = rest
				rest, more := strings.CutPrefix(q, ", ")
				if !more {
					break
				}
				q = rest
			}
		case holeLiteralList, holeLiteralUnion:
			sep := ", "
			if s.hole == holeLiteralUnion {
				sep = " UNION ALL SELECT "
			}
			count := 0
			for {
				v, n, ok := readLiteral(q)
				if !ok {
					return "", false
				}
				p.lits = append(p.lits, v)
				count++
				q = q[n:]
				rest, more := strings.CutPrefix(q, sep)
				if !more {
					break
				}
				q = rest
			}
			p.lists = append(p.lists, count)
		}
	}
	return q, true
}

// matchRow matches one of rowTemplates at the start of q, appends it to
// p.rows, and returns the rest of q.
func matchRow(q string, p *parsed) (string, bool) {
	for _, t := range rowTemplates {
		r := &parsed{t: t}
		if rest, ok := t.matchPrefix(q, r); ok && r.table == "" {
			p.rows = append(p.rows, parsedRow{name: t.name, lits: r.lits})
			return rest, true
		}
	}
	return "", false
}

// validTable reports whether name is one the library accepts (WithTable).
func validTable(name string) bool {
	if len(name) < 1 || len(name) > 64 {
		return false
	}
	for _, r := range name {
		if !(r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return false
		}
	}
	return true
}

// readLiteral reads X'hex' or a whole number at the start of q: the
// literals the library binds into its text statements (internal/wait/channel.go).
func readLiteral(q string) (val string, n int, ok bool) {
	if strings.HasPrefix(q, "X'") {
		end := strings.IndexByte(q[2:], '\'')
		if end < 0 {
			return "", 0, false
		}
		b, err := hex.DecodeString(q[2 : 2+end])
		if err != nil {
			return "", 0, false
		}
		return string(b), end + 3, true
	}
	i := 0
	if i < len(q) && q[i] == '-' {
		i++
	}
	for i < len(q) && q[i] >= '0' && q[i] <= '9' {
		i++
	}
	if i == 0 || q[:i] == "-" {
		return "", 0, false
	}
	if _, err := strconv.ParseInt(q[:i], 10, 64); err != nil {
		return "", 0, false
	}
	return q[:i], i, true
}

// statementNames are the names Fault.Statement accepts.
func statementNames() []string {
	seen := map[string]bool{}
	var names []string
	for _, t := range templates {
		if !seen[t.name] && t.refused == "" {
			seen[t.name] = true
			names = append(names, t.name)
		}
	}
	sort.Strings(names)
	return names
}
