package sqllock

// Unit tests over go-sqlmock, for what a real server cannot be made to do on
// demand: deadlocks, lost replies, cancellation mid-statement, a missing
// table. Expected SQL always comes from the queries map (queries.sql), with
// the table placeholder substituted, so these tests follow the SQL file.

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock/internal/fault"
	"github.com/sqllock/sqllock/internal/mysqlerr"
)

// ---------------------------------------------------------------------------
// Mock environment

// mockHolder is the holder description every mock Client sends unless a test
// sets its own with WithHolder.
const mockHolder = "unit-test-holder"

// mockTables are the tables the statement tests run with: the default, whose
// quoted name is the placeholder itself, and one set by WithTable.
var mockTables = []string{DefaultTable, "my_locks"}

// mockEnv is a Client over a sqlmock database that matches SQL exactly (up to
// whitespace) and in order. It remembers which statements the Client has
// prepared, so that expectExec can expect the lazy preparation first.
type mockEnv struct {
	t        *testing.T
	db       *sql.DB
	mock     sqlmock.Sqlmock
	c        *Client
	table    string // unquoted
	checked  bool   // the autocommit check has been expected
	proven   bool   // the proof of the statements has been expected (proof.go)
	tidb     bool   // the first-use check answered TiDB
	vitess   bool   // the first-use check saw LAST_INSERT_ID() miss its statement's value (Vitess)
	prepared map[string]*sqlmock.ExpectedPrepare
}

// newMockEnv returns a mock Client on the default table.
func newMockEnv(t *testing.T, opts ...Option) *mockEnv {
	t.Helper()
	return newMockEnvTable(t, DefaultTable, opts...)
}

