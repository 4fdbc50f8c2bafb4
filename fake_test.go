package sqllock

import (
	"context"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/sqllock/sqllock/internal/sqltext"
	"github.com/sqllock/sqllock/sqllocktest"
)

// The in-memory server of package sqllocktest runs as one more server when
// SQLLOCK_TEST_DSN names it (fake=sqllocktest): every real-server test runs
// on it too, but those that need a real server's own behaviour, which skip
// there with the reason below (docs/testing.md lists them). So where the
// fake and MySQL differ, a test fails on one of them.

var (
	fakeOnce sync.Once
	fakeSrv  *sqllocktest.Server
)

// theFake is the one fake server of the test process: every test's tables
// are its own, as on a real server.
func theFake() *sqllocktest.Server {
	fakeOnce.Do(func() {
		var err error
		if fakeSrv, err = sqllocktest.NewServer(); err != nil {
			panic(err)
		}
	})
	return fakeSrv
}

const fakeNoVariants = "the fake has no DSN: the variants are go-sql-driver/mysql's and the real servers' session settings, which the real servers test"

// fakeSkips are the real-server tests that need what only a real server has,
// by top-level test name (a name ending in * covers the names it begins).
// Tests that need go-sql-driver/mysql's own connections, a changed DSN or
// the server's address skip by the helper they call (skipFakeFor); the DSN
// variants skip in eachEnv (fakeNoVariants). Keep docs/testing.md's list in
// step with these.
var fakeSkips = map[string]string{
	"TestClassify_realServerErrors":                        "it provokes the server's own errors: KILL, wait_timeout, MAX_EXECUTION_TIME, users without privileges",
	"TestFaults_killConnectionBetween":                     "it finds a connection in the processlist and KILLs it",
	"TestFaults_killConnectionDuring":                      "it finds a connection in the processlist and KILLs it",
	"TestWakeups_waiterKilledMidWait":                      "it finds a waiting session in the processlist and KILLs it",
	"TestMutualExclusion_stress":                           "each holder counts in a table of its own (CREATE TABLE, SELECT, UPDATE)",
	"TestVariants_reachTheServer":                          "it reads the session's variables (@@time_zone, @@sql_mode, the isolation level)",
	"TestQueries_statementBinlogSafe":                      "it reads the binary log's settings and SHOW WARNINGS",
	"TestSlotQueries_statementBinlogSafe":                  "it reads the binary log's settings and SHOW WARNINGS",
	"TestClient_Close_racingEveryCall":                     "it reads and deletes lease rows with a SELECT and a DELETE of its own",
	"TestClient_TryAcquire_cutWhileWaiting_nameNotBlocked": "it locks the lease row with a SELECT ... FOR UPDATE of its own, through the TCP proxy",
	"TestClient_firstUse_provesStatements":                 "it counts the proof's rows with a SELECT ... LIKE of its own",
	"TestClient_laterProofs_atFirstUseOnce":                "it counts the proof's rows with a SELECT ... LIKE of its own",
	"TestClient_badTable":                                  "it creates tables that differ from schema.sql; the fake creates only schema.sql's",
	"TestClient_warnsOfClockAhead":                         "it moves a lease's acquired_at into the future with an UPDATE of its own",
	"TestProxy_*":                                          "it tests the fault-injecting TCP proxy, which speaks MySQL's protocol to a real server",
}

// skipOnFake skips t, a subtest on the fake, if its test is in fakeSkips.
func skipOnFake(t *testing.T) {
	t.Helper()
	top, _, _ := strings.Cut(t.Name(), "/")
	for name, why := range fakeSkips {
		if name == top || strings.HasSuffix(name, "*") && strings.HasPrefix(top, strings.TrimSuffix(name, "*")) {
			t.Skip("needs a real server: " + why)
		}
	}
}

// skipFakeFor skips t on the fake because of what it needs.
func skipFakeFor(t testing.TB, e *testEnv, why string) {
	t.Helper()
	if e.server.Fake {
		t.Skip("needs a real server: " + why)
	}
}

