package sqllock

import (
	"context"
	"crypto/rand"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/ory/dockertest/v3"

	"github.com/sqllock/sqllock/internal/testdsn"
)

// The real-server tests run against every server in testServers: those
// SQLLOCK_TEST_DSN names (see internal/testdsn), or else MySQL 5.7 and 8.0
// started with dockertest where a Docker engine answers. Each test runs on
// each server, in a subtest named by the server. A server named in the
// variable that does not answer fails every test; with no server at all the
// tests skip, saying how to start some, unless CI is set: then they fail.
const dsnEnv = testdsn.Env

type testServer = testdsn.Server

var (
	testServers  []testServer
	noServerWhy  string
	dockerPurges []func()
)

func TestMain(m *testing.M) {
	testdsn.QuietDriver()
	findServers()
	// Several tests at once, each on every server at once.
	testdsn.AtLeastParallel(testdsn.TestsAtOnce * len(testServers))
	code := m.Run()
	for _, purge := range dockerPurges {
		purge()
	}
	os.Exit(code)
}

func findServers() {
	if os.Getenv(dsnEnv) != "" {
		testServers = testdsn.Servers()
		return
	}
	pool, err := dockertest.NewPool("")
	if err == nil {
		err = pool.Client.Ping()
	}
	if err != nil {
		noServerWhy = fmt.Sprintf("%s is not set and no Docker engine answers (%v): %s", dsnEnv, err, testdsn.StartHint)
		return
	}
	pool.MaxWait = 3 * time.Minute
	for _, tag := range []string{"5.7", "8.0"} {
		s, purge, err := startMySQL(pool, tag)
		if err != nil {
			// Listed all the same, so that every test fails on it.
			testServers = append(testServers, testServer{Label: "mysql-" + tag, Err: fmt.Errorf("mysql:%s in Docker did not start: %w", tag, err)})
			continue
		}
		dockerPurges = append(dockerPurges, purge)
		testServers = append(testServers, s)
	}
}

// startMySQL runs the official mysql image and waits until it answers.
func startMySQL(pool *dockertest.Pool, tag string) (testServer, func(), error) {
	res, err := pool.RunWithOptions(&dockertest.RunOptions{
		Repository: "mysql",
		Tag:        tag,
		Env:        []string{"MYSQL_ALLOW_EMPTY_PASSWORD=yes", "MYSQL_DATABASE=test"},
	})
	if err != nil {
		return testServer{}, nil, err
	}
	purge := func() { _ = pool.Purge(res) }
	_ = res.Expire(600) // a crashed test run must not leave it running
	dsn := fmt.Sprintf("root@tcp(%s)/test", res.GetHostPort("3306/tcp"))
	var s testServer
	err = pool.Retry(func() error {
		s = testdsn.Probe("", dsn)
		return s.Err
	})
	if err != nil {
		purge()
		return testServer{}, nil, err
	}
	return s, purge, nil
}

// isolationVariable is the session variable that sets s's isolation level:
// transaction_isolation on MySQL and on MariaDB from 11.1, whose
// tx_isolation remains as its older name.
func isolationVariable(s testServer) string {
	if s.MariaDB {
		return "tx_isolation"
	}
	return "transaction_isolation"
}

// requireServers skips the test when there is no server, or fails it in CI.
func requireServers(t testing.TB) {
	t.Helper()
	if len(testServers) == 0 {
		testdsn.NoServer(t, noServerWhy)
	}
}

// eachServer runs f as a subtest named by each server; a server that did not
// answer fails its subtest. The servers' subtests run in parallel, each
// server's one at a time: a test owns its tables on each server, so only
// the test's own state is shared between them, and f must not touch the
// enclosing test's t or variables without a lock.
func eachServer(t *testing.T, f func(t *testing.T, s testServer)) {
	t.Helper()
	onServers(t, true, f)
}

// eachServerInTurn is eachServer with the servers' subtests one after
// another, for a test that cannot run in parallel (testing.AllocsPerRun),
// with the default DSN.
func eachServerInTurn(t *testing.T, f func(t *testing.T, e *testEnv)) {
	t.Helper()
	onServers(t, false, func(t *testing.T, s testServer) {
		f(t, newEnv(t, s, variants[0]))
	})
}

func onServers(t *testing.T, parallel bool, f func(t *testing.T, s testServer)) {
	t.Helper()
	requireServers(t)
	if parallel {
		// Side by side with the other tests on the servers: one after
		// another they took over seven minutes, mostly waiting.
		testdsn.ParallelTest(t)
	}
	for _, s := range testServers {
		t.Run(s.Label, func(t *testing.T) {
			if parallel {
				t.Parallel()
			}
			if s.Err != nil {
				t.Fatal(s.Err)
			}
			if s.Fake {
				skipOnFake(t)
			}
			f(t, s)
		})
	}
}