// newMockEnvTable returns a mock Client on table, which it sets with
// WithTable unless it is the default.
func newMockEnvTable(t *testing.T, table string, opts ...Option) *mockEnv {
	t.Helper()
	db, mock, err := sqlmock.New(sqlmock.QueryMatcherOption(sqlmock.QueryMatcherEqual))
	if err != nil {
		t.Fatalf("sqlmock.New: got %v, want nil", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	// sqlmock has one connection: so has the pool, and the first use's
	// proof holds no second one (proof_server.go).
	db.SetMaxOpenConns(1)
	// sqlmock has one connection, which a wake-up channel would pin.
	all := []Option{WithHolder(mockHolder), WithWakeups(0)}
	if table != DefaultTable {
		all = append(all, WithTable(table))
	}
	c, err := New(db, append(all, opts...)...)
	if err != nil {
		t.Fatalf("New: got %v, want nil", err)
	}
	// The proofs made at a kind's first use are proven on real servers
	// (proof_later_test.go); through the mock they are taken as made.
	for i := range c.later {
		c.mark(func(f *forms) *bool { return &f.later[i] })
	}
	return &mockEnv{t: t, db: db, mock: mock, c: c, table: table, prepared: map[string]*sqlmock.ExpectedPrepare{}}
}

// sql returns statement name of queries.sql as the Client must send it to
// the mock's server, MariaDB (or TiDB, which names its forms itself).
func (e *mockEnv) sql(name string) string {
	if name == "acquire" {
		return queries["lock_wait_mariadb"] + "\n" + withTable(queries[name], e.table)
	}
	if e.vitess {
		return withTable(strings.ReplaceAll(queries[name], tidbHint, ""), e.table)
	}
	return withTable(queries[name], e.table)
}

func withTable(stmt, table string) string {
	return strings.ReplaceAll(stmt, "`sqllock`", "`"+table+"`")
}

// expectAutocommit expects the Client's first-use check, answered with
// autocommit v, a MariaDB server and the table of schema.sql.
func (e *mockEnv) expectAutocommit(v int) {
	e.mock.ExpectQuery(firstUseSQL(e.table)).WithoutArgs().
		WillReturnRows(firstUseRows(v, "10.11.19-MariaDB", e.table))
	if v == 1 {
		expectCarries(e.mock, 5)
	}
	e.checked = v == 1
}

// expectCarries expects the carries query after the first-use check, its
// LAST_INSERT_ID() reading back read after the statement set 5: 5 on MySQL
// and MariaDB, another value through Vitess.
func expectCarries(mock sqlmock.Sqlmock, read int) {
	mock.ExpectQuery(queries["carries"]).WithArgs(1).
		WillReturnRows(sqlmock.NewRows([]string{"set", "read"}).AddRow(5, read))
}

// firstUseRows answers the first_use query for a server of the given
// version whose table is schema.sql's.
func firstUseRows(autocommit int, version, table string) *sqlmock.Rows {
	rows := sqlmock.NewRows([]string{"what", "a", "b", "c", "d", "e", "f"}).
		AddRow("server", autocommit, version, 0, nil, nil, nil).
		AddRow("table", table, "InnoDB", nil, nil, nil, nil)
	for _, col := range schemaColumns {
		typ := strings.ToLower(strings.TrimSuffix(col.def, " NOT NULL"))
		rows.AddRow("column", table, col.name, typ, "NO", nil, nil)
	}
	for i, col := range schemaKey {
		rows.AddRow("index", table, "PRIMARY", 0, i+1, col, nil)
	}
	return rows
}

// expectProof expects the proof a Client makes before its first statement
// that writes (proof.go), answered as MySQL answers it, with fence 7.
func (e *mockEnv) expectProof() {
	version := "10.11.19-MariaDB"
	if e.vitess {
		version = "8.4.6-Vitess"
	}
	e.mock.ExpectQuery("SELECT VERSION()").WithoutArgs().WillReturnRows(sqlmock.NewRows([]string{"v"}).AddRow(version))
	e.expectServerFacts(version)
	for _, s := range e.proofSteps() {
		s.expect(s.answer)
	}
	e.mock.ExpectExec(e.sql("proof_clear")).WithArgs(sqlmock.AnyArg()).WillReturnResult(sqlmock.NewResult(0, 2))
	e.expectServerProof(version, e.proofSQL("acquire"), e.proofAcquireArgs())
	e.proven = true
}

// proofSQL is statement name's text in the forms the mock's Client takes.
func (e *mockEnv) proofSQL(name string) string {
	if (e.tidb || e.vitess) && slices.Contains(tidbStmts, slices.Index(stmtNames[:], name)) {
		name = tidbPrefix + name
	}
	return e.sql(name)
}

// proofAcquireArgs is how many arguments the mock's Client's acquire takes.
func (e *mockEnv) proofAcquireArgs() int {
	if e.tidb || e.vitess {
		return tidbAcquireArgs
	}
	return 9
}

// A proofStep is one statement of the proof through the mock, with the
// answer MySQL gives; expect expects it answered with a.
type proofStep struct {
	name   string
	answer proofAnswer
	expect func(a proofAnswer)
}

type proofAnswer struct{ id, rows int64 }

// proofFence is the fence the mock's proof answers.
const proofFence = 7

// proofSteps are the proof's statements after SELECT VERSION(), each
// prepared on first use as the Client prepares it, in order.
func (e *mockEnv) proofSteps() []proofStep {
	const fence = proofFence
	sql := e.proofSQL
	acquireArgs := e.proofAcquireArgs()
	anyArgs := func(n int) []driver.Value { return slices.Repeat([]driver.Value{sqlmock.AnyArg()}, n) }
	prepared := map[string]bool{}
	exec := func(name string, n int) func(a proofAnswer) {
		return func(a proofAnswer) {
			if !prepared[name] {
				e.mock.ExpectPrepare(sql(name))
				prepared[name] = true
			}
			e.mock.ExpectExec(sql(name)).WithArgs(anyArgs(n)...).WillReturnResult(sqlmock.NewResult(a.id, a.rows))
		}
	}
	return []proofStep{
		{"acquire", proofAnswer{fence, 2}, exec("acquire", acquireArgs)},
		{"inspect", proofAnswer{fence, 0}, func(a proofAnswer) {
			e.mock.ExpectPrepare(sql("inspect"))
			e.mock.ExpectQuery(sql("inspect")).WithArgs(sqlmock.AnyArg()).
				WillReturnRows(sqlmock.NewRows([]string{"holder", "fence", "held", "us", "ahead"}).AddRow(mockHolder, a.id, 1, 60_000_000, -1))
		}},
		{"refresh", proofAnswer{0, 0}, exec("refresh", 3)},
		{"acquire", proofAnswer{0, 0}, exec("acquire", acquireArgs)},
		{"acquire", proofAnswer{fence, 1}, exec("acquire", acquireArgs)},
		{"refresh", proofAnswer{1, 1}, exec("refresh", 3)},
		{"check", proofAnswer{0, 0}, func(a proofAnswer) {
			e.mock.ExpectBegin()
			e.mock.ExpectExec(e.sql("check")).WithArgs(anyArgs(2)...).WillReturnResult(sqlmock.NewResult(a.id, a.rows))
		}},
		{"check", proofAnswer{0, 1}, func(a proofAnswer) {
			e.mock.ExpectExec(e.sql("check")).WithArgs(anyArgs(2)...).WillReturnResult(sqlmock.NewResult(a.id, a.rows))
			e.mock.ExpectRollback()
		}},
		{"release_at_least", proofAnswer{0, 0}, exec("release_at_least", 3)},
		{"release_at_least", proofAnswer{1, 1}, exec("release_at_least", 3)},
		{"release", proofAnswer{0, 0}, exec("release", 2)},
		{"release", proofAnswer{0, 1}, exec("release", 2)},
	}
}

// expectPrepare expects statement name to be prepared, after the autocommit
// check and the proof if the Client has not made them yet.
func (e *mockEnv) expectPrepare(name string) *sqlmock.ExpectedPrepare {
	if !e.checked {
		e.expectAutocommit(1)
	}
	if !e.proven && writes(slices.Index(stmtNames[:], name)) {
		e.expectProof()
	}
	p := e.mock.ExpectPrepare(e.sql(name))
	e.prepared[name] = p
	return p
}

// expectPrepareError expects statement name to fail to prepare with err.
func (e *mockEnv) expectPrepareError(name string, err error) {
	if !e.checked {
		e.expectAutocommit(1)
	}
	if !e.proven && writes(slices.Index(stmtNames[:], name)) {
		e.expectProof()
	}
	e.mock.ExpectPrepare(e.sql(name)).WillReturnError(err)
}

// A reply is the mock's answer to one execution of a statement.
type reply struct {
	id, rows int64         // insert id and affected rows, when err is nil
	err      error         // the driver's error
	delay    time.Duration // how long the statement runs before answering
}

func okReply(id, rows int64) reply { return reply{id: id, rows: rows} }
func errReply(err error) reply     { return reply{err: err} }

func repeatReply(r reply, n int) []reply {
	out := make([]reply, n)
	for i := range out {
		out[i] = r
	}
	return out
}

// expectExec expects statement name to run once per reply, each time with
// args, preparing it first if the Client has not yet.
func (e *mockEnv) expectExec(name string, args []driver.Value, replies ...reply) {
	if e.prepared[name] == nil {
		e.expectPrepare(name)
	}
	for _, r := range replies {
		ex := e.mock.ExpectExec(e.sql(name)).WithArgs(args...)
		if r.err != nil {
			ex.WillReturnError(r.err)
		} else {
			ex.WillReturnResult(sqlmock.NewResult(r.id, r.rows))
		}
		if r.delay > 0 {
			ex.WillDelayFor(r.delay)
		}
	}
}

// expectInspect expects the inspect statement for name, answered by rows.
func (e *mockEnv) expectInspect(name string, rows *sqlmock.Rows) {
	if e.prepared["inspect"] == nil {
		e.expectPrepare("inspect")
	}
	e.mock.ExpectQuery(e.sql("inspect")).WithArgs(name).WillReturnRows(rows)
}

// acquired takes a one-minute lease on name through the mock, with fence 42,
// and returns it with the matcher that saw its token.
func (e *mockEnv) acquired(name string) (*Lock, *tokenArg) {
	e.t.Helper()
	tok := &tokenArg{}
	e.expectExec("acquire", acquireArgs(name, mockHolder, 60_000_000, tok), okReply(42, 1))
	l, err := e.c.TryAcquire(e.t.Context(), name, time.Minute)
	if err != nil {
		e.t.Fatalf("TryAcquire(%q): got %v, want nil", name, err)
	}
	return l, tok
}

// done checks that every expectation was met.
func (e *mockEnv) done() {
	e.t.Helper()
	if err := e.mock.ExpectationsWereMet(); err != nil {
		e.t.Errorf("ExpectationsWereMet: got %v, want nil", err)
	}
}

// assertNothingPrepared checks that the Client sent nothing: it neither
// checked autocommit nor prepared a statement.
func (e *mockEnv) assertNothingPrepared() {
	e.t.Helper()
	if e.c.learned().checked {
		e.t.Errorf("autocommit checked: got true, want false")
	}
	for i := range e.c.stmts {
		if st := e.c.stmts[i].Load(); st != nil {
			e.t.Errorf("statement %s prepared: got %v, want nil", stmtNames[i], st)
		}
	}
}

// eachMockTable runs f with a mock Client on each of mockTables, then checks
// the expectations.
func eachMockTable(t *testing.T, f func(t *testing.T, e *mockEnv)) {
	t.Helper()
	for _, table := range mockTables {
		t.Run(table, func(t *testing.T) {
			e := newMockEnvTable(t, table)
			f(t, e)
			e.done()
		})
	}
}

// hexToken is the shape of an owner token.
var hexToken = regexp.MustCompile(`^[0-9a-f]{32}$`)

// tokenArg is a sqlmock.Argument for the owner token: 32 lowercase hex
// digits, and the same token in every position and every statement it is
// used for (one tokenArg per lease).
type tokenArg struct{ token string }

func (a *tokenArg) Match(v driver.Value) bool {
	s, ok := v.(string)
	if !ok || !hexToken.MatchString(s) {
		return false
	}
	if a.token == "" {
		a.token = s
	}
	return s == a.token
}

// acquireArgs are the 9 arguments of the acquire statement: name, token,
// holder, ttl µs, name; then token, holder, token, ttl µs.
func acquireArgs(name, holder string, ttlUS int64, tok *tokenArg) []driver.Value {
	return []driver.Value{name, tok, holder, ttlUS, name, tok, holder, tok, ttlUS}
}

func refreshArgs(ttlUS int64, name string, tok *tokenArg) []driver.Value {
	return []driver.Value{ttlUS, name, tok}
}

func releaseArgs(name string, tok *tokenArg) []driver.Value {
	return []driver.Value{name, tok}
}

// assertErrIs checks that err wraps every one of targets.
func assertErrIs(t *testing.T, err error, targets ...error) {
	t.Helper()
	for _, target := range targets {
		if !errors.Is(err, target) {
			t.Errorf("got %v, want an error wrapping %v", err, target)
		}
	}
}

// assertErrContains checks that err's text holds every one of subs.
func assertErrContains(t *testing.T, err error, subs ...string) {
	t.Helper()
	if err == nil {
		t.Errorf("got nil, want an error containing %q", subs)
		return
	}
	for _, s := range subs {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("got %v, want an error containing %q", err, s)
		}
	}
}

var (
	mysqlErr       = mysqlerr.New
	errDeadlock    = mysqlerr.Deadlock
	errLockWait    = mysqlerr.LockWait
	errGRRollback  = mysqlerr.GRRollback
	errSyntax      = mysqlerr.Syntax
	errNoSuchTable = mysqlerr.NoSuchTable
)

// transientErrors are retried with the same token: rolled back by the server
// (retried until the operation's time budget ends), or a reply lost with
// the connection (retried fault.MaxTransientAttempts times).
var transientErrors = []struct {
	name       string
	err        error
	rolledBack bool
}{
	{"deadlock", errDeadlock, true},
	{"deadlock as text only", errors.New("Error 1213 (40001): Deadlock found"), true},
	{"lock wait timeout", errLockWait, true},
	{"group replication rollback", errGRRollback, true},
	{"group replication commit conflict", errGRCommit, true},
	{"record changed", errRecordChanged, true},
	{"TiDB write conflict", errTiDBConflict, true},
	{"invalid connection", mysql.ErrInvalidConn, false},
}

var (
	errGRCommit      = mysqlerr.GRCommit
	errRecordChanged = mysqlerr.RecordChanged
	errTiDBConflict  = mysqlerr.TiDBConflict
	errReadOnly      = mysqlerr.ReadOnly
)

// manyConflicts is more rolled-back attempts than a connection error is
// retried, so that a test shows conflicts are retried for longer.
const manyConflicts = fault.MaxTransientAttempts + 6

// ---------------------------------------------------------------------------
// queries.sql and schema.sql

func TestSplitQueries_names(t *testing.T) {
	got := slices.Sorted(maps.Keys(queries))
	want := []string{"acquire", "all_acquire", "all_acquire_fence", "all_acquire_fence_first", "all_acquire_fence_write", "all_acquire_lease", "all_check", "all_fences", "all_refresh", "all_release", "all_release_at_least", "carries", "check", "first_use", "guard_applier_mysql", "inspect", "lease", "list", "lock_delay", "lock_wait_mariadb", "look", "once_done", "once_record", "once_reset", "proof_clear", "proof_engine", "proof_overflow", "refresh", "release", "release_at_least",
		"server_mariadb", "server_mysql", "server_mysql_plain", "slot_acquire", "slot_list", "slot_release",
		"tidb_acquire", "tidb_all_acquire", "tidb_all_acquire_row", "tidb_all_refresh", "tidb_all_release", "tidb_inspect", "tidb_lease", "tidb_list", "tidb_lock_delay", "tidb_once_record", "tidb_refresh", "tidb_release", "tidb_release_at_least",
		"wake_probe", "wake_release", "wake_wait"}
	if !slices.Equal(got, want) {
		t.Errorf("names in queries.sql: got %v, want %v", got, want)
	}
	for _, name := range stmtNames {
		if _, ok := queries[name]; !ok {
			t.Errorf("queries[%q]: got missing, want present", name)
		}
	}
	for _, i := range tidbStmts {
		if _, ok := queries[tidbPrefix+stmtNames[i]]; !ok {
			t.Errorf("queries[%q]: got missing, want TiDB's form of %s", tidbPrefix+stmtNames[i], stmtNames[i])
		}
	}
}

func TestSplitQueries_statements(t *testing.T) {
	// Placeholders per statement: the argument lists the Client sends.
	wantArgs := map[string]int{"acquire": 9, "refresh": 3, "release": 2, "inspect": 1, "first_use": 0, "carries": 1,
		"release_at_least": 3, "check": 2, "list": 0, "once_done": 1, "once_record": 2,
		"lease": 1, "lock_delay": 5, "tidb_lock_delay": 5, "once_reset": 1, "proof_clear": 1, "proof_engine": 1, "proof_overflow": 1,
		"server_mysql": 0, "server_mysql_plain": 0, "server_mariadb": 0, "look": 1, "wake_wait": 3, "wake_release": 1, "wake_probe": 1,
		"slot_acquire": 21, "slot_release": 3, "slot_list": 2,
		"tidb_acquire": tidbAcquireArgs, "tidb_refresh": 3, "tidb_release": 2, "tidb_inspect": 1,
		"tidb_release_at_least": 3, "tidb_list": 0, "tidb_once_record": 2, "tidb_lease": 1,
		// Sets: literal holes, which the Go side fills (acquire_all.go).
		"all_acquire": 5, "all_acquire_lease": 4, "all_acquire_fence_first": 1, "all_acquire_fence": 1,
		"all_acquire_fence_write": 1, "all_refresh": 3, "all_release": 2, "all_release_at_least": 3,
		"all_check": 2, "all_fences": 2, "tidb_all_acquire": 1, "tidb_all_acquire_row": 4, "tidb_all_refresh": 3, "tidb_all_release": 2}
	for name, stmt := range queries {
		t.Run(name, func(t *testing.T) {
			if got, want := strings.Count(stmt, "?"), wantArgs[name]; got != want {
				t.Errorf("placeholders: got %d, want %d", got, want)
			}
			if strings.Contains(stmt, ";") || strings.Contains(stmt, "--") {
				t.Errorf("got %q, want one statement without semicolon or comments", stmt)
			}
			onTable := strings.Contains(stmt, "`sqllock`")
			row := strings.HasPrefix(stmt, "(") // a row of a set's acquire
			if want := name != "first_use" && name != "carries" && !strings.HasPrefix(name, "server_") && !row && !strings.HasPrefix(name, "wake_") && !strings.HasPrefix(name, "lock_wait_") && !strings.HasPrefix(name, "guard_"); onTable != want {
				t.Errorf("names the table placeholder: got %v, want %v", onTable, want)
			}
		})
	}
}

// Every TiDB statement that writes turns TiDB's own re-run of a conflicting
// autocommit statement off for itself, so that its answer is that of the run
// that committed (queries.sql); the reads need no hint.
func TestQueries_TiDBWritesNotRerun(t *testing.T) {
	const hint = "/*+ SET_VAR(tidb_retry_limit=0) */"
	for _, i := range tidbStmts {
		name := tidbPrefix + stmtNames[i]
		stmt := queries[name]
		verb, _, _ := strings.Cut(stmt, " ")
		writes := verb == "INSERT" || verb == "UPDATE" || verb == "DELETE"
		if got := strings.HasPrefix(stmt, verb+" "+hint+" "); got != writes {
			t.Errorf("%s: starts with %s %s: got %v, want %v", name, verb, hint, got, writes)
		}
	}
}

func TestSchema(t *testing.T) {
	if !strings.HasPrefix(schema, "CREATE TABLE IF NOT EXISTS `sqllock` (") {
		t.Errorf("schema: got %q, want a CREATE TABLE IF NOT EXISTS `sqllock`", schema)
	}
	if got := strings.Count(strings.ToUpper(schema), "CREATE "); got != 1 {
		t.Errorf("CREATE statements: got %d, want 1", got)
	}
	if strings.Contains(schema, ";") || strings.Contains(schema, "--") {
		t.Errorf("schema: got %q, want one statement without semicolon or comments", schema)
	}
}

// ---------------------------------------------------------------------------
// Options and the SQL text

func TestNew_WithTable(t *testing.T) {
	db, _, err := sqlmock.New()
	if err != nil {
		t.Fatalf("sqlmock.New: got %v, want nil", err)
	}
	defer db.Close()
	c, err := New(db, WithTable("my_locks"))
	if err != nil {
		t.Fatalf("New: got %v, want nil", err)
	}
	for i, name := range stmtNames {
		want := withTable(queries[name], "my_locks")
		if c.learned().sql[i] != want {
			t.Errorf("%s: got %q, want %q", name, c.learned().sql[i], want)
		}
		if strings.Contains(c.learned().sql[i], "`sqllock`") {
			t.Errorf("%s: got %q, want no `sqllock` left", name, c.learned().sql[i])
		}
	}
}

func TestNew_badOptions(t *testing.T) {
	db, mock, err := sqlmock.New()
	if err != nil {
		t.Fatalf("sqlmock.New: got %v, want nil", err)
	}
	defer db.Close()

	if c, err := New(nil); c != nil || err == nil {
		t.Errorf("New(nil): got %v, %v, want nil and an error", c, err)
	} else {
		assertErrContains(t, err, "nil *sql.DB")
	}

	tests := []struct {
		name string
		opt  Option
		want []string
	}{
		{"empty table", WithTable(""), []string{"bad table name", `""`}},
		{"table with a dash", WithTable("a-b"), []string{"bad table name", `"a-b"`}},
		{"table with SQL", WithTable("x;drop"), []string{"bad table name", `"x;drop"`}},
		{"table of 65 chars", WithTable(strings.Repeat("t", 65)), []string{"bad table name", "1 to 64"}},
		{"quoted table", WithTable("`t`"), []string{"bad table name", "\"`t`\""}},
		{"empty holder", WithHolder(""), []string{"empty holder description"}},
		{"holder of 256 bytes", WithHolder(strings.Repeat("h", maxHolderLen+1)), []string{"holder description is 256 bytes", "longer than"}},
		{"nil RetryStrategy", WithRetry(nil), []string{"nil RetryStrategy"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := New(db, tt.opt)
			if c != nil {
				t.Errorf("Client: got %v, want nil", c)
			}
			assertErrContains(t, err, tt.want...)
		})
	}

	t.Run("limits accepted", func(t *testing.T) {
		_, err := New(db, WithTable(strings.Repeat("t", 64)), WithHolder(strings.Repeat("h", maxHolderLen)))
		if err != nil {
			t.Errorf("got %v, want nil", err)
		}
	})
	if err := mock.ExpectationsWereMet(); err != nil {
		t.Errorf("ExpectationsWereMet: got %v, want nil", err)
	}
}

func TestClient_CreateTable(t *testing.T) {
	eachMockTable(t, func(t *testing.T, e *mockEnv) {
		e.mock.ExpectExec(withTable(schema, e.table)).WithoutArgs().WillReturnResult(sqlmock.NewResult(0, 0))
		e.expectAutocommit(1) // the first-use check, made once
		e.expectProof()       // and the proof, before any lease is taken
		if err := e.c.CreateTable(t.Context()); err != nil {
			t.Errorf("CreateTable: got %v, want nil", err)
		}
		e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, &tokenArg{}), okReply(101, 2))
		if _, err := e.c.TryAcquire(t.Context(), "job", time.Second); err != nil {
			t.Errorf("TryAcquire: got %v, want nil", err)
		}
	})
}

