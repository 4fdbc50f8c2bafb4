package sqllock

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock/internal/engine"
	"github.com/sqllock/sqllock/internal/fault"
	"github.com/sqllock/sqllock/internal/mysqlerr"
)

// Unit tests over go-sqlmock, for what a real server cannot be made to do on
// demand: deadlocks, lost replies, cancellation mid-statement, a missing
// table. Expected SQL always comes from the queries map (queries.sql), with
// the table placeholder substituted, so these tests follow the SQL file.

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
	proven   bool   // the proof of the statements has been expected (internal/engine/proof.go)
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
	// proof holds no second one (internal/engine/facts.go).
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
	// A frozen holder's watch would take the mock's one connection for a
	// statement no test expects, when a loaded machine makes an answer
	// take longer than frozenLook: frozen_test.go watches on real servers.
	c.eng.SetFrozenLook(time.Hour)
	// The proofs made at a kind's first use are proven on real servers
	// (firstuse_test.go); through the mock they are taken as made.
	for i := range engine.NumLater {
		c.eng.Mark(func(f *engine.Forms) *bool { return &f.Later[i] })
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

// withTable returns stmt as a Client sends it once its first use found
// the mock's database, mockDatabase: the table named in it.
func withTable(stmt, table string) string {
	return strings.ReplaceAll(strings.ReplaceAll(stmt, "`sqllock`", "`"+mockDatabase+"`.`"+table+"`"), "DATABASE()", "'"+mockDatabase+"'")
}

// mockDatabase is the database the mock's server answers the first use.
const mockDatabase = "test"

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

// expectKeyspace expects what the first use asks vtgate after its check:
// DATABASE() in a query of no table, which vtgate answers with the
// keyspace (internal/engine/tablecheck.go).
func expectKeyspace(mock sqlmock.Sqlmock) {
	mock.ExpectQuery("SELECT DATABASE()").WithoutArgs().WillReturnRows(sqlmock.NewRows([]string{"db"}).AddRow(mockDatabase))
}

// firstUseRows answers the first_use query for a server of the given
// version whose table is schema.sql's.
func firstUseRows(autocommit int, version, table string) *sqlmock.Rows {
	rows := sqlmock.NewRows([]string{"what", "a", "b", "c", "d", "e", "f"}).
		AddRow("server", autocommit, version, 0, mockDatabase, nil, nil).
		AddRow("table", table, "InnoDB", nil, nil, nil, nil)
	for _, col := range engine.SchemaColumns(MaxNameLen, maxHolderLen) {
		typ := strings.ToLower(strings.TrimSuffix(col.Def, " NOT NULL"))
		rows.AddRow("column", table, col.Name, typ, "NO", nil, nil)
	}
	for i, col := range engine.SchemaKey {
		rows.AddRow("index", table, "PRIMARY", 0, i+1, col, nil)
	}
	return rows
}

// expectProof expects the proof a Client makes before its first statement
// that writes (internal/engine/proof.go), answered as MySQL answers it, with fence 7.
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
		return engine.OneRowAcquireArgs
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
				WillReturnRows(sqlmock.NewRows([]string{"holder", "fence", "held", "us", "ahead", "min_hold"}).AddRow(mockHolder, a.id, 1, 60_000_000, -1, 0))
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
	if !e.proven && engine.Writes(slices.Index(stmtNames[:], name)) {
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
	if !e.proven && engine.Writes(slices.Index(stmtNames[:], name)) {
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
	if e.c.eng.Forms().Checked {
		e.t.Errorf("autocommit checked: got true, want false")
	}
	for i := range numStmts {
		if st := e.c.eng.Prepared(i); st != nil {
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
type tokenArg struct {
	token string
	// sent is set once a statement with the token reached the mock, where
	// a delayed reply keeps it in flight.
	sent atomic.Bool
}

func (a *tokenArg) Match(v driver.Value) bool {
	s, ok := v.(string)
	if !ok || !hexToken.MatchString(s) {
		return false
	}
	if a.token == "" {
		a.token = s
		a.sent.Store(true)
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

// expectQuery expects query name to run once with args, answered by rows,
// preparing it first if the Client has not yet.
func (e *mockEnv) expectQuery(name string, args []driver.Value, rows *sqlmock.Rows) {
	if e.prepared[name] == nil {
		e.expectPrepare(name)
	}
	e.mock.ExpectQuery(e.sql(name)).WithArgs(args...).WillReturnRows(rows)
}

func noop(context.Context, *Lock) error { return nil }

// expectServerProof expects the proof of the server (internal/engine/facts.go) on
// the mock's one connection, answered as MariaDB answers it: its facts,
// then the takeover of an expired lease with fence 8, the row it wrote, and
// error 1690 on the overflow.
func (e *mockEnv) expectServerProof(version, acquire string, acquireArgs int) {
	anyArgs := slices.Repeat([]driver.Value{sqlmock.AnyArg()}, acquireArgs)
	// Each statement prepared, as the Client sends it. The owner's lease
	// deleted, if it held one (neither its acquire nor its refresh moves
	// its expiry earlier), then taken a second into the past.
	e.mock.ExpectPrepare(e.proofSQL("release")).ExpectExec().WithArgs(sqlmock.AnyArg(), sqlmock.AnyArg()).
		WillReturnResult(sqlmock.NewResult(0, 0))
	e.mock.ExpectPrepare(acquire).ExpectExec().WithArgs(anyArgs...).WillReturnResult(sqlmock.NewResult(7, 1))
	// The row read back has the taker's owner token, seen as it is sent.
	row := sqlmock.NewRows([]string{"owner", "length", "one"})
	takeover := slices.Clone(anyArgs)
	seen := false
	takeover[1] = argFunc(func(v driver.Value) bool {
		if !seen {
			seen = true
			row.AddRow(v, engine.ProofEngineTTL.Microseconds(), 1)
		}
		return true
	})
	e.mock.ExpectPrepare(acquire).ExpectExec().WithArgs(takeover...).WillReturnResult(sqlmock.NewResult(8, 2))
	e.mock.ExpectPrepare(e.sql("proof_engine")).ExpectQuery().WithArgs(sqlmock.AnyArg()).WillReturnRows(row)
	e.mock.ExpectPrepare(e.sql("proof_overflow")).ExpectExec().WithArgs(sqlmock.AnyArg()).
		WillReturnError(errors.New("Error 1690 (22003): BIGINT UNSIGNED value is out of range in '`fence` + 1 + 18446744073709551615'"))
	e.mock.ExpectExec(e.sql("proof_clear")).WithArgs(sqlmock.AnyArg()).WillReturnResult(sqlmock.NewResult(0, 2))
}

// expectServerFacts expects the query of the server's facts (internal/engine/facts.go),
// made before the proof's first write, answered as a writable server.
func (e *mockEnv) expectServerFacts(version string) {
	if q := engine.FactsQuery(queries, version); q != "" {
		e.mock.ExpectQuery(q).WithoutArgs().
			WillReturnRows(sqlmock.NewRows([]string{"ro", "sro", "id", "cluster"}).AddRow(0, 0, "1 mock 3306 /data/", ""))
	}
}

// wakeupConns lifts the mock's one-connection pool for a test of the
// wake-up channels, whose channel holds a connection of its own while the
// acquire sends on another, and takes the proof as made: with a second
// connection the proof would prove the row lock between two connections,
// which a mock cannot show.
func (e *mockEnv) wakeupConns() {
	e.db.SetMaxOpenConns(0)
	e.c.markProven()
	e.proven = true
}