// soleServer fails t unless SQLLOCK_TEST_DSN names one server: the test does
// something (restart it, change its globals) to the one server it is given.
func soleServer(t *testing.T, what string) {
	t.Helper()
	// Alone, too: no other test may meet what it does to the server.
	testdsn.Alone(t, what)
	requireServers(t)
	if len(testServers) != 1 {
		t.Fatalf("this test %s: set %s to that one server's DSN (scripts/testdb dsn SERVER), not to %d servers", what, dsnEnv, len(testServers))
	}
}

// A variant is a way a user's DSN may differ, which no statement may notice.
type variant struct {
	name        string
	mariadbOnly string // why the variant is MariaDB's only, if it is
	tidbOnly    string // why the variant is TiDB's only, if it is
	notTiDB     string // why TiDB cannot take the variant, if it cannot
	vitessOnly  string // why the variant is Vitess's only, if it is
	notVitess   string // why Vitess cannot take the variant, if it cannot
	apply       func(*mysql.Config)
	isolation   string // a session isolation level, set by the server's own variable
}

var variants = []variant{
	{name: "default", apply: func(*mysql.Config) {}},
	{name: "clientFoundRows", apply: func(c *mysql.Config) { c.ClientFoundRows = true }},
	{name: "interpolateParams", apply: func(c *mysql.Config) { c.InterpolateParams = true }},
	{name: "timeZone+13", apply: func(c *mysql.Config) { setParam(c, "time_zone", "'+13:00'") }},
	// The servers' default is REPEATABLE READ; a user's DSN or server may pick
	// another level, under which plain reads take no locks (READ COMMITTED)
	// or every read locks (SERIALIZABLE).
	{name: "readCommitted", apply: func(*mysql.Config) {}, isolation: "READ-COMMITTED"},
	{name: "serializable", apply: func(*mysql.Config) {}, isolation: "SERIALIZABLE",
		notTiDB: "TiDB refuses SERIALIZABLE (error 8048) unless told to skip the check, and then runs REPEATABLE READ"},
	// TiDB's explicit transactions are pessimistic by default; optimistic
	// ones find write conflicts at commit (9007). Autocommit statements run
	// optimistically in both modes.
	{name: "optimistic", tidbOnly: "tidb_txn_mode is TiDB's", apply: func(c *mysql.Config) {
		setParam(c, "tidb_txn_mode", "'optimistic'")
	}},
	{name: "simultaneousAssignment", mariadbOnly: "SIMULTANEOUS_ASSIGNMENT is a MariaDB sql_mode (10.3.5+); MySQL has none", apply: func(c *mysql.Config) {
		setParam(c, "sql_mode", "CONCAT(@@sql_mode, ',SIMULTANEOUS_ASSIGNMENT')")
	}},
	// sql_modes that change how statements parse or compute: MariaDB's
	// ORACLE alone (it changes the grammar), and the others together, as a
	// user's DSN sets them (they replace the server's default). Every
	// statement must run alike under each, or the first use must refuse it.
	// Together, not one variant each: each variant runs every test again on
	// every server, and docs/servers.md's sql_mode table gives each mode
	// alone.
	{name: "sqlModeOracle", mariadbOnly: "ORACLE is a MariaDB sql_mode (10.3+); MySQL has none", apply: func(c *mysql.Config) {
		setParam(c, "sql_mode", "'ORACLE'")
	}},
	{name: "sqlModes", notVitess: "vtgate refuses the ANSI_QUOTES in ANSI and NO_BACKSLASH_ESCAPES (1235); sqlModesVitess is the rest", apply: func(c *mysql.Config) {
		setParam(c, "sql_mode", "'ANSI,PAD_CHAR_TO_FULL_LENGTH,NO_BACKSLASH_ESCAPES,NO_UNSIGNED_SUBTRACTION'")
	}},
	{name: "sqlModesVitess", vitessOnly: "sqlModes without what vtgate refuses (1235)", apply: func(c *mysql.Config) {
		setParam(c, "sql_mode", "'PAD_CHAR_TO_FULL_LENGTH,NO_UNSIGNED_SUBTRACTION'")
	}},
	// Everything at once, with a lenient sql_mode that truncates long values
	// instead of failing, and the quoting modes that change how SQL parses.
	{name: "allAtOnce", notVitess: "vtgate refuses the ANSI_QUOTES, NO_BACKSLASH_ESCAPES and PIPES_AS_CONCAT sql_modes (1235); allAtOnceVitess is the rest", apply: func(c *mysql.Config) {
		c.ClientFoundRows = true
		c.InterpolateParams = true
		c.ParseTime = true
		setParam(c, "time_zone", "'-11:00'")
		setParam(c, "sql_mode", "'ANSI_QUOTES,NO_BACKSLASH_ESCAPES,PIPES_AS_CONCAT'")
	}},
	{name: "allAtOnceVitess", vitessOnly: "allAtOnce with the lenient sql_mode '': vtgate refuses ANSI_QUOTES, NO_BACKSLASH_ESCAPES and PIPES_AS_CONCAT (1235)", apply: func(c *mysql.Config) {
		c.ClientFoundRows = true
		c.InterpolateParams = true
		c.ParseTime = true
		setParam(c, "time_zone", "'-11:00'")
		setParam(c, "sql_mode", "''")
	}},
}