// ---------------------------------------------------------------------------
// Statements and their arguments

func TestClient_TryAcquire_args(t *testing.T) {
	const holder = "worker 7 on host-a"
	longName := strings.Repeat("n", MaxNameLen)
	tests := []struct {
		name   string
		table  string
		opts   []Option
		holder string
		lock   string
		ttl    time.Duration
		ttlUS  int64
	}{
		{"default table", DefaultTable, nil, mockHolder, "job", 2*time.Second + 345*time.Microsecond + 678, 2_000_345},
		{"WithTable", "my_locks", nil, mockHolder, "job", 2*time.Second + 345*time.Microsecond + 678, 2_000_345},
		{"WithHolder", DefaultTable, []Option{WithHolder(holder)}, holder, "job", time.Minute, 60_000_000},
		{"shortest ttl", DefaultTable, nil, mockHolder, "job", MinTTL, 1_000},
		{"longest ttl and name", DefaultTable, nil, mockHolder, longName, MaxTTL, 3_153_600_000_000_000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newMockEnvTable(t, tt.table, tt.opts...)
			tok := &tokenArg{}
			e.expectExec("acquire", acquireArgs(tt.lock, tt.holder, tt.ttlUS, tok), okReply(42, 1))
			l, err := e.c.TryAcquire(t.Context(), tt.lock, tt.ttl)
			if err != nil {
				t.Fatalf("TryAcquire: got %v, want nil", err)
			}
			if l.Token() != tok.token || !hexToken.MatchString(l.Token()) {
				t.Errorf("Token: got %q, want %q, 32 lowercase hex digits", l.Token(), tok.token)
			}
			if l.Name() != tt.lock {
				t.Errorf("Name: got %q, want %q", l.Name(), tt.lock)
			}
			e.done()
		})
	}
}

func TestClient_TryAcquire_freshToken(t *testing.T) {
	e := newMockEnv(t)
	tok1, tok2 := &tokenArg{}, &tokenArg{}
	e.expectExec("acquire", acquireArgs("a", mockHolder, 1_000_000, tok1), okReply(101, 2))
	e.expectExec("acquire", acquireArgs("b", mockHolder, 1_000_000, tok2), okReply(102, 2))
	for _, name := range []string{"a", "b"} {
		if _, err := e.c.TryAcquire(t.Context(), name, time.Second); err != nil {
			t.Fatalf("TryAcquire(%q): got %v, want nil", name, err)
		}
	}
	if tok1.token == tok2.token {
		t.Errorf("tokens of two calls: got %q twice, want two different", tok1.token)
	}
	e.done()
}

func TestLock_Refresh_args(t *testing.T) {
	eachMockTable(t, func(t *testing.T, e *mockEnv) {
		l, tok := e.acquired("job")
		e.expectExec("refresh", refreshArgs(1_500_250, "job", tok), okReply(1, 1))
		if err := l.Refresh(t.Context(), 1500*time.Millisecond+250*time.Microsecond); err != nil {
			t.Errorf("Refresh: got %v, want nil", err)
		}
	})
}

func TestLock_Release_args(t *testing.T) {
	eachMockTable(t, func(t *testing.T, e *mockEnv) {
		l, tok := e.acquired("job")
		e.expectExec("release", releaseArgs("job", tok), okReply(0, 1))
		if err := l.Release(t.Context()); err != nil {
			t.Errorf("Release: got %v, want nil", err)
		}
	})
}

func TestClient_Inspect_args(t *testing.T) {
	eachMockTable(t, func(t *testing.T, e *mockEnv) {
		e.expectInspect("job", sqlmock.NewRows([]string{"holder", "fence", "held", "ttl", "ahead"}))
		if _, err := e.c.Inspect(t.Context(), "job"); err != nil {
			t.Errorf("Inspect: got %v, want nil", err)
		}
	})
}

// ---------------------------------------------------------------------------
// Decoding results