// The fake's copies of queries.sql and schema.sql must hold the library's
// statements, word for word: a statement changed in one and not in the
// other fails here, so that the fake never runs a statement other than the
// one the library sends.
func TestFake_statementsAsTheLibrarys(t *testing.T) {
	for _, f := range []struct{ copy, original string }{
		{"sqllocktest/queries.sql", queriesSQL},
		{"sqllocktest/schema.sql", "-- name: schema\n" + schemaSQL},
	} {
		b, err := os.ReadFile(f.copy)
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		if strings.HasSuffix(f.copy, "schema.sql") {
			text = "-- name: schema\n" + text
		}
		got, err := splitQueries(text)
		if err != nil {
			t.Fatalf("%s: %v", f.copy, err)
		}
		want := sqltext.MustSplit(f.original)
		for _, name := range slices.Sorted(maps.Keys(want)) {
			if strings.Join(strings.Fields(got[name]), " ") != strings.Join(strings.Fields(want[name]), " ") {
				t.Errorf("%s: statement %q differs from the library's: copy the file there and make the fake (sqllocktest/handlers.go) run it as a server does", f.copy, name)
			}
		}
		for name := range got {
			if _, ok := want[name]; !ok {
				t.Errorf("%s: statement %q is not the library's any more: copy the file there", f.copy, name)
			}
		}
	}
}

// Every statement a Client sends, as it sends it, is one the fake runs:
// prepared with a table's name in place, or as text with its literals.
func TestFake_runsEveryStatement(t *testing.T) {
	srv, err := sqllocktest.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if err := srv.CreateTable("t_fake"); err != nil {
		t.Fatal(err)
	}
	db := srv.DB()
	defer db.Close()
	c, err := New(db, WithTable("t_fake"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	texts := map[string]string{
		"first_use": firstUseSQL("t_fake"),
		"schema":    c.substitute(schema),
	}
	for i, text := range c.learned().sql {
		texts[stmtNames[i]] = text
	}
	for _, name := range []string{"proof_clear", "slot_release", "slot_list"} {
		texts[name] = c.substitute(queries[name])
	}
	for name, text := range texts {
		st, err := db.PrepareContext(ctx, text)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		st.Close()
	}
	lit := hexLiteral("job")
	wake := func(name string) string { return strings.ReplaceAll(queries[name], "'sqllock'", "'t_fake'") }
	for name, text := range map[string]string{
		"wake_wait":    bind(wake("wake_wait"), lit, lit, "0"),
		"wake_release": bind(wake("wake_release"), lit),
		"wake_probe":   bind(wake("wake_probe"), lit),
	} {
		rows, err := db.QueryContext(ctx, text)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		rows.Close()
	}
	// MariaDB's and TiDB's forms are refused: the fake says it is MySQL.
	for _, name := range tidbStmts {
		if _, err := db.PrepareContext(ctx, c.substitute(queries[tidbPrefix+stmtNames[name]])); err == nil || !strings.Contains(err.Error(), "TiDB") {
			t.Errorf("TiDB's %s: got %v, want it refused as TiDB's", stmtNames[name], err)
		}
	}
}

// docs/testing-your-code.md shows examples/report's files as they are, so
// that the example users read is one `go test` runs.
func TestDocs_testingYourCode_showsExamplesReport(t *testing.T) {
	text, err := os.ReadFile("docs/testing-your-code.md")
	if err != nil {
		t.Fatal(err)
	}
	_, blocks := splitMarkdown(string(text))
	shown := map[string]bool{}
	for _, b := range blocks {
		shown[b.body] = true
	}
	for _, f := range []string{"examples/report/report.go", "examples/report/report_test.go"} {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !shown[string(src)] {
			t.Errorf("docs/testing-your-code.md does not show %s as it is: copy the file into its go block", f)
		}
	}
}