func setParam(c *mysql.Config, k, v string) {
	if c.Params == nil {
		c.Params = map[string]string{}
	}
	c.Params[k] = v
}

// testEnv is one server under one DSN variant.
type testEnv struct {
	server  testServer
	variant variant
	dsn     string
	db      *sql.DB
}

// fenceKind is the kind of the row that holds a name's fence: 'F' (a row of
// its own), or on TiDB and Vitess, where a name has one row, 'L'
// (queries.sql).
func (e *testEnv) fenceKind() string {
	if e.oneRow() {
		return "L"
	}
	return "F"
}

// oneRow reports whether the server takes the one-row forms (internal/engine/tablecheck.go).
func (e *testEnv) oneRow() bool { return e.server.TiDB || e.server.Vitess }

// eachEnv runs f as a subtest for every server and every variant.
func eachEnv(t *testing.T, f func(t *testing.T, e *testEnv)) {
	t.Helper()
	eachServer(t, func(t *testing.T, s testServer) {
		for _, v := range variants {
			t.Run(v.name, func(t *testing.T) {
				if v.mariadbOnly != "" && !s.MariaDB {
					t.Skipf("%s is %s: %s", s.Label, s.Version, v.mariadbOnly)
				}
				if v.tidbOnly != "" && !s.TiDB {
					t.Skipf("%s is %s: %s", s.Label, s.Version, v.tidbOnly)
				}
				if v.notTiDB != "" && s.TiDB {
					t.Skipf("%s is %s: %s", s.Label, s.Version, v.notTiDB)
				}
				if v.name != variants[0].name && s.Fake {
					t.Skip(fakeNoVariants)
				}
				if v.vitessOnly != "" && !s.Vitess {
					t.Skipf("%s is %s: %s", s.Label, s.Version, v.vitessOnly)
				}
				if v.notVitess != "" && s.Vitess {
					t.Skipf("%s is %s: %s", s.Label, s.Version, v.notVitess)
				}
				f(t, newEnv(t, s, v))
			})
		}
	})
}

// eachServerEnv runs f on every server with the default DSN: for tests whose
// subject does not depend on the DSN.
func eachServerEnv(t *testing.T, f func(t *testing.T, e *testEnv)) {
	t.Helper()
	eachServer(t, func(t *testing.T, s testServer) {
		f(t, newEnv(t, s, variants[0]))
	})
}

func newEnv(t testing.TB, s testServer, v variant) *testEnv {
	t.Helper()
	if s.Fake {
		e := &testEnv{server: s, variant: v, dsn: s.DSN}
		e.db = e.openDB(t)
		return e
	}
	cfg, err := mysql.ParseDSN(s.DSN)
	if err != nil {
		t.Fatalf("parse %s: %v", s.DSN, err)
	}
	v.apply(cfg)
	if v.isolation != "" {
		setParam(cfg, isolationVariable(s), "'"+v.isolation+"'")
	}
	e := &testEnv{server: s, variant: v, dsn: cfg.FormatDSN()}
	e.db = e.openDB(t)
	return e
}