func TestClient_TryAcquire_result(t *testing.T) {
	tests := []struct {
		name     string
		id, rows int64
		wantErr  error  // nil: acquired with fence id, unless wantMsg
		wantMsg  string // an error that wraps no sentinel
	}{
		{"new rows", 1_700_000_000_000_000, 2, nil, ""},
		{"taken over", 1_700_000_000_000_001, 4, nil, ""},
		{"small fence", 3, 1, nil, ""},
		{"held, 0 rows", 0, 0, ErrNotAcquired, ""},
		{"held, 1 row (clientFoundRows)", 0, 1, ErrNotAcquired, ""},
		{"held, 2 rows", 0, 2, ErrNotAcquired, ""},
		{"mark 1 came through", 1, 2, nil, "fence row is missing (mark 1)"},
		{"mark 2 came through", 2, 1, nil, "fence row is missing (mark 2)"},
		{"fence 2^63", -1 << 63, 2, nil, ""},
		{"fence 2^64-1", -1, 2, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newMockEnv(t)
			tok := &tokenArg{}
			e.expectExec("acquire", acquireArgs("job", mockHolder, 10_000_000, tok), okReply(tt.id, tt.rows))
			if tt.wantMsg != "" {
				// The lease it took is given back.
				e.expectExec("release", releaseArgs("job", tok), okReply(0, 1))
			}
			before := time.Now()
			l, err := e.c.TryAcquire(t.Context(), "job", 10*time.Second)
			after := time.Now()
			switch {
			case tt.wantErr != nil || tt.wantMsg != "":
				if tt.wantErr != nil {
					assertErrIs(t, err, tt.wantErr)
				} else {
					assertErrContains(t, err, tt.wantMsg)
					if errors.Is(err, ErrNotAcquired) {
						t.Errorf("got %v, want an error not wrapping %v", err, ErrNotAcquired)
					}
				}
				if l != nil {
					t.Errorf("Lock: got %v, want nil", l)
				}
			default:
				if err != nil {
					t.Fatalf("TryAcquire: got %v, want nil", err)
				}
				if got, want := l.Fence(), uint64(tt.id); got != want {
					t.Errorf("Fence: got %v, want %v", got, want)
				}
				if v := l.ValidUntil(); v.Before(before.Add(10*time.Second)) || v.After(after.Add(10*time.Second)) {
					t.Errorf("ValidUntil: got %v, want between %v and %v", v, before.Add(10*time.Second), after.Add(10*time.Second))
				}
			}
			e.done()
		})
	}
	t.Run("no insert id", func(t *testing.T) {
		e := newMockEnv(t)
		noID := errors.New("LastInsertId is not supported")
		e.expectPrepare("acquire")
		e.mock.ExpectExec(e.sql("acquire")).WillReturnResult(sqlmock.NewErrorResult(noID))
		_, err := e.c.TryAcquire(t.Context(), "job", time.Second)
		assertErrIs(t, err, noID)
		e.done()
	})
}

func TestLock_Refresh_result(t *testing.T) {
	t.Run("extended", func(t *testing.T) {
		e := newMockEnv(t)
		l, tok := e.acquired("job")
		e.expectExec("refresh", refreshArgs(3_600_000_000, "job", tok), okReply(1, 1))
		before := time.Now()
		if err := l.Refresh(t.Context(), time.Hour); err != nil {
			t.Fatalf("Refresh: got %v, want nil", err)
		}
		after := time.Now()
		if v := l.ValidUntil(); v.Before(before.Add(time.Hour)) || v.After(after.Add(time.Hour)) {
			t.Errorf("ValidUntil: got %v, want between %v and %v", v, before.Add(time.Hour), after.Add(time.Hour))
		}
		e.done()
	})
	for _, rows := range []int64{0, 1} {
		t.Run(fmt.Sprintf("insert id 0, %d rows", rows), func(t *testing.T) {
			e := newMockEnv(t)
			l, tok := e.acquired("job")
			valid := l.ValidUntil()
			e.expectExec("refresh", refreshArgs(3_600_000_000, "job", tok), okReply(0, rows))
			assertErrIs(t, l.Refresh(t.Context(), time.Hour), ErrNotHeld)
			if got := l.ValidUntil(); !got.Equal(valid) {
				t.Errorf("ValidUntil: got %v, want %v (unchanged)", got, valid)
			}
			e.done()
		})
	}
	t.Run("after Release, no SQL", func(t *testing.T) {
		e := newMockEnv(t)
		l, tok := e.acquired("job")
		e.expectExec("release", releaseArgs("job", tok), okReply(0, 1))
		if err := l.Release(t.Context()); err != nil {
			t.Fatalf("Release: got %v, want nil", err)
		}
		assertErrIs(t, l.Refresh(t.Context(), time.Hour), ErrNotHeld)
		e.done()
	})
}

func TestLock_Release_result(t *testing.T) {
	tests := []struct {
		name    string
		rows    int64
		wantErr error
	}{
		{"deleted", 1, nil},
		{"not ours", 0, ErrNotHeld},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newMockEnv(t)
			l, tok := e.acquired("job")
			e.expectExec("release", releaseArgs("job", tok), okReply(0, tt.rows))
			if err := l.Release(t.Context()); !errors.Is(err, tt.wantErr) {
				t.Errorf("Release: got %v, want %v", err, tt.wantErr)
			}
			// The second call sends nothing: the mock expects nothing more.
			err := l.Release(t.Context())
			assertErrIs(t, err, ErrNotHeld)
			assertErrContains(t, err, "already released")
			e.done()
		})
	}
}

// A Release called while another release of the Lock is on its way sends
// nothing: it waits for that one and returns its result (the first waiter
// makes the flight's channel).
func TestLock_Release_waitsForTheOneUnderWay(t *testing.T) {
	e := newMockEnv(t)
	l, tok := e.acquired("job")
	r := okReply(0, 1)
	r.delay = 300 * time.Millisecond
	e.expectExec("release", releaseArgs("job", tok), r)
	first := make(chan error, 1)
	go func() { first <- l.Release(t.Context()) }()
	for {
		l.mu.Lock()
		underWay := l.releaseUnderWay
		l.mu.Unlock()
		if underWay {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if err := l.Release(t.Context()); err != nil {
		t.Errorf("second Release: got %v, want nil", err)
	}
	if err := <-first; err != nil {
		t.Errorf("first Release: got %v, want nil", err)
	}
	e.done() // one release sent
}

// After a Release, a KeepAlive's context ends with the cause a call on the
// released Lock returns: the same words, wrapping ErrNotHeld.
func TestLock_KeepAlive_afterReleaseCause(t *testing.T) {
	e := newMockEnv(t)
	l, tok := e.acquired("job")
	e.expectExec("release", releaseArgs("job", tok), okReply(0, 1))
	if err := l.Release(t.Context()); err != nil {
		t.Fatalf("Release: got %v, want nil", err)
	}
	cause := context.Cause(l.KeepAlive(t.Context()))
	assertErrIs(t, cause, ErrNotHeld)
	if got, want := fmt.Sprint(cause), fmt.Sprint(l.releasedErr()); got != want {
		t.Errorf("cause: got %q, want %q", got, want)
	}
	e.done()
}

func TestClient_Inspect_result(t *testing.T) {
	cols := []string{"holder", "fence", "held", "ttl", "ahead"}
	tests := []struct {
		name string
		rows *sqlmock.Rows
		want Info
	}{
		{
			"held",
			sqlmock.NewRows(cols).AddRow([]byte("worker-1"), int64(42), int64(1), int64(1_500_000), int64(-500_000)),
			Info{Name: "job", Holder: "worker-1", Fence: 42, Held: true, TTL: 1500 * time.Millisecond, Age: 500 * time.Millisecond},
		},
		{
			"expired",
			sqlmock.NewRows(cols).AddRow([]byte("worker-1"), int64(42), int64(0), int64(-2_000_000), int64(-4_000_000)),
			Info{Name: "job", Holder: "worker-1", Fence: 42},
		},
		{
			"released",
			sqlmock.NewRows(cols).AddRow(nil, int64(42), nil, nil, nil),
			Info{Name: "job", Fence: 42},
		},
		{"never taken", sqlmock.NewRows(cols), Info{Name: "job"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newMockEnv(t)
			e.expectInspect("job", tt.rows)
			got, err := e.c.Inspect(t.Context(), "job")
			if err != nil || got != tt.want {
				t.Errorf("Inspect: got %+v, %v, want %+v, nil", got, err, tt.want)
			}
			e.done()
		})
	}
}

// ---------------------------------------------------------------------------
// Retries

func TestClient_TryAcquire_retries(t *testing.T) {
	if fault.MaxTransientAttempts < 2 {
		t.Fatalf("fault.MaxTransientAttempts: got %d, want at least 2", fault.MaxTransientAttempts)
	}
	for _, tc := range transientErrors {
		if errors.Is(tc.err, errLockWait) {
			continue // the acquire reports its row held: TestClient_TryAcquire_rowLockedIsHeld
		}
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // each its own mock: "bounded" waits out a deadline
			failures := fault.MaxTransientAttempts - 1
			if tc.rolledBack {
				failures = manyConflicts
			}
			t.Run("then success, same token", func(t *testing.T) {
				e := newMockEnv(t)
				tok := &tokenArg{}
				replies := append(repeatReply(errReply(tc.err), failures), okReply(7, 1))
				e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, tok), replies...)
				l, err := e.c.TryAcquire(t.Context(), "job", time.Second)
				if err != nil {
					t.Fatalf("TryAcquire: got %v, want nil", err)
				}
				if l.Fence() != 7 || l.Token() != tok.token {
					t.Errorf("Lock: got fence %d token %q, want fence 7 token %q", l.Fence(), l.Token(), tok.token)
				}
				e.done()
			})
			t.Run("bounded", func(t *testing.T) {
				e := newMockEnv(t)
				tok := &tokenArg{}
				if tc.rolledBack {
					// Conflicts go on past the context's deadline: the
					// retries stop within it. The deadline is far enough
					// that a loaded machine answers the first attempt
					// before it (the error is then the conflict, not the
					// cancelled query); the cases wait out theirs together.
					e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, tok), repeatReply(errReply(tc.err), 10_000)...)
					ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
					defer cancel()
					_, err := e.c.TryAcquire(ctx, "job", time.Second)
					assertErrIs(t, err, tc.err)
					return
				}
				e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, tok),
					repeatReply(errReply(tc.err), fault.MaxTransientAttempts)...)
				// The cleanup of the unknown outcome.
				e.expectExec("release", releaseArgs("job", tok), okReply(0, 1))
				_, err := e.c.TryAcquire(t.Context(), "job", time.Second)
				assertErrIs(t, err, tc.err)
				if errors.Is(err, ErrNotAcquired) {
					t.Errorf("got %v, want an error not wrapping %v", err, ErrNotAcquired)
				}
				e.done()
			})
		})
	}
}

// Issue 21, point 8. An acquire whose lease row stays locked past its own
// bound (1205: a holder's Lock.Check transaction) is undone, is not sent
// again, and reports the name held.
func TestClient_TryAcquire_rowLockedIsHeld(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
	}{{"lock wait timeout", errLockWait}, {"as text only", errors.New("Error 1205 (HY000): Lock wait timeout exceeded")}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newMockEnv(t)
			e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, &tokenArg{}), errReply(tc.err))
			_, err := e.c.TryAcquire(t.Context(), "job", time.Second)
			assertErrIs(t, err, ErrNotAcquired, tc.err)
			if n := e.c.orphans.Count("job"); n != 0 {
				t.Errorf("tokens remembered: got %d, want 0", n)
			}
			e.done()
		})
	}
}

