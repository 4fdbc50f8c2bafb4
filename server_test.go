package sqllock

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/ory/dockertest/v3"
)

// The real-server tests run against every server in testServers: the one
// SQLLOCK_TEST_DSN names, or else MySQL 5.7 and 8.0 started with dockertest
// where a Docker engine answers. With neither they skip, unless CI is set:
// then a missing server is a failure.
const dsnEnv = "SQLLOCK_TEST_DSN"

type testServer struct {
	label   string // "env", "mysql:5.7", ...
	dsn     string
	mariadb bool
}

var (
	testServers  []testServer
	noServerWhy  string
	dockerPurges []func()
)

func TestMain(m *testing.M) {
	findServers()
	code := m.Run()
	for _, purge := range dockerPurges {
		purge()
	}
	os.Exit(code)
}

func findServers() {
	if dsn := os.Getenv(dsnEnv); dsn != "" {
		s, err := probeServer("env", dsn)
		if err != nil {
			noServerWhy = fmt.Sprintf("%s=%q does not answer: %v", dsnEnv, dsn, err)
			return
		}
		testServers = append(testServers, s)
		return
	}
	pool, err := dockertest.NewPool("")
	if err == nil {
		err = pool.Client.Ping()
	}
	if err != nil {
		noServerWhy = fmt.Sprintf("set %s (for example root@tcp(127.0.0.1:3306)/test) to run the real-server tests; no Docker engine answers either (%v)", dsnEnv, err)
		return
	}
	pool.MaxWait = 3 * time.Minute
	for _, tag := range []string{"5.7", "8.0"} {
		s, purge, err := startMySQL(pool, tag)
		if err != nil {
			log.Printf("sqllock tests: mysql:%s in Docker: %v", tag, err)
			noServerWhy = fmt.Sprintf("mysql:%s in Docker did not start: %v", tag, err)
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
		var err error
		s, err = probeServer("mysql:"+tag, dsn)
		return err
	})
	if err != nil {
		purge()
		return testServer{}, nil, err
	}
	return s, purge, nil
}

func probeServer(label, dsn string) (testServer, error) {
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return testServer{}, err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var version string
	if err := db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&version); err != nil {
		return testServer{}, err
	}
	log.Printf("sqllock tests: %s is %s", label, version)
	return testServer{label: label, dsn: dsn, mariadb: strings.Contains(version, "MariaDB")}, nil
}

// requireServers skips the test when there is no server, or fails it in CI.
func requireServers(t testing.TB) {
	t.Helper()
	if len(testServers) > 0 {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("CI is set but there is no server to test against: %s", noServerWhy)
	}
	t.Skip(noServerWhy)
}

// A variant is a way a user's DSN may differ, which no statement may notice.
type variant struct {
	name        string
	mariadbOnly bool
	apply       func(*mysql.Config)
}

var variants = []variant{
	{name: "default", apply: func(*mysql.Config) {}},
	{name: "clientFoundRows", apply: func(c *mysql.Config) { c.ClientFoundRows = true }},
	{name: "interpolateParams", apply: func(c *mysql.Config) { c.InterpolateParams = true }},
	{name: "timeZone+13", apply: func(c *mysql.Config) { setParam(c, "time_zone", "'+13:00'") }},
	{name: "simultaneousAssignment", mariadbOnly: true, apply: func(c *mysql.Config) {
		setParam(c, "sql_mode", "CONCAT(@@sql_mode, ',SIMULTANEOUS_ASSIGNMENT')")
	}},
	// Everything at once, with a lenient sql_mode that truncates long values
	// instead of failing, and the quoting modes that change how SQL parses.
	{name: "allAtOnce", apply: func(c *mysql.Config) {
		c.ClientFoundRows = true
		c.InterpolateParams = true
		c.ParseTime = true
		setParam(c, "time_zone", "'-11:00'")
		setParam(c, "sql_mode", "'ANSI_QUOTES,NO_BACKSLASH_ESCAPES,PIPES_AS_CONCAT'")
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

// eachEnv runs f as a subtest for every server and every variant.
func eachEnv(t *testing.T, f func(t *testing.T, e *testEnv)) {
	t.Helper()
	requireServers(t)
	for _, s := range testServers {
		for _, v := range variants {
			if v.mariadbOnly && !s.mariadb {
				continue
			}
			t.Run(s.label+"/"+v.name, func(t *testing.T) {
				f(t, newEnv(t, s, v))
			})
		}
	}
}

// firstEnv runs f once, on the first server with the default DSN: for tests
// whose subject does not depend on the DSN.
func firstEnv(t *testing.T, f func(t *testing.T, e *testEnv)) {
	t.Helper()
	requireServers(t)
	f(t, newEnv(t, testServers[0], variants[0]))
}

func newEnv(t testing.TB, s testServer, v variant) *testEnv {
	t.Helper()
	cfg, err := mysql.ParseDSN(s.dsn)
	if err != nil {
		t.Fatalf("parse %s: %v", s.dsn, err)
	}
	v.apply(cfg)
	e := &testEnv{server: s, variant: v, dsn: cfg.FormatDSN()}
	e.db = e.openDB(t)
	return e
}

// openDB opens a *sql.DB of its own on the environment's DSN, as another
// process would have; it is closed when the test ends.
func (e *testEnv) openDB(t testing.TB) *sql.DB {
	t.Helper()
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
	cfg, err := mysql.ParseDSN(e.dsn)
	if err != nil {
		t.Fatalf("parse %s: %v", e.dsn, err)
	}
	f(cfg)
	return cfg.FormatDSN()
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
	c, err := New(e.db, WithTable(name))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := c.CreateTable(context.Background()); err != nil {
		t.Fatalf("CreateTable: %v", err)
	}
	t.Cleanup(func() {
		if _, err := e.db.Exec("DROP TABLE IF EXISTS `" + name + "`"); err != nil {
			t.Errorf("drop %s: %v", name, err)
		}
	})
	return name
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

// ctx returns a context that ends with the test, at most a minute on.
func testCtx(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// proxiedClient returns a Client on table whose every connection goes
// through a fault-injecting proxy, as a process behind a bad network would.
func (e *testEnv) proxiedClient(t *testing.T, table string, opts ...Option) (*Client, *proxy) {
	t.Helper()
	p := startProxy(t, e.serverAddr(t))
	cfg, err := mysql.ParseDSN(e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Addr = p.Addr()
	// Cut connections make the driver log; the tests check errors. The
	// logger is no DSN parameter, hence the connector.
	cfg.Logger = log.New(io.Discard, "", 0)
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(connector)
	t.Cleanup(func() { db.Close() })
	return e.client(t, db, table, opts...), p
}

// waitFor polls cond every few milliseconds until it holds, failing the test
// after limit.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("still waiting after %v for %s", limit, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