// openDB opens a *sql.DB of its own on the environment's DSN, as another
// process would have; it is closed when the test ends.
func (e *testEnv) openDB(t testing.TB) *sql.DB {
	t.Helper()
	if e.server.Fake {
		db := sql.OpenDB(theFake(e.server.MariaDB).Connector())
		t.Cleanup(func() { db.Close() })
		return db
	}
	db, err := sql.Open("mysql", e.dsn)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// dsnWith returns the environment's DSN changed by f.
func (e *testEnv) dsnWith(t testing.TB, f func(*mysql.Config)) string {
	t.Helper()
	skipFakeFor(t, e, "it changes go-sql-driver/mysql's DSN")
	cfg, err := mysql.ParseDSN(e.dsn)
	if err != nil {
		t.Fatalf("parse %s: %v", e.dsn, err)
	}
	f(cfg)
	return cfg.FormatDSN()
}

// vitessLate reports whether err, from a Client's first use of a table just
// made, says that vtgate has yet to learn the table or its vindex.
func vitessLate(err error) bool {
	return strings.Contains(err.Error(), "Vitess knows no table") || strings.Contains(err.Error(), "does not have a primary vindex")
}

var nonWord = regexp.MustCompile(`[^A-Za-z0-9_]+`)

// newTable creates a fresh lock table for the test, dropped when it ends,
// and returns its name.
func (e *testEnv) newTable(t testing.TB) string {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	base := nonWord.ReplaceAllString(t.Name(), "_")
	if len(base) > 40 {
		base = base[len(base)-40:]
	}
	name := "t" + hex.EncodeToString(b[:]) + "_" + strings.Trim(base, "_")
	e.vindex(t, name)
	// vtgate learns a new table from its schema tracker, and its vindex
	// from the vschema, later when many tests create tables at once: a
	// sharded keyspace's first statement on it then finds no table, or
	// the table without its vindex (error 1173; CI's runs, tests side by
	// side). Again, with a fresh Client (a failed first use is kept), for
	// up to 30 s.
	var err error
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		var c *Client
		if c, err = New(e.db, WithTable(name)); err != nil {
			t.Fatalf("New: %v", err)
		}
		err = c.CreateTable(context.Background())
		c.Close()
		if err == nil || !e.server.Vitess || !vitessLate(err) || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatalf("CreateTable: %v", err)
	}
	t.Cleanup(func() {
		if _, err := e.db.Exec("DROP TABLE IF EXISTS `" + name + "`"); err != nil {
			t.Errorf("drop %s: %v", name, err)
		}
	})
	return name
}

// vindex gives table, in a sharded Vitess keyspace, the primary vindex on
// name that it needs before it is created (docs/servers.md), and takes it
// away when the test ends; elsewhere it does nothing.
func (e *testEnv) vindex(t testing.TB, table string) { e.vindexOn(t, table, "name") }

// vindexOn is vindex on column.
func (e *testEnv) vindexOn(t testing.TB, table, column string) {
	t.Helper()
	testdsn.Vindex(t, e.db, e.server, table, column)
}

