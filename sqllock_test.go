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
	"regexp"
	"slices"
	"strings"
	"sync"
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

// ---------------------------------------------------------------------------
// Decoding results

// ---------------------------------------------------------------------------
// Retries

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

// ---------------------------------------------------------------------------
// Bad input sends nothing

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

// ---------------------------------------------------------------------------
// Error classification (the rest: internal/fault)

// ---------------------------------------------------------------------------
// Tokens

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

// closeWhileAcquireStuck starts a TryAcquire of "x" on c, whose proxy p
// stalls, and once p has received command code, Close: Close must return,
// and the acquire too once p lets the command through, with ErrClosed.
func closeWhileAcquireStuck(t *testing.T, c *Client, p *proxy, code byte) {
	t.Helper()
	acquired := make(chan error, 1)
	go func() {
		_, err := c.TryAcquire(testCtx(t), "x", time.Minute)
		acquired <- err
	}()
	waitCommand(t, p, code)
	if err := within(t, "Close", c.Close); err != nil {
		t.Fatalf("Close: %v", err)
	}
	p.Stall(false)
	wantErrIs(t, within(t, "TryAcquire", func() error { return <-acquired }), ErrClosed)
}

// randomCall makes one call of the lease API, chosen at random, on name;
// onceName is for Once.
func randomCall(c *Client, name, onceName string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	pause := func() { time.Sleep(rand.N(3 * time.Millisecond)) }
	switch rand.N(8) {
	case 6: // a set left for Close to release (refused through Vitess)
		_, err := c.TryAcquireSet(ctx, []string{name, name + "-set"}, time.Minute)
		if errors.Is(err, errors.ErrUnsupported) {
			return nil
		}
		return err
	case 7:
		err := lockDo(c.AcquireSet(ctx, []string{name + "-set", name}, time.Minute))(ctx, func(_ context.Context, _ *Lock) error { pause(); return nil })
		if errors.Is(err, errors.ErrUnsupported) {
			return nil
		}
		return err
	case 0: // a lease left for Close to release
		_, err := c.TryAcquire(ctx, name, time.Minute)
		return err
	case 1:
		l, err := c.Acquire(ctx, name, time.Minute)
		if err != nil {
			return err
		}
		pause()
		return l.Release(ctx)
	case 2:
		l, err := c.TryAcquire(ctx, name, time.Minute)
		if err != nil {
			return err
		}
		kctx := l.KeepAlive(ctx)
		pause()
		if err := l.Refresh(ctx, time.Minute); err != nil {
			return err
		}
		err = l.Release(ctx)
		if kctx.Err() == nil {
			return errors.New("a keep-alive's context outlived Release")
		}
		return err
	case 3:
		return c.Do(ctx, name, time.Minute, func(_ context.Context, _ *Lock) error { pause(); return nil })
	case 4:
		_, err := c.Once(ctx, onceName, func(_ context.Context, _ *Lock) error { pause(); return nil })
		return err
	default:
		l, err := c.TryAcquire(ctx, name, time.Minute)
		if err != nil {
			return err
		}
		released := make(chan error, 1)
		go func() { released <- l.Release(ctx) }()
		kctx := l.KeepAlive(ctx) // racing the Release
		err = <-released
		if kctx.Err() == nil {
			return errors.New("a keep-alive's context outlived Release")
		}
		return err
	}
}

// expectedDuringClose reports whether err is one a call racing Close may
// return: the Client closed, the name held by another call, or a lease
// released by Close under it.
func expectedDuringClose(err error) bool {
	return errors.Is(err, ErrClosed) || errors.Is(err, ErrNotAcquired) || errors.Is(err, ErrNotHeld)
}
