// Package testdsn reads the servers the real-server tests of every package
// run against from SQLLOCK_TEST_DSN, and names each by what it is.
//
// SQLLOCK_TEST_DSN holds one go-sql-driver/mysql DSN, or several separated by
// commas, each but the first led by a label and '=':
//
//	root@tcp(127.0.0.1:3307)/test
//	mariadb-10.11=root@tcp(127.0.0.1:3307)/test,mysql-9.7=root@tcp(127.0.0.1:3308)/test
//
// The value is cut only at a comma directly followed by a label and '='
// (a label is a letter, then letters, digits, '.', '_' or '-'), so a comma
// inside a DSN, as in sql_mode='A,B', stays where it is. A DSN without a
// label is named from its server's VERSION(): mariadb-10.11, mysql-9.7.
//
// scripts/testdb starts private servers and prints the variable for them.
package testdsn

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/sqllock/sqllock/sqllocktest"
)

// Env is the variable the tests read.
const Env = "SQLLOCK_TEST_DSN"

// StartHint says how to start servers and set Env.
const StartHint = `to start private servers and set it, run from the repository's root: scripts/testdb up && eval "$(scripts/testdb env)" (or scripts/test, which also runs every test)`

// Server is one server named in Env.
type Server struct {
	Label   string // the label given, or one made from Version: "mariadb-10.11"
	DSN     string
	Version string // VERSION(), when the server answered
	MariaDB bool
	TiDB    bool
	// Vitess: the DSN reaches a Vitess vtgate (VERSION() on no table, which
	// vtgate answers itself, says so), whose database is a keyspace;
	// VitessShards is how many shards that keyspace has (SHOW VITESS_SHARDS).
	Vitess       bool
	VitessShards int
	Err          error // why the server did not answer; every test on it fails with it
	Fake         bool  // FakeDSN: the in-memory server of package sqllocktest
}

// FakeDSN, as a DSN in Env (fake=sqllocktest), names the in-memory server of
// package sqllocktest instead of a MySQL server: the root package's tests
// open it with its connector, and skip there the tests that need a real
// server's own behaviour (docs/testing.md lists them).
const FakeDSN = "sqllocktest"

// FakeMariaDBDSN, as a DSN in Env (fake-mariadb=sqllocktest-mariadb), names
// the in-memory server made sqllocktest.WithMariaDB, which answers as
// MariaDB 10.11.
const FakeMariaDBDSN = "sqllocktest-mariadb"

var (
	labelAt   = regexp.MustCompile(`,\s*([A-Za-z][A-Za-z0-9._-]*)=`)
	labelLead = regexp.MustCompile(`^([A-Za-z][A-Za-z0-9._-]*)=`)
)

// Split cuts a value of Env into labelled DSNs; a label is "" where none
// was given.
func Split(value string) (labels, dsns []string) {
	cuts := labelAt.FindAllStringIndex(value, -1)
	start := 0
	for _, c := range append(cuts, []int{len(value), len(value)}) {
		part := strings.TrimSpace(value[start:c[0]])
		start = c[0] + 1
		if part == "" {
			continue
		}
		label := ""
		if m := labelLead.FindStringSubmatch(part); m != nil {
			label, part = m[1], part[len(m[0]):]
		}
		labels = append(labels, label)
		dsns = append(dsns, part)
	}
	return labels, dsns
}

// Label names a server from its VERSION(): product and major.minor.
func Label(version string) string {
	product := "mysql"
	switch v := strings.ToLower(version); {
	case strings.Contains(v, "mariadb"):
		product = "mariadb"
	case strings.Contains(v, "tidb"):
		// "8.0.11-TiDB-v8.4.0": the MySQL it speaks for, then its own.
		if i := strings.Index(v, "-tidb-v"); i >= 0 {
			version = v[i+len("-tidb-v"):]
		}
		product = "tidb"
	}
	parts := strings.SplitN(version, ".", 3)
	if len(parts) < 2 {
		return product
	}
	minor := strings.TrimRightFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' })
	return product + "-" + parts[0] + "." + minor
}