// A server that refuses to run the statement (read-only during a failover,
// no server listening) applied nothing: the operation returns at once, for
// the loops above it to pace their retries, and sends no cleanup.
func TestClient_TryAcquire_refusedNotRetried(t *testing.T) {
	dialRefused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	for _, refused := range []error{errReadOnly, dialRefused} {
		t.Run(refused.Error(), func(t *testing.T) {
			e := newMockEnv(t)
			e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, &tokenArg{}), errReply(refused))
			_, err := e.c.TryAcquire(t.Context(), "job", time.Second)
			assertErrIs(t, err, refused)
			if n := e.c.orphans.Count("job"); n != 0 {
				t.Errorf("tokens remembered: got %d, want 0", n)
			}
			e.done()
		})
	}
}

func TestClient_TryAcquire_finalErrorNotRetried(t *testing.T) {
	for _, final := range []error{errSyntax, errors.New("boom")} {
		t.Run(final.Error(), func(t *testing.T) {
			e := newMockEnv(t)
			e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, &tokenArg{}), errReply(final))
			_, err := e.c.TryAcquire(t.Context(), "job", time.Second)
			assertErrIs(t, err, final)
			e.done()
		})
	}
}

func TestLock_Refresh_retries(t *testing.T) {
	for _, tc := range transientErrors {
		t.Run(tc.name, func(t *testing.T) {
			t.Run("then success", func(t *testing.T) {
				e := newMockEnv(t)
				l, tok := e.acquired("job")
				failures := 1
				if tc.rolledBack {
					failures = manyConflicts
				}
				e.expectExec("refresh", refreshArgs(60_000_000, "job", tok), append(repeatReply(errReply(tc.err), failures), okReply(1, 1))...)
				if err := l.Refresh(t.Context(), time.Minute); err != nil {
					t.Errorf("Refresh: got %v, want nil", err)
				}
				e.done()
			})
			t.Run("bounded", func(t *testing.T) {
				e := newMockEnv(t)
				l, tok := e.acquired("job")
				ctx := t.Context()
				if tc.rolledBack {
					// Conflicts go on past the lease: the retries stop
					// when it could expire.
					l.mu.Lock()
					l.validUntil = time.Now().Add(200 * time.Millisecond)
					l.mu.Unlock()
					e.expectExec("refresh", refreshArgs(60_000_000, "job", tok), repeatReply(errReply(tc.err), 10_000)...)
				} else {
					e.expectExec("refresh", refreshArgs(60_000_000, "job", tok),
						repeatReply(errReply(tc.err), fault.MaxTransientAttempts)...)
				}
				err := l.Refresh(ctx, time.Minute)
				assertErrIs(t, err, tc.err)
				if errors.Is(err, ErrNotHeld) {
					t.Errorf("got %v, want an error not wrapping %v: the outcome is unknown", err, ErrNotHeld)
				}
				if !tc.rolledBack {
					e.done()
				}
			})
		})
	}
	t.Run("final error", func(t *testing.T) {
		e := newMockEnv(t)
		l, tok := e.acquired("job")
		e.expectExec("refresh", refreshArgs(60_000_000, "job", tok), errReply(errSyntax))
		assertErrIs(t, l.Refresh(t.Context(), time.Minute), errSyntax)
		e.done()
	})
}

func TestLock_Release_retries(t *testing.T) {
	lost := mysql.ErrInvalidConn
	tests := []struct {
		name    string
		replies []reply
		expired bool // the lease's ValidUntil has passed
		wantErr error
	}{
		{"lost, then 1 row", []reply{errReply(lost), okReply(0, 1)}, false, nil},
		{"lost, then 0 rows while valid", []reply{errReply(lost), okReply(0, 0)}, false, nil},
		{"lost, then 0 rows after expiry", []reply{errReply(lost), okReply(0, 0)}, true, ErrNotHeld},
		{"deadlock, then 1 row", []reply{errReply(errDeadlock), okReply(0, 1)}, false, nil},
		// A rolled-back attempt deleted nothing: 0 rows means not ours.
		{"deadlock, then 0 rows while valid", []reply{errReply(errDeadlock), okReply(0, 0)}, false, ErrNotHeld},
		{"lost every time", repeatReply(errReply(lost), fault.MaxTransientAttempts), false, lost},
		{"final error", []reply{errReply(errSyntax)}, false, errSyntax},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newMockEnv(t)
			l, tok := e.acquired("job")
			if tt.expired {
				l.mu.Lock()
				l.validUntil = time.Now().Add(-time.Millisecond)
				l.mu.Unlock()
			}
			e.expectExec("release", releaseArgs("job", tok), tt.replies...)
			if err := l.Release(t.Context()); !errors.Is(err, tt.wantErr) {
				t.Errorf("Release: got %v, want %v", err, tt.wantErr)
			}
			e.done()
		})
	}
	// A Release whose every attempt was lost may have deleted the row: a
	// later Release that finds nothing while the lease was valid succeeds.
	t.Run("lost every time, then a second Release finds 0 rows", func(t *testing.T) {
		e := newMockEnv(t)
		l, tok := e.acquired("job")
		e.expectExec("release", releaseArgs("job", tok), repeatReply(errReply(lost), fault.MaxTransientAttempts)...)
		e.expectExec("release", releaseArgs("job", tok), okReply(0, 0))
		assertErrIs(t, l.Release(t.Context()), lost)
		if err := l.Release(t.Context()); err != nil {
			t.Errorf("second Release: got %v, want nil", err)
		}
		e.done()
	})
	t.Run("cancelled in flight, then a second Release finds 0 rows", func(t *testing.T) {
		e := newMockEnv(t)
		l, tok := e.acquired("job")
		e.expectExec("release", releaseArgs("job", tok), reply{rows: 1, delay: time.Minute})
		e.expectExec("release", releaseArgs("job", tok), okReply(0, 0))
		// Long enough for the statement to be sent on a loaded machine; it
		// then hangs for a minute, so the context ends while it is in flight.
		ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
		defer cancel()
		if err := l.Release(ctx); err == nil {
			t.Errorf("Release: got nil, want an error")
		}
		if err := l.Release(t.Context()); err != nil {
			t.Errorf("second Release: got %v, want nil", err)
		}
		e.done()
	})
}

// ---------------------------------------------------------------------------
// A missing table

func TestClient_missingTable(t *testing.T) {
	// The hint, the table and the driver's error are all in the message.
	check := func(t *testing.T, err error) {
		t.Helper()
		assertErrContains(t, err, "CreateTable", "schema.sql", "`my_locks`")
		assertErrIs(t, err, errNoSuchTable)
		var me *mysql.MySQLError
		if !errors.As(err, &me) || me.Number != 1146 {
			t.Errorf("got %v, want an error wrapping *mysql.MySQLError 1146", err)
		}
	}
	t.Run("TryAcquire, at prepare", func(t *testing.T) {
		e := newMockEnvTable(t, "my_locks")
		e.expectPrepareError("acquire", errNoSuchTable)
		_, err := e.c.TryAcquire(t.Context(), "job", time.Second)
		check(t, err)
		e.done()
	})
	t.Run("Inspect, at prepare", func(t *testing.T) {
		e := newMockEnvTable(t, "my_locks")
		e.expectPrepareError("inspect", errNoSuchTable)
		_, err := e.c.Inspect(t.Context(), "job")
		check(t, err)
		e.done()
	})
	t.Run("Release, dropped after prepare", func(t *testing.T) {
		e := newMockEnvTable(t, "my_locks")
		l, tok := e.acquired("job")
		e.expectExec("release", releaseArgs("job", tok), errReply(errNoSuchTable))
		check(t, l.Release(t.Context()))
		e.done()
	})
	t.Run("CreateTable mends it", func(t *testing.T) {
		e := newMockEnvTable(t, "my_locks")
		e.expectPrepareError("acquire", errNoSuchTable)
		e.mock.ExpectExec(withTable(schema, "my_locks")).WillReturnResult(sqlmock.NewResult(0, 0))
		e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, &tokenArg{}), okReply(9, 1))
		_, err := e.c.TryAcquire(t.Context(), "job", time.Second)
		check(t, err)
		if err := e.c.CreateTable(t.Context()); err != nil {
			t.Fatalf("CreateTable: got %v, want nil", err)
		}
		if _, err := e.c.TryAcquire(t.Context(), "job", time.Second); err != nil {
			t.Errorf("TryAcquire after CreateTable: got %v, want nil", err)
		}
		e.done()
	})
}

// ---------------------------------------------------------------------------
// Acquire's retry loop and contexts

func TestClient_Acquire_retryStrategy(t *testing.T) {
	held, free := okReply(0, 1), okReply(7, 1)
	tests := []struct {
		name     string
		strategy RetryStrategy
		replies  []reply // one per attempt
		wantErr  error   // nil: acquired with fence 7
	}{
		{"NoRetry", NoRetry(), []reply{held}, ErrNotAcquired},
		{"LimitRetry 3", LimitRetry(LinearBackoff(time.Millisecond), 3), []reply{held, held, held}, ErrNotAcquired},
		{"acquired on the third attempt", LinearBackoff(time.Millisecond), []reply{held, held, free}, nil},
		{"server error ends Acquire", LinearBackoff(time.Millisecond), []reply{errReply(errSyntax)}, errSyntax},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newMockEnv(t, WithRetry(tt.strategy))
			// One token serves every attempt: with one name waited
			// for, each poll is the acquire (internal/wait/look.go).
			tok := &tokenArg{}
			e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, tok), tt.replies...)
			l, err := e.c.Acquire(t.Context(), "job", time.Second)
			switch {
			case tt.wantErr != nil:
				assertErrIs(t, err, tt.wantErr)
				if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
					t.Errorf("got %v, want no context error", err)
				}
			case err != nil:
				t.Errorf("Acquire: got %v, want nil", err)
			case l.Fence() != 7 || l.Token() != tok.token:
				t.Errorf("Lock: got fence %d token %q, want fence 7 token %q", l.Fence(), l.Token(), tok.token)
			}
			e.done()
		})
	}
}

