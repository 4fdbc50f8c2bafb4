package sqllock

import (
	"strings"
	"sync"
	"testing"

	"github.com/sqllock/sqllock/sqllocktest"
)

// The in-memory server of package sqllocktest runs as one more server when
// SQLLOCK_TEST_DSN names it (fake=sqllocktest): every real-server test runs
// on it too, but those that need a real server's own behaviour, which skip
// there with the reason below (docs/testing.md lists them). So where the
// fake and MySQL differ, a test fails on one of them.

var (
	fakeOnce [2]sync.Once
	fakeSrv  [2]*sqllocktest.Server
)

// theFake is the one fake server of the test process of each flavour
// (MySQL's; MariaDB's, fake-mariadb=sqllocktest-mariadb): every test's
// tables are its own, as on a real server.
func theFake(mariadb bool) *sqllocktest.Server {
	i, opts := 0, []sqllocktest.Option(nil)
	if mariadb {
		i, opts = 1, append(opts, sqllocktest.WithMariaDB())
	}
	fakeOnce[i].Do(func() {
		var err error
		if fakeSrv[i], err = sqllocktest.NewServer(opts...); err != nil {
			panic(err)
		}
	})
	return fakeSrv[i]
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
	"TestWithWakeups_waiterKilledMidWait":                  "it finds a waiting session in the processlist and KILLs it",
	"TestIntegration_mutualExclusion_stress":               "each holder counts in a table of its own (CREATE TABLE, SELECT, UPDATE)",
	"TestVariants_reachTheServer":                          "it reads the session's variables (@@time_zone, @@sql_mode, the isolation level)",
	"TestQueries_statementBinlogSafe":                      "it reads the binary log's settings and SHOW WARNINGS",
	"TestSemaphore_TryAcquire_statementBinlogSafe":         "it reads the binary log's settings and SHOW WARNINGS",
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