// Probe connects to dsn and reads its version; a server that does not
// answer within ten seconds comes back with Err set.
func Probe(label, dsn string) Server {
	s := Server{Label: label, DSN: dsn}
	switch dsn {
	case FakeDSN:
		s.Version, s.Fake = sqllocktest.Version, true
		if s.Label == "" {
			s.Label = "fake"
		}
		return s
	case FakeMariaDBDSN:
		s.Version, s.Fake, s.MariaDB = sqllocktest.MariaDBVersion, true, true
		if s.Label == "" {
			s.Label = "fake-mariadb"
		}
		return s
	}
	if s.Label == "" {
		s.Label = "unlabelled"
		if cfg, err := mysql.ParseDSN(dsn); err == nil {
			s.Label = cfg.Addr
		}
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		s.Err = err
		return s
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&s.Version); err != nil {
		s.Err = fmt.Errorf("%s=%q does not answer: %w", Env, dsn, err)
		return s
	}
	if label == "" {
		s.Label = Label(s.Version)
	}
	s.MariaDB = strings.Contains(s.Version, "MariaDB")
	s.TiDB = strings.Contains(s.Version, "TiDB")
	s.Vitess = strings.Contains(s.Version, "Vitess")
	if s.Vitess {
		s.VitessShards, s.Err = vitessShards(ctx, db)
	}
	return s
}

// vitessShards counts the shards of the keyspace db's DSN names.
func vitessShards(ctx context.Context, db *sql.DB) (int, error) {
	var keyspace string
	if err := db.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&keyspace); err != nil {
		return 0, fmt.Errorf("vtgate's keyspace: %w", err)
	}
	rows, err := db.QueryContext(ctx, "SHOW VITESS_SHARDS")
	if err != nil {
		return 0, fmt.Errorf("vtgate's shards: %w", err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var shard string // keyspace/range
		if err := rows.Scan(&shard); err != nil {
			return 0, err
		}
		if strings.HasPrefix(shard, keyspace+"/") {
			n++
		}
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, fmt.Errorf("vtgate lists no shard of keyspace %q", keyspace)
	}
	return n, nil
}

var (
	once    sync.Once
	servers []Server
)

// Servers probes every server Env names, once per process.
func Servers() []Server {
	once.Do(func() {
		labels, dsns := Split(os.Getenv(Env))
		servers = make([]Server, len(dsns))
		var wg sync.WaitGroup
		for i := range dsns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				servers[i] = Probe(labels[i], dsns[i])
			}()
		}
		wg.Wait()
		for _, s := range servers {
			if s.Err == nil {
				fmt.Fprintf(os.Stderr, "sqllock tests: %s is %s\n", s.Label, s.Version)
			}
		}
	})
	return servers
}

// AtLeastParallel raises go test's -parallel, unless the command line set
// it, to n: with its default, GOMAXPROCS, a 2-core machine would test two of
// three servers at a time. Call it from TestMain, before m.Run.
func AtLeastParallel(n int) {
	if !flag.Parsed() {
		flag.Parse()
	}
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if f := flag.Lookup("test.parallel"); f != nil && !set {
		if cur, err := strconv.Atoi(f.Value.String()); err == nil && cur < n {
			_ = f.Value.Set(strconv.Itoa(n))
		}
	}
}

// QuietDriver discards go-sql-driver/mysql's log: the "[mysql]"
// lines it writes to stderr when a connection breaks, which the fault tests
// do on purpose, and which buried a failing run's one FAIL line (issue 43).
// Call it from TestMain, in the test process only: a command a test runs as
// a child keeps the driver's log as its users see it, and the test that
// reads the child's stderr still reads it.
func QuietDriver() { _ = mysql.SetLogger(&mysql.NopLogger{}) }

// TestsAtOnce is how many tests run at once on every server (Parallel). The
// real-server tests spend most of their time waiting (for a lease to pass,
// a server to answer, a proxy to stall): one after another, the root
// package's took over seven minutes on a 2-core machine, three at a time
// under three (docs/testing.md). Four at a time made the servers slow
// enough, beside the other packages' tests, that a statement waiting over
// a second for a row lock met the session guard's clock check (1690).
const TestsAtOnce = 3

// Parallel raises -parallel so that TestsAtOnce tests run at once on each
// server of Env, every server's subtest of each at once. Call it from
// TestMain, before m.Run.
func Parallel() {
	AtLeastParallel(TestsAtOnce * max(1, len(Servers())))
}

// Serial, set in TestMain before m.Run, keeps ParallelTest from making a
// package's tests parallel: each still runs on every server at once. For a
// package whose tests fail side by side for a cause not yet found.
var Serial bool