func TestClient_Acquire_deadline(t *testing.T) {
	// Two quick retries, then a wait longer than the context lives.
	strategy := retryFunc(func(attempt int) (time.Duration, bool) {
		if attempt < 3 {
			return time.Millisecond, true
		}
		return time.Hour, true
	})
	e := newMockEnv(t, WithRetry(strategy))
	e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, &tokenArg{}), repeatReply(okReply(0, 1), 3)...)
	// Long enough for the three attempts on a loaded machine under -race
	// (300 ms was not); the hour-long wait is what the deadline must cut.
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	l, err := e.c.Acquire(ctx, "job", time.Second)
	if l != nil {
		t.Errorf("Lock: got %v, want nil", l)
	}
	assertErrIs(t, err, ErrNotAcquired, context.DeadlineExceeded)
	e.done()
}

func TestClient_acquire_cancelledInFlight(t *testing.T) {
	tests := []struct {
		name    string
		acquire func(c *Client, ctx context.Context) (*Lock, error)
		ctx     func(t *testing.T) (context.Context, context.CancelFunc)
		wantCtx error
	}{
		{
			"TryAcquire, deadline",
			func(c *Client, ctx context.Context) (*Lock, error) { return c.TryAcquire(ctx, "job", time.Second) },
			func(t *testing.T) (context.Context, context.CancelFunc) {
				return context.WithTimeout(t.Context(), 500*time.Millisecond)
			},
			context.DeadlineExceeded,
		},
		{
			"Acquire, cancel",
			func(c *Client, ctx context.Context) (*Lock, error) { return c.Acquire(ctx, "job", time.Second) },
			func(t *testing.T) (context.Context, context.CancelFunc) {
				ctx, cancel := context.WithCancel(t.Context())
				time.AfterFunc(500*time.Millisecond, cancel)
				return ctx, cancel
			},
			context.Canceled,
		},
	}
	// The contexts end after 500ms: long enough for the statement to be sent
	// on a loaded machine, and it then hangs for a minute, so they end while
	// it is in flight.
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newMockEnv(t)
			tok := &tokenArg{}
			e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, tok), reply{id: 42, rows: 1, delay: time.Minute})
			// The cleanup: the release statement with the same name and token.
			e.expectExec("release", releaseArgs("job", tok), okReply(0, 1))
			ctx, cancel := tt.ctx(t)
			defer cancel()
			l, err := tt.acquire(e.c, ctx)
			if l != nil {
				t.Errorf("Lock: got %v, want nil", l)
			}
			assertErrIs(t, err, ErrNotAcquired, tt.wantCtx)
			e.done()
		})
	}
	t.Run("cancelled before, no SQL", func(t *testing.T) {
		e := newMockEnv(t)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, err := e.c.TryAcquire(ctx, "job", time.Second)
		assertErrIs(t, err, ErrNotAcquired, context.Canceled)
		e.assertNothingPrepared()
		e.done()
	})
}

// ---------------------------------------------------------------------------
// Bad input sends nothing

func TestClient_badInput_noSQL(t *testing.T) {
	longName := strings.Repeat("n", MaxNameLen+1)
	names := []struct{ name, want string }{
		{"", "empty lock name"},
		{longName, "lock name is 256 bytes, longer than the 255"},
	}
	ttls := []struct {
		ttl  time.Duration
		want string
	}{
		{0, "below the minimum"},
		{-time.Second, "below the minimum"},
		{999 * time.Microsecond, "below the minimum"},
		{MaxTTL + 1, "beyond the maximum"},
	}
	type call func(ctx context.Context, e *mockEnv, name string, ttl time.Duration) error
	tryAcquire := func(ctx context.Context, e *mockEnv, name string, ttl time.Duration) error {
		_, err := e.c.TryAcquire(ctx, name, ttl)
		return err
	}
	acquire := func(ctx context.Context, e *mockEnv, name string, ttl time.Duration) error {
		_, err := e.c.Acquire(ctx, name, ttl)
		return err
	}
	inspect := func(ctx context.Context, e *mockEnv, name string, _ time.Duration) error {
		_, err := e.c.Inspect(ctx, name)
		return err
	}
	refresh := func(ctx context.Context, e *mockEnv, _ string, ttl time.Duration) error {
		l := newLock(e.c, "job", strings.Repeat("a", 32), 1, time.Hour, time.Now().Add(time.Hour))
		return l.Refresh(ctx, ttl)
	}
	nop := func(context.Context, *Lock) error { return nil }
	do := func(ctx context.Context, e *mockEnv, name string, ttl time.Duration) error {
		return e.c.Do(ctx, name, ttl, nop)
	}
	tryDo := func(ctx context.Context, e *mockEnv, name string, ttl time.Duration) error {
		return lockDo(e.c.TryAcquire(ctx, name, ttl))(ctx, nop)
	}
	type tcase struct {
		name string
		call call
		lock string
		ttl  time.Duration
		want string
	}
	var tests []tcase
	for _, op := range []struct {
		name string
		call call
	}{{"TryAcquire", tryAcquire}, {"Acquire", acquire}, {"Do", do}, {"TryDo", tryDo}} {
		for _, n := range names {
			tests = append(tests, tcase{fmt.Sprintf("%s name of %d bytes", op.name, len(n.name)), op.call, n.name, time.Second, n.want})
		}
		for _, d := range ttls {
			tests = append(tests, tcase{fmt.Sprintf("%s ttl %v", op.name, d.ttl), op.call, "job", d.ttl, d.want})
		}
		// Both wrong: the name is named, as TryAcquire checks it first.
		tests = append(tests, tcase{op.name + " empty name and ttl 0s", op.call, "", 0, "empty lock name"})
	}
	for _, n := range names {
		tests = append(tests, tcase{fmt.Sprintf("Inspect name of %d bytes", len(n.name)), inspect, n.name, 0, n.want})
	}
	for _, d := range ttls {
		tests = append(tests, tcase{fmt.Sprintf("Refresh ttl %v", d.ttl), refresh, "", d.ttl, d.want})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newMockEnv(t)
			err := tt.call(t.Context(), e, tt.lock, tt.ttl)
			assertErrContains(t, err, tt.want)
			e.assertNothingPrepared()
			e.done()
		})
	}
}

func TestClient_autocommitOff_noPrepare(t *testing.T) {
	e := newMockEnv(t)
	e.expectAutocommit(0)
	_, err := e.c.TryAcquire(t.Context(), "job", time.Second)
	assertErrContains(t, err, "autocommit off")
	e.assertNothingPrepared()
	e.done()

	// The check is made again, not remembered as passed.
	e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, &tokenArg{}), okReply(101, 2))
	if _, err := e.c.TryAcquire(t.Context(), "job", time.Second); err != nil {
		t.Errorf("TryAcquire with autocommit on: got %v, want nil", err)
	}
	e.done()
}

func TestClient_firstUseCheckFails(t *testing.T) {
	e := newMockEnv(t)
	boom := errors.New("boom")
	e.mock.ExpectQuery(firstUseSQL(e.table)).WillReturnError(boom)
	_, err := e.c.TryAcquire(t.Context(), "job", time.Second)
	assertErrContains(t, err, "check the server and table")
	assertErrIs(t, err, boom)
	e.assertNothingPrepared()
	e.done()
}

// ---------------------------------------------------------------------------
// Close

func TestClient_Close(t *testing.T) {
	t.Run("unused", func(t *testing.T) {
		e := newMockEnv(t)
		if err := e.c.Close(); err != nil {
			t.Errorf("Close: got %v, want nil", err)
		}
		e.done()
	})
	t.Run("closes statements, not the DB", func(t *testing.T) {
		e := newMockEnv(t)
		released, tok := e.acquired("a")
		e.expectExec("release", releaseArgs("a", tok), okReply(0, 1))
		if err := released.Release(t.Context()); err != nil {
			t.Fatalf("Release: got %v, want nil", err)
		}
		// Close gives back the lease it holds before closing the statements.
		held, heldTok := e.acquired("b")
		e.expectExec("release", releaseArgs("b", heldTok), okReply(0, 1))
		e.prepared["acquire"].WillBeClosed()
		e.prepared["release"].WillBeClosed()

		if err := e.c.Close(); err != nil {
			t.Errorf("Close: got %v, want nil", err)
		}
		if err := e.c.Close(); err != nil {
			t.Errorf("second Close: got %v, want nil", err)
		}
		if err := e.db.PingContext(t.Context()); err != nil {
			t.Errorf("DB Ping after Close: got %v, want nil", err)
		}

		ctx := t.Context()
		calls := map[string]func() error{
			"TryAcquire": func() error { _, err := e.c.TryAcquire(ctx, "c", time.Second); return err },
			"Acquire":    func() error { _, err := e.c.Acquire(ctx, "c", time.Second); return err },
			"Inspect":    func() error { _, err := e.c.Inspect(ctx, "c"); return err },
			"CreateTable": func() error {
				return e.c.CreateTable(ctx)
			},
			"Refresh": func() error { return held.Refresh(ctx, time.Second) },
			"Release": func() error { return held.Release(ctx) },
		}
		for _, name := range slices.Sorted(maps.Keys(calls)) {
			t.Run(name, func(t *testing.T) { assertErrIs(t, calls[name](), ErrClosed) })
		}
		e.done()
	})
}

// ---------------------------------------------------------------------------
// RetryStrategy

func TestNoRetry(t *testing.T) {
	s := NoRetry()
	for _, attempt := range []int{1, 2, 100} {
		if _, ok := s.Backoff(attempt); ok {
			t.Errorf("Backoff(%d): got ok true, want false", attempt)
		}
	}
}

func TestLinearBackoff(t *testing.T) {
	tests := []struct {
		d, want time.Duration
	}{
		{50 * time.Millisecond, 50 * time.Millisecond},
		{time.Millisecond, time.Millisecond},
		{0, time.Millisecond},
		{-time.Second, time.Millisecond},
	}
	for _, tt := range tests {
		s := LinearBackoff(tt.d)
		for _, attempt := range []int{1, 2, 100} {
			if got, ok := s.Backoff(attempt); got != tt.want || !ok {
				t.Errorf("LinearBackoff(%v).Backoff(%d): got %v, %v, want %v, true", tt.d, attempt, got, ok, tt.want)
			}
		}
	}
}