// client returns a Client on the table, closed when the test ends.
func (e *testEnv) client(t testing.TB, db *sql.DB, table string, opts ...Option) *Client {
	t.Helper()
	c, err := New(db, append([]Option{WithTable(table)}, opts...)...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// newClient returns a Client on a fresh table of its own.
func (e *testEnv) newClient(t testing.TB, opts ...Option) *Client {
	t.Helper()
	return e.client(t, e.db, e.newTable(t), opts...)
}

// proxiedClient returns a Client on table whose every connection goes
// through a fault-injecting proxy, as a process behind a bad network would.
func (e *testEnv) proxiedClient(t *testing.T, table string, opts ...Option) (*Client, *proxy) {
	t.Helper()
	p := startProxy(t, e.serverAddr(t))
	db := sql.OpenDB(e.quietConnector(t, func(c *mysql.Config) { c.Addr = p.Addr() }))
	t.Cleanup(func() { db.Close() })
	return e.client(t, db, table, opts...), p
}

// quietConnector returns a connector to the environment's DSN, changed by
// f, whose driver does not log: cut connections make it log, and the tests
// check errors. The logger is no DSN parameter, hence the connector.
func (e *testEnv) quietConnector(t testing.TB, f func(*mysql.Config)) driver.Connector {
	t.Helper()
	skipFakeFor(t, e, "it needs go-sql-driver/mysql's own connections (a TCP proxy, a changed DSN)")
	cfg, err := mysql.ParseDSN(e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	f(cfg)
	cfg.Logger = log.New(io.Discard, "", 0)
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return connector
}

// Each DSN variant reaches the server: a session opened under it runs at the
// isolation level, time zone and sql_mode the variant names, so a variant
// never passes by testing the default twice.
func TestVariants_reachTheServer(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		ctx := testCtx(t)
		var isolation, zone, mode string
		err := e.db.QueryRowContext(ctx, "SELECT @@"+isolationVariable(e.server)+", @@time_zone, @@sql_mode").
			Scan(&isolation, &zone, &mode)
		if err != nil {
			t.Fatal(err)
		}
		want := e.variant.isolation
		if want == "" {
			want = "REPEATABLE-READ"
		}
		if isolation != want {
			t.Errorf("isolation: got %s, want %s", isolation, want)
		}
		for name, wantZone := range map[string]string{"timeZone+13": "+13:00", "allAtOnce": "-11:00"} {
			if e.variant.name == name && zone != wantZone {
				t.Errorf("time_zone: got %s, want %s", zone, wantZone)
			}
		}
		for name, wantModes := range map[string][]string{"simultaneousAssignment": {"SIMULTANEOUS_ASSIGNMENT"}, "allAtOnce": {"ANSI_QUOTES"},
			"sqlModeOracle": {"ORACLE"}, "sqlModesVitess": {"PAD_CHAR_TO_FULL_LENGTH", "NO_UNSIGNED_SUBTRACTION"},
			"sqlModes": {"ANSI_QUOTES", "PIPES_AS_CONCAT", "PAD_CHAR_TO_FULL_LENGTH", "NO_BACKSLASH_ESCAPES", "NO_UNSIGNED_SUBTRACTION"}} {
			for _, wantMode := range wantModes {
				if e.variant.name == name && !strings.Contains(mode, wantMode) {
					t.Errorf("sql_mode: got %s, want it to contain %s", mode, wantMode)
				}
			}
		}
		if e.server.TiDB {
			var txnMode string
			if err := e.db.QueryRowContext(ctx, "SELECT @@tidb_txn_mode").Scan(&txnMode); err != nil {
				t.Fatal(err)
			}
			if want := map[bool]string{true: "optimistic", false: "pessimistic"}[e.variant.name == "optimistic"]; txnMode != want {
				t.Errorf("tidb_txn_mode: got %s, want %s", txnMode, want)
			}
		}
	})
}

// ownServerEnv, when set, says the test server is the tests' own: tests may
// change its global variables and accounts (a read-only server, a full
// one). Never set it for a shared server.
const ownServerEnv = "SQLLOCK_TEST_OWN_SERVER"

// closedAddr returns a loopback address where nothing listens.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// limitedUser returns a *sql.DB for an account with the privileges sqllock
// needs on table and no administrative ones, dropped when the test ends.
func limitedUser(t *testing.T, e *testEnv, table string) *sql.DB {
	t.Helper()
	// Every host form, so that no anonymous account of a fresh install
	// matches first.
	for _, host := range []string{"'%'", "'localhost'", "'127.0.0.1'"} {
		user := "sqllock_app@" + host
		for _, q := range []string{
			"DROP USER IF EXISTS " + user,
			"CREATE USER " + user + " IDENTIFIED BY 'app'",
			"GRANT SELECT, INSERT, UPDATE, DELETE ON `" + table + "` TO " + user,
		} {
			if _, err := e.db.Exec(q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		t.Cleanup(func() { _, _ = e.db.Exec("DROP USER IF EXISTS " + user) })
	}
	return e.openDBWith(t, func(c *mysql.Config) { c.User, c.Passwd = "sqllock_app", "app" })
}

// setGlobal sets a global variable of the tests' own server, and sets it
// back to undo when the test ends.
func setGlobal(t *testing.T, e *testEnv, name, value, undo string) {
	t.Helper()
	if _, err := e.db.Exec("SET GLOBAL " + name + " = " + value); err != nil {
		t.Fatalf("SET GLOBAL %s: %v", name, err)
	}
	t.Cleanup(func() {
		if _, err := e.db.Exec("SET GLOBAL " + name + " = " + undo); err != nil {
			t.Errorf("SET GLOBAL %s back: %v", name, err)
		}
	})
}

// scanProcesslist runs q, a query of information_schema.PROCESSLIST, and
// scans its row into dest. MySQL 8.0 and later fail such a query with 3854
// ("Cannot convert string ... from utf8mb4 to utf8mb3") while any session's
// statement text holds bytes it cannot convert, as other tests' names do
// (TestClient_names_byteForByte's, cmd/sqllock's export test's) when they
// run beside it: the query is sent again until it reads, for up to 10 s.
func scanProcesslist(ctx context.Context, db *sql.DB, q string, args []any, dest ...any) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := db.QueryRowContext(ctx, q, args...).Scan(dest...)
		var me *mysql.MySQLError
		if !errors.As(err, &me) || me.Number != 3854 || time.Now().After(deadline) {
			return err
		}
		time.Sleep(10 * time.Millisecond)
	}
}