// parallel holds the tests ParallelTest made parallel, and those Alone
// keeps serial (with why).
var parallel sync.Map // *testing.T → string

// ParallelTest makes t parallel, once (t.Parallel panics on a second call),
// unless Alone was called for it. Each calls it for the test it is given,
// so that the tests on the servers run side by side; the tests that call
// neither run first, one at a time, as the testing package runs tests that
// are not parallel.
func ParallelTest(t *testing.T) {
	if Serial {
		return
	}
	if _, done := parallel.LoadOrStore(t, ""); !done {
		t.Parallel()
	}
}

// Alone keeps t serial: it runs before the parallel tests, with none
// beside it. For a test that measures or changes something other tests'
// work would disturb, which why names. Call it before Each.
func Alone(t *testing.T, why string) {
	if why == "" {
		panic("testdsn.Alone: say why the test must run alone")
	}
	parallel.Store(t, why)
}

// NoServer skips t, or fails it when CI is set, for want of any server.
func NoServer(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("CI is set but there is no server to test against: %s", why)
	}
	t.Skip(why)
}

// Each runs f as a subtest named by each server Env names, the servers'
// subtests in parallel, and t in parallel with the other tests on the
// servers (ParallelTest; Alone keeps it serial). A server that did not
// answer fails its subtest; with Env unset, t skips (fails in CI) and says
// how to start servers.
func Each(t *testing.T, f func(t *testing.T, s Server)) {
	t.Helper()
	all := Servers()
	if len(all) == 0 {
		NoServer(t, fmt.Sprintf("%s is not set: %s", Env, StartHint))
	}
	ParallelTest(t)
	for _, s := range all {
		t.Run(s.Label, func(t *testing.T) {
			t.Parallel()
			if s.Err != nil {
				t.Fatal(s.Err)
			}
			if s.Fake {
				t.Skip("these tests open the MySQL driver on the DSN: the fake serves only the root package's tests")
			}
			f(t, s)
		})
	}
}

// Database makes a database of t's own on s, dropped when t ends, and
// returns its DSN and a pool on it. It is for the tests of a program whose
// table names are fixed, as the examples' are: each test's tables, the lock
// table included, are then apart from every other test's.
func Database(t testing.TB, s Server) (dsn string, db *sql.DB) {
	t.Helper()
	cfg, err := mysql.ParseDSN(s.DSN)
	if err != nil {
		t.Fatal(err)
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	cfg.DBName = "ex_" + hex.EncodeToString(b[:])
	server, err := sql.Open("mysql", s.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := server.Exec("DROP DATABASE IF EXISTS `" + cfg.DBName + "`"); err != nil {
			t.Errorf("drop database %s: %v", cfg.DBName, err)
		}
		server.Close()
	})
	if _, err := server.Exec("CREATE DATABASE `" + cfg.DBName + "`"); err != nil {
		t.Fatal(err)
	}
	dsn = cfg.FormatDSN()
	if db, err = sql.Open("mysql", dsn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() }) // before the database is dropped
	return dsn, db
}

// Vindex gives table a vindex on column where s is a sharded Vitess
// keyspace, which refuses a table without one, and drops it when the test
// ends; elsewhere it does nothing. vtgate refuses a vschema change that
// raced another test's ("the session's version was stale; please try
// again"): it is sent again.
func Vindex(t testing.TB, db *sql.DB, s Server, table, column string) {
	t.Helper()
	if !s.Vitess || s.VitessShards < 2 {
		return
	}
	var keyspace string
	if err := db.QueryRow("SELECT DATABASE()").Scan(&keyspace); err != nil {
		t.Fatalf("keyspace: %v", err)
	}
	for try := 1; ; try++ {
		_, err := db.Exec("ALTER VSCHEMA ON `" + keyspace + "`.`" + table + "` ADD VINDEX xxhash(" + column + ") USING xxhash")
		if err == nil {
			break
		}
		if try == 10 || !strings.Contains(err.Error(), "please try again") {
			t.Fatalf("vindex on %s.%s: %v", keyspace, table, err)
		}
		time.Sleep(time.Duration(try) * 50 * time.Millisecond)
	}
	t.Cleanup(func() { _, _ = db.Exec("ALTER VSCHEMA DROP TABLE `" + keyspace + "`.`" + table + "`") })
}