func TestExponentialBackoff(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name         string
		first, limit time.Duration
		steps        []time.Duration // the step of attempts 1, 2, ...; the last repeats
	}{
		{"doubling up to the limit", 10 * ms, 80 * ms, []time.Duration{10 * ms, 20 * ms, 40 * ms, 80 * ms, 80 * ms}},
		{"capped between doublings", 7 * ms, 20 * ms, []time.Duration{7 * ms, 14 * ms, 20 * ms}},
		{"limit below first raised to first", 10 * ms, 5 * ms, []time.Duration{10 * ms}},
		{"zero first raised to 1ms", 0, 4 * ms, []time.Duration{ms, 2 * ms, 4 * ms}},
		{"negatives raised to 1ms", -time.Second, -time.Second, []time.Duration{ms}},
		{"defaults", defaultRetryMin, defaultRetryMax, []time.Duration{8 * ms, 16 * ms, 32 * ms, 64 * ms, 128 * ms, 256 * ms}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := ExponentialBackoff(tt.first, tt.limit)
			limit := tt.steps[len(tt.steps)-1]
			for _, attempt := range []int{1, 2, 3, 4, 5, 6, 7, 10, 100, 1000} {
				step := limit
				if attempt <= len(tt.steps) {
					step = tt.steps[attempt-1]
				}
				seen := map[time.Duration]bool{}
				for range 200 {
					got, ok := s.Backoff(attempt)
					if !ok || got < step/2 || got > step {
						t.Fatalf("Backoff(%d): got %v, %v, want within [%v, %v], true", attempt, got, ok, step/2, step)
					}
					seen[got] = true
				}
				if len(seen) < 2 {
					t.Errorf("Backoff(%d): got %d distinct waits in 200, want jitter", attempt, len(seen))
				}
			}
		})
	}
}

func TestLimitRetry(t *testing.T) {
	// attempts counts the attempts Acquire would make under s.
	attempts := func(s RetryStrategy) int {
		n := 1
		for ; n < 1000; n++ {
			if _, ok := s.Backoff(n); !ok {
				break
			}
		}
		return n
	}
	for _, n := range []int{1, 2, 3, 10} {
		s := LimitRetry(LinearBackoff(5*time.Millisecond), n)
		if got := attempts(s); got != n {
			t.Errorf("LimitRetry(s, %d): got %d attempts, want %d", n, got, n)
		}
		for attempt := 1; attempt < n; attempt++ {
			if got, ok := s.Backoff(attempt); got != 5*time.Millisecond || !ok {
				t.Errorf("LimitRetry(s, %d).Backoff(%d): got %v, %v, want 5ms, true", n, attempt, got, ok)
			}
		}
	}
	if got := attempts(LimitRetry(NoRetry(), 5)); got != 1 {
		t.Errorf("LimitRetry(NoRetry(), 5): got %d attempts, want 1", got)
	}
}

// ---------------------------------------------------------------------------
// Error classification (the rest: internal/fault)

// classify adds this package's own errors to fault.Classify.
func TestClassify_ownErrors(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want fault.Outcome
	}{
		{fmt.Errorf("acquire: %w", ErrClosed), fault.Final},
		{fmt.Errorf("acquire: %w", errReadOnlyServer), fault.Refused},
		{errDeadlock, fault.RolledBack},
	} {
		if got := classify(tc.err); got != tc.want {
			t.Errorf("classify(%v): got %d, want %d", tc.err, got, tc.want)
		}
	}
}

// ---------------------------------------------------------------------------
// Tokens

func TestNewToken(t *testing.T) {
	a, err := newToken()
	if err != nil {
		t.Fatalf("newToken: got %v, want nil", err)
	}
	b, err := newToken()
	if err != nil {
		t.Fatalf("newToken: got %v, want nil", err)
	}
	for _, tok := range []string{a, b} {
		if !hexToken.MatchString(tok) {
			t.Errorf("newToken: got %q, want 32 lowercase hex digits", tok)
		}
	}
	if a == b {
		t.Errorf("two tokens: got %q twice, want two different", a)
	}
}

// ---------------------------------------------------------------------------
// Error text

// assertPrefixOnce checks that err reads "sqllock: ..." and says "sqllock:"
// once per line: a sentinel wrapped in another error or in an operation is
// not prefixed again.
func assertPrefixOnce(t *testing.T, err error) {
	t.Helper()
	if err == nil {
		t.Fatalf("got nil, want an error")
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "sqllock: ") {
		t.Errorf("got %q, want it to start with \"sqllock: \"", msg)
	}
	for _, line := range strings.Split(msg, "\n") {
		if n := strings.Count(line, "sqllock:"); n > 1 {
			t.Errorf("got %q, which says \"sqllock:\" %d times, want once", line, n)
		}
	}
}

// Every error path says "sqllock:" once per message, and still wraps what
// it wraps.
func TestErrors_prefixOnce(t *testing.T) {
	errAccess := mysqlErr(1045, "28000", "Access denied for user 'app'@'localhost' (using password: YES)")
	tests := []struct {
		name string
		run  func(t *testing.T, e *mockEnv) error
		is   []error
		want string
	}{
		{"not acquired", func(t *testing.T, e *mockEnv) error {
			e.expectExec("acquire", acquireArgs("job", mockHolder, 60_000_000, &tokenArg{}), okReply(0, 0))
			_, err := e.c.TryAcquire(t.Context(), "job", time.Minute)
			return err
		}, []error{ErrNotAcquired}, "not acquired"},
		{"acquire gave up at the deadline", func(t *testing.T, e *mockEnv) error {
			e.expectExec("acquire", acquireArgs("job", mockHolder, 60_000_000, &tokenArg{}), okReply(0, 0))
			e.c.retry = LinearBackoff(time.Hour) // the context ends first
			ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
			defer cancel()
			_, err := e.c.Acquire(ctx, "job", time.Minute)
			return err
		}, []error{ErrNotAcquired, context.DeadlineExceeded}, `acquire "job": not acquired`},
		{"refresh of a lost lease", func(t *testing.T, e *mockEnv) error {
			l, tok := e.acquired("job")
			e.expectExec("refresh", refreshArgs(60_000_000, "job", tok), okReply(0, 0))
			return l.Refresh(t.Context(), time.Minute)
		}, []error{ErrNotHeld}, "not held"},
		{"release after Close", func(t *testing.T, e *mockEnv) error {
			l, tok := e.acquired("job")
			e.expectExec("release", releaseArgs("job", tok), okReply(0, 1))
			if err := e.c.Close(); err != nil {
				t.Fatalf("Close: got %v, want nil", err)
			}
			return l.Release(t.Context())
		}, []error{ErrClosed, ErrNotHeld}, "client closed: not held"},
		{"Do that lost its lease", func(t *testing.T, e *mockEnv) error {
			tok := &tokenArg{}
			e.expectExec("acquire", acquireArgs("job", mockHolder, 60_000_000, tok), okReply(42, 1))
			e.expectExec("release", releaseArgs("job", tok), okReply(0, 0))
			return e.c.Do(t.Context(), "job", time.Minute, func(_ context.Context, _ *Lock) error { return nil })
		}, []error{ErrLockLost, ErrNotHeld}, "lock lost: not held"},
		{"Once record refused", func(t *testing.T, e *mockEnv) error {
			l, tok := e.acquired("job")
			e.expectExec("once_record", []driver.Value{"job", tok}, okReply(0, 1))
			return l.recordOnce(t.Context())
		}, []error{ErrLockLost, ErrNotHeld}, "lock lost: not held"},
		{"missing table", func(t *testing.T, e *mockEnv) error {
			e.expectPrepareError("acquire", errNoSuchTable)
			_, err := e.c.TryAcquire(t.Context(), "job", time.Minute)
			return err
		}, []error{errNoSuchTable}, "CreateTable"},
		{"wrong password", func(t *testing.T, e *mockEnv) error {
			e.mock.ExpectQuery(firstUseSQL(e.table)).WillReturnError(errAccess)
			_, err := e.c.TryAcquire(t.Context(), "job", time.Minute)
			return err
		}, []error{errAccess}, `acquire "job": connect to the server: Error 1045`},
		{"wrong password at prepare", func(t *testing.T, e *mockEnv) error {
			e.expectPrepareError("inspect", errAccess)
			_, err := e.c.Inspect(t.Context(), "job")
			return err
		}, []error{errAccess}, `inspect "job": connect to the server: Error 1045`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newMockEnv(t)
			err := tt.run(t, e)
			assertPrefixOnce(t, err)
			assertErrIs(t, err, tt.is...)
			assertErrContains(t, err, tt.want)
		})
	}
}

// A Client that cannot connect says so, in the words of the step that
// failed, with "sqllock:" once; the driver's error stays wrapped.
func TestClient_connectError(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		ctx := testCtx(t)
		for _, tc := range []struct {
			name  string
			dsn   func(*mysql.Config)
			errno int // 0: a refused dial
		}{
			{"wrong password", func(c *mysql.Config) { c.Passwd = "not-the-password" }, 1045},
			{"unknown database", func(c *mysql.Config) { c.DBName = "sqllock_no_such_db" }, 1049},
			{"nothing listening", func(c *mysql.Config) { c.Addr = "127.0.0.1:1" }, 0},
		} {
			t.Run(tc.name, func(t *testing.T) {
				if tc.errno == 1045 {
					skipOnVitess(t, e, vitessNoAuth)
				}
				c := e.client(t, e.openDBWith(t, tc.dsn), "sqllock")
				_, err := c.TryAcquire(ctx, "x", time.Second)
				assertPrefixOnce(t, err)
				if !strings.HasPrefix(err.Error(), `sqllock: acquire "x": connect to the server: `) {
					t.Errorf("got %q, want it to say that connecting failed", err)
				}
				if n, _ := fault.Errno(err); n != tc.errno {
					t.Errorf("got errno %d, want %d", n, tc.errno)
				}
			})
		}
	})
}

// The default holder names the host and process.
func TestClient_defaultHolder(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		c := e.newClient(t)
		mustAcquire(t, c, "h", time.Second)
		if got, want := inspect(t, c, "h").Holder, defaultHolder(); got != want || !strings.Contains(got, ":") {
			t.Fatalf("got holder %q, want %q (hostname:pid)", got, want)
		}
	})
}

// Close ends every keep-alive and releases every lease its Client holds.
func TestClient_Close_releasesHeld(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		a, b := e.twoClients(t)
		ctx := testCtx(t)
		x := mustAcquire(t, a, "x", time.Minute)
		mustAcquire(t, a, "y", time.Minute)
		started := make(chan struct{})
		var cause error
		done := make(chan error, 1)
		go func() {
			done <- a.Do(ctx, "z", time.Minute, func(ctx context.Context, _ *Lock) error {
				close(started)
				<-ctx.Done()
				cause = context.Cause(ctx)
				return nil
			})
		}()
		<-started
		if got, want := a.Held(), []string{"x", "y", "z"}; !slices.Equal(got, want) {
			t.Fatalf("Held: got %v, want %v", got, want)
		}
		if err := a.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		err := <-done
		wantErrIs(t, err, ErrClosed)
		wantErrIs(t, cause, ErrClosed)
		for _, n := range []string{"x", "y", "z"} {
			if got := inspect(t, b, n); got.Held {
				t.Fatalf("after Close: %q is %+v, want released", n, got)
			}
		}
		if got := a.Held(); len(got) != 0 {
			t.Fatalf("Held after Close: got %v, want none", got)
		}
		wantErrIs(t, x.Release(ctx), ErrClosed)
		_, err = a.TryAcquire(ctx, "x", time.Second)
		wantErrIs(t, err, ErrClosed)
	})
}

// An acquire that commits after Close has closed the statements gives its
// lease back, whether or not the Client ever prepared the release: the
// Client has no statement left, but the *sql.DB is open.
func TestClient_Close_racingAcquireReleasesItsLease(t *testing.T) {
	warmups := []struct {
		name string
		warm func(t *testing.T, a, b *Client)
	}{
		{"release prepared", func(t *testing.T, a, _ *Client) {
			if err := mustAcquire(t, a, "warm", time.Minute).Release(testCtx(t)); err != nil {
				t.Fatal(err)
			}
		}},
		{"release never prepared", func(t *testing.T, a, b *Client) {
			// An acquire refused prepares the acquire statement alone,
			// and leaves Close nothing to release.
			mustAcquire(t, b, "busy", time.Minute)
			_, err := a.TryAcquire(testCtx(t), "busy", time.Minute)
			wantErrIs(t, err, ErrNotAcquired)
		}},
	}
	for _, w := range warmups {
		t.Run(w.name, func(t *testing.T) {
			t.Parallel() // each waits out Close's bound on its own tables
			eachServerEnv(t, func(t *testing.T, e *testEnv) {
				table := e.newTable(t)
				a, p := e.proxiedClient(t, table)
				b := e.client(t, e.db, table)
				ctx := testCtx(t)
				w.warm(t, a, b)

				p.ResetCounts()
				p.Stall(true)
				acquired := make(chan error, 1)
				go func() {
					_, err := a.TryAcquire(ctx, "x", time.Minute)
					acquired <- err
				}()
				waitCommand(t, p, proxyComStmtExecute)
				if err := within(t, "Close", a.Close); err != nil {
					t.Fatalf("Close: %v", err)
				}
				p.Stall(false)
				err := within(t, "TryAcquire", func() error { return <-acquired })
				wantErrIs(t, err, ErrClosed)
				if got := inspect(t, b, "x"); got.Held {
					t.Fatalf("after the acquire that lost to Close: got %+v, want the name free", got)
				}
			})
		})
	}
}

// Close calls at once make one release pass; each returns after it, with its
// result.
func TestClient_Close_concurrentCallsShareOnePass(t *testing.T) {
	closeTwice := func(c *Client) (errs [2]error) {
		var wg sync.WaitGroup
		wg.Add(len(errs))
		for i := range errs {
			go func() { defer wg.Done(); errs[i] = c.Close() }()
		}
		wg.Wait()
		return errs
	}
	t.Run("every lease released", func(t *testing.T) {
		eachServerEnv(t, func(t *testing.T, e *testEnv) {
			table := e.newTable(t)
			a, p := e.proxiedClient(t, table)
			b := e.client(t, e.db, table)
			const n = 30
			for i := range n {
				mustAcquire(t, a, fmt.Sprint("n", i), time.Minute)
			}
			// Slow replies stretch the pass, so that the calls overlap.
			p.Latency(20 * time.Millisecond)
			for i, err := range closeTwice(a) {
				if err != nil {
					t.Errorf("Close %d: got %v, want nil", i, err)
				}
			}
			for i := range n {
				if got := inspect(t, b, fmt.Sprint("n", i)); got.Held {
					t.Errorf("after Close: got %+v, want released", got)
				}
			}
		})
	})
	t.Run("one result", func(t *testing.T) {
		eachServerEnv(t, func(t *testing.T, e *testEnv) {
			a, p := e.proxiedClient(t, e.newTable(t))
			mustAcquire(t, a, "x", time.Minute)
			mustAcquire(t, a, "y", time.Minute)
			// The releases cannot reach the server.
			p.Refuse(true)
			p.CutAll()
			errs := closeTwice(a)
			if errs[0] == nil || errs[0] != errs[1] {
				t.Fatalf("Close: got %v and %v, want one release error for both", errs[0], errs[1])
			}
			if err := a.Close(); err != errs[0] {
				t.Fatalf("Close after the pass: got %v, want %v", err, errs[0])
			}
		})
	})
}

// Close returns while a prepare hangs on a dead connection, and the prepare
// that completes after it leaves no statement open.
func TestClient_Close_notHeldUpByStuckPrepare(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		c, p := stalledClient(t, e)
		closeWhileAcquireStuck(t, c, p, proxyComQuery)
		for i := range c.stmts {
			if st := c.stmts[i].Load(); st != nil {
				t.Errorf("statement %s after Close: got %v, want nil", stmtNames[i], st)
			}
		}
	})
}

// Close is not held up by a call stuck on a dead connection in a statement
// Close closes either: closing a *sql.Stmt waits for its executions, so
// Close stops waiting when its few seconds are up. The acquire that commits
// after Close gives its lease back.
func TestClient_Close_notHeldUpByStuckCall(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		c, p := e.proxiedClient(t, table)
		witness := e.client(t, e.openDB(t), table)
		// Prepare the acquire, so that the stuck command is its execution.
		if err := mustAcquire(t, c, "warm", time.Minute).Release(testCtx(t)); err != nil {
			t.Fatal(err)
		}
		p.ResetCounts()
		p.Stall(true)
		t.Cleanup(func() { p.Stall(false) })
		closeWhileAcquireStuck(t, c, p, proxyComStmtExecute)
		if got := inspect(t, witness, "x"); got.Held {
			t.Fatalf("after the acquire that lost to Close: got %+v, want the name free", got)
		}
	})
}

// Close racing every kind of call, twice at once, leaves no lease behind:
// each acquire that lost to it gives its lease back, and every lease held
// is released.
func TestClient_Close_racingEveryCall(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		for round := range 20 {
			c := e.client(t, e.db, table)
			names := []string{fmt.Sprintf("%d-a", round), fmt.Sprintf("%d-b", round), fmt.Sprintf("%d-c", round)}
			var wg sync.WaitGroup
			wg.Add(6)
			for g := range 6 {
				go func() {
					defer wg.Done()
					for i := 0; ; i++ {
						err := randomCall(c, names[rand.N(len(names))], fmt.Sprintf("%d-once-%d-%d", round, g, i))
						if err != nil && !expectedDuringClose(err) {
							t.Errorf("round %d: unexpected error: %v", round, err)
						}
						if c.isClosed() {
							return
						}
					}
				}()
			}
			time.Sleep(rand.N(30 * time.Millisecond))
			var closeErrs [2]error
			wg.Add(len(closeErrs))
			for i := range closeErrs {
				go func() { defer wg.Done(); closeErrs[i] = c.Close() }()
			}
			wg.Wait()
			for _, err := range closeErrs {
				if err != nil {
					t.Errorf("round %d: Close: %v", round, err)
				}
			}
			rows, err := e.db.Query("SELECT name, owner FROM `" + table + "` WHERE kind = 'L' AND expires_at > UTC_TIMESTAMP(6)")
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var name, owner string
				if err := rows.Scan(&name, &owner); err != nil {
					t.Fatal(err)
				}
				t.Errorf("round %d: after Close, a live lease on %q under token %s", round, name, owner)
			}
			if err := rows.Close(); err != nil {
				t.Fatal(err)
			}
			// Each round reports only what it left.
			if _, err := e.db.Exec("DELETE FROM `" + table + "` WHERE kind = 'L'"); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// Issue 20, point 6. A Lock whose ValidUntil passed, though nobody took its
// name, is swept from the Client's registry as it grows; a Refresh that then
// finds the lease still its own makes it live again, and Close must release
// it.
func TestClient_Close_releasesLockRefreshedAfterSweep(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		c := e.client(t, e.db, table)
		witness := e.client(t, e.openDB(t), table)
		ctx := testCtx(t)
		l := mustAcquire(t, c, "swept", time.Minute)
		// ValidUntil is a lower bound on the client's clock: a slow reply can
		// leave it behind while the server's lease is still live. Make it so.
		l.mu.Lock()
		l.validUntil = time.Now().Add(-time.Millisecond)
		l.mu.Unlock()
		for i := range 64 { // enough Locks to make the registry sweep
			mustAcquire(t, c, fmt.Sprintf("other-%d", i), time.Minute)
		}
		if slices.Contains(c.Held(), "swept") {
			t.Fatal("the lapsed Lock was not swept: the test did not make the case")
		}
		if err := l.Refresh(ctx, time.Minute); err != nil {
			t.Fatalf("Refresh of a lapsed lease nobody took: got %v, want nil", err)
		}
		if !slices.Contains(c.Held(), "swept") {
			t.Error("Held after the Refresh: the Lock is missing")
		}
		if err := c.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if info := inspect(t, witness, "swept"); info.Held {
			t.Fatalf("after Close: %+v, want the name released", info)
		}
	})
}
