package sqllock

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock/internal/engine"
	"github.com/sqllock/sqllock/sqllocktest"
)

// ---------------------------------------------------------------------------
// A layer that rewrites insert ids, on a real server

// insertIDMode is how a rewritingConnector hands back the insert id of a
// statement, as a proxy or sharding layer in front of MySQL might.
type insertIDMode int

const (
	// reread: after a statement that calls LAST_INSERT_ID(expr), read the
	// session's LAST_INSERT_ID() with a second query and hand that back, as
	// vttablet does since Vitess 22 (vitess PR #17408).
	reread insertIDMode = iota
	// previous: hand back the insert id of the statement before on the same
	// connection, as a reply read on a pooled connection another statement
	// used last may be.
	previous
)

// rewritingConnector connects to a real server and rewrites the insert id of
// every statement executed through a prepared statement (the only way the
// Client sends writes with the default DSN).
type rewritingConnector struct {
	driver.Connector
	mode insertIDMode
}

func (rc *rewritingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	c, err := rc.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &rewritingConn{passConn: passConn{c}, mode: rc.mode}, nil
}

type rewritingConn struct {
	passConn // late_test.go
	mode     insertIDMode
	mu       sync.Mutex
	last     int64 // the insert id the last statement reported
}

func (c *rewritingConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	st, err := c.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	return &rewritingStmt{passStmt: passStmt{st}, conn: c, query: query}, nil
}

type rewritingStmt struct {
	passStmt // late_test.go
	conn     *rewritingConn
	query    string
}

func (s *rewritingStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	res, err := s.Stmt.(driver.StmtExecContext).ExecContext(ctx, args)
	if err != nil {
		return nil, err
	}
	id, err := res.LastInsertId()
	if err != nil {
		return nil, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return nil, err
	}
	s.conn.mu.Lock()
	defer s.conn.mu.Unlock()
	out := id
	switch s.conn.mode {
	case reread:
		if strings.Contains(s.query, "LAST_INSERT_ID(") {
			if out, err = s.conn.lastInsertID(ctx); err != nil {
				return nil, err
			}
		}
	case previous:
		out = s.conn.last
	}
	s.conn.last = id
	return rewrittenResult{id: out, rows: n}, nil
}

// lastInsertID reads the session's LAST_INSERT_ID() on the connection.
func (c *rewritingConn) lastInsertID(ctx context.Context) (int64, error) {
	rows, err := c.Conn.(driver.QueryerContext).QueryContext(ctx, "SELECT LAST_INSERT_ID()", nil)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	dest := make([]driver.Value, 1)
	if err := rows.Next(dest); err != nil {
		return 0, err
	}
	switch v := dest[0].(type) {
	case int64:
		return v, nil
	case uint64:
		return int64(v), nil
	case []byte:
		u, err := strconv.ParseUint(string(v), 10, 64)
		return int64(u), err
	}
	return 0, fmt.Errorf("LAST_INSERT_ID() gave %T, not a number", dest[0])
}

type rewrittenResult struct{ id, rows int64 }

func (r rewrittenResult) LastInsertId() (int64, error) { return r.id, nil }
func (r rewrittenResult) RowsAffected() (int64, error) { return r.rows, nil }

// rewritingDB opens the environment's server through a layer that rewrites
// insert ids as mode says.
func (e *testEnv) rewritingDB(t *testing.T, mode insertIDMode) *sql.DB {
	t.Helper()
	db := sql.OpenDB(&rewritingConnector{Connector: e.quietConnector(t, func(*mysql.Config) {}), mode: mode})
	t.Cleanup(func() { db.Close() })
	return db
}

// proofRows counts the rows proofs left in table.
func (e *testEnv) proofRows(t *testing.T, table string) int {
	t.Helper()
	var n int
	if err := e.db.QueryRow("SELECT COUNT(*) FROM `" + table + "` WHERE name LIKE CONCAT(0x00, '%')").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A Client's first write proves the statements on the server, under every
// DSN, and leaves no row behind; the proof is made once.
func TestClient_firstUse_provesStatements(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		if n := e.proofRows(t, table); n != 0 {
			t.Fatalf("after CreateTable: %d proof rows, want 0", n)
		}
		c := e.client(t, e.db, table)
		l := mustAcquire(t, c, "job", time.Minute)
		if !c.eng.Forms().Proven {
			t.Error("proven: got false after a lease was taken, want true")
		}
		if err := l.Release(testCtx(t)); err != nil {
			t.Fatal(err)
		}
		if n := e.proofRows(t, table); n != 0 {
			t.Errorf("after the first acquire: %d proof rows, want 0", n)
		}
	})
}

// A layer that hands back an insert id other than the statement's own (as
// Vitess does) is refused at the first use, before any lease is taken; the
// same server straight is not. Without the proof, the same layer gives a
// refused acquire a fence: two owners.
func TestClient_firstUse_refusesRewrittenInsertID(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		modes := []struct {
			name string
			mode insertIDMode
		}{{"reread", reread}, {"previous", previous}}
		for _, m := range modes {
			t.Run(m.name, func(t *testing.T) {
				table := e.newTable(t)
				ctx := testCtx(t)
				db := e.rewritingDB(t, m.mode)
				c := e.client(t, db, table)
				_, err := c.TryAcquire(ctx, "job", time.Minute)
				wantErrIs(t, err, ErrUnsupportedServer)
				if err := c.CreateTable(ctx); !errors.Is(err, ErrUnsupportedServer) {
					t.Errorf("CreateTable: got %v, want ErrUnsupportedServer", err)
				}
				if n := e.proofRows(t, table); n != 0 {
					t.Errorf("%d proof rows left, want 0", n)
				}
				straight := e.client(t, e.db, table)
				l := mustAcquire(t, straight, "job", time.Minute)

				// What the proof keeps out: the same layer, unproven.
				unproven := e.client(t, db, table)
				unproven.markProven()
				unproven.eng.Mark(func(f *engine.Forms) *bool { return &f.Checked })
				if e.server.Vitess {
					chooseFormsOn(t, unproven, db, e.server.Version, false) // as its first-use check would
				}
				switch m.mode {
				case previous:
					// One connection, whose last statement reported the
					// held name's fence, as a busy pool's often has.
					db.SetMaxOpenConns(1)
					if _, err := db.ExecContext(ctx, "UPDATE `"+table+"` SET fence = LAST_INSERT_ID(fence) WHERE name = ? AND kind = ?", "job", e.fenceKind()); err != nil {
						t.Fatal(err)
					}
					got, err := unproven.TryAcquire(ctx, "job", time.Minute)
					if err != nil {
						t.Fatalf("unproven through previous: got %v, want a second owner (the layer no longer shows the flaw)", err)
					}
					t.Logf("unproven through previous: a second owner of a held name, fence %d (the first has %d)", got.Fence(), l.Fence())
				case reread:
					// A refresh that matches no row sets no insert id: the
					// layer hands back what the acquire left in the session.
					db.SetMaxOpenConns(1)
					lost := mustAcquire(t, unproven, "lost", time.Minute)
					if _, err := e.db.Exec("DELETE FROM `" + table + "` WHERE name = 'lost' AND kind = 'L'"); err != nil {
						t.Fatal(err)
					}
					if err := lost.Refresh(ctx, time.Minute); err != nil {
						t.Fatalf("unproven through reread: Refresh of a lost lease got %v, want nil (the layer no longer shows the flaw)", err)
					}
					t.Log("unproven through reread: a refresh of a lease that was gone reported it extended")
				}
			})
		}
	})
}

// ---------------------------------------------------------------------------
// Through the mock: each wrong answer of the proof is refused

func TestClient_firstUse_refusesVitess(t *testing.T) {
	e := newMockEnv(t)
	e.mock.ExpectQuery(firstUseSQL(e.table)).WithoutArgs().
		WillReturnRows(firstUseRows(1, "8.4.6-Vitess", e.table))
	expectCarries(e.mock, 5)
	_, err := e.c.TryAcquire(t.Context(), "job", time.Second)
	wantErrIs(t, err, ErrUnsupportedServer)
	assertErrContains(t, err, "Vitess (8.4.6-Vitess)")
	assertErrContains(t, err, "LAST_INSERT_ID")
	e.assertNothingPrepared()
	e.done()
}

// Vitess passes the first-use check's query on the table to the MySQL
// behind it, which answers VERSION() with its own: the proof asks the
// connection on no table, which Vitess answers itself, before any write.
func TestClient_firstUse_refusesVitessBehindItsServer(t *testing.T) {
	e := newMockEnv(t)
	e.mock.ExpectQuery(firstUseSQL(e.table)).WithoutArgs().
		WillReturnRows(firstUseRows(1, "9.7.4-2", e.table))
	expectCarries(e.mock, 5)
	e.mock.ExpectQuery("SELECT VERSION()").WithoutArgs().WillReturnRows(sqlmock.NewRows([]string{"v"}).AddRow("8.4.6-Vitess"))
	_, err := e.c.TryAcquire(t.Context(), "job", time.Second)
	wantErrIs(t, err, ErrUnsupportedServer)
	assertErrContains(t, err, "Vitess (8.4.6-Vitess)")
	e.done() // and nothing else was sent: no write, no prepare
	if e.c.eng.Forms().Proven {
		t.Error("proven: got true, want false")
	}
}

// Each wrong answer of each statement of the proof, its positive and its
// negative, is refused, naming the statement and the server.
func TestClient_firstUse_proofAnswers(t *testing.T) {
	const fence = proofFence
	type answer = proofAnswer
	tests := []struct {
		name string
		step int // which answer of proofSteps is wrong
		bad  answer
		want string
	}{
		{"acquire reports the mark", 0, answer{1, 2}, "reported 1, and the table holds fence 7"},
		{"acquire reports another fence", 1, answer{8, 0}, "reported 7, and the table holds fence 8"},
		{"refresh reports a stale id", 2, answer{fence, 0}, "left by an earlier statement"},
		{"refused acquire reports a fence", 3, answer{fence + 1, 0}, "instead of 0 (refused)"},
		{"repeated acquire reports another fence", 4, answer{fence + 1, 1}, "instead of its fence 7"},
		{"owner's refresh reports 0", 5, answer{0, 0}, "statement refresh: a refresh by the owner of a live lease reported 0"},
		{"check under another token changes a row", 6, answer{0, 1}, "statement check: a check under another token of a live lease changed 1 rows instead of 0"},
		{"owner's check changes nothing", 7, answer{0, 0}, "statement check: a check by the owner of a live lease changed 0 rows instead of 1"},
		{"release_at_least under another token reports ours", 8, answer{1, 1}, "statement release_at_least: a release with a minimum hold under a token that holds nothing reported 1"},
		{"owner's release_at_least reports 0", 9, answer{0, 0}, "statement release_at_least: a release with a minimum hold by the lease's owner reported 0"},
		{"release under another token deletes", 10, answer{0, 1}, "statement release: a release under another token changed 1 rows instead of 0"},
		{"owner's release deletes nothing", 11, answer{0, 0}, "statement release: a release by the owner changed 0 rows instead of 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newMockEnv(t)
			e.expectAutocommit(1)
			e.mock.ExpectQuery("SELECT VERSION()").WithoutArgs().WillReturnRows(sqlmock.NewRows([]string{"v"}).AddRow("10.11.19-MariaDB"))
			e.expectServerFacts("10.11.19-MariaDB")
			steps := e.proofSteps()
			for i := 0; i <= max(tt.step, 1); i++ { // the fence is checked after the inspect
				a := steps[i].answer
				if i == tt.step {
					a = tt.bad
				}
				steps[i].expect(a)
			}
			if tt.step == 6 {
				e.mock.ExpectRollback() // the check's transaction ends at its first wrong answer
			}
			// Whatever the proof left under its own name goes.
			e.mock.ExpectExec(e.sql("proof_clear")).WithArgs(sqlmock.AnyArg()).WillReturnResult(sqlmock.NewResult(0, 2))
			_, err := e.c.TryAcquire(t.Context(), "job", time.Second)
			wantErrIs(t, err, ErrUnsupportedServer)
			assertErrContains(t, err, tt.want)
			assertErrContains(t, err, "10.11.19-MariaDB")
			e.done()
			if e.c.eng.Forms().Proven {
				t.Error("proven: got true after a failed proof, want false")
			}
		})
	}
}

// A read-only server refuses the proof's first write: the acquire fails with
// the server's refusal, which callers that wait out a failover pass over;
// reads go on, and the next write makes the proof again.
func TestClient_firstUse_readOnlyServerProvesLater(t *testing.T) {
	e := newMockEnv(t)
	e.expectAutocommit(1)
	any9 := make([]driver.Value, 9)
	for i := range any9 {
		any9[i] = sqlmock.AnyArg()
	}
	e.mock.ExpectQuery("SELECT VERSION()").WithoutArgs().WillReturnRows(sqlmock.NewRows([]string{"v"}).AddRow("10.11.19-MariaDB"))
	e.mock.ExpectQuery(queries["server_mariadb"]).WithoutArgs().
		WillReturnRows(sqlmock.NewRows([]string{"ro", "sro", "id", "cluster"}).AddRow(0, 0, "1 mock 3306 /data/", ""))
	readOnly := errors.New("Error 1290 (HY000): The MySQL server is running with the --read-only option so it cannot execute this statement")
	e.mock.ExpectPrepare(e.sql("acquire"))
	e.mock.ExpectExec(e.sql("acquire")).WithArgs(any9...).WillReturnError(readOnly)
	_, err := e.c.TryAcquire(t.Context(), "job", time.Second)
	if err == nil || !passable(err) {
		t.Fatalf("TryAcquire on a read-only server: got %v, want a refusal that may pass", err)
	}
	assertErrContains(t, err, "read-only")

	e.expectInspect("job", sqlmock.NewRows([]string{"h", "f", "l", "u", "a", "m"}))
	if _, err := e.c.Inspect(t.Context(), "job"); err != nil {
		t.Errorf("Inspect: got %v, want nil", err)
	}
	e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, &tokenArg{}), okReply(101, 2))
	if _, err := e.c.TryAcquire(t.Context(), "job", time.Second); err != nil {
		t.Errorf("TryAcquire once writable: got %v, want nil", err)
	}
	e.done()
}

// A proof whose connection breaks is made again, under a fresh name, as a
// statement is sent again: a lost reply is no answer.
func TestClient_firstUse_proofSurvivesBrokenConnection(t *testing.T) {
	e := newMockEnv(t)
	e.expectAutocommit(1)
	var names []string
	name := sqlmock.Argument(argFunc(func(v driver.Value) bool {
		s, _ := v.(string)
		names = append(names, s)
		return strings.HasPrefix(s, engine.ProofPrefix)
	}))
	args := []driver.Value{name, sqlmock.AnyArg(), sqlmock.AnyArg(), sqlmock.AnyArg(), sqlmock.AnyArg(),
		sqlmock.AnyArg(), sqlmock.AnyArg(), sqlmock.AnyArg(), sqlmock.AnyArg()}
	e.mock.ExpectQuery("SELECT VERSION()").WithoutArgs().WillReturnRows(sqlmock.NewRows([]string{"v"}).AddRow("10.11.19-MariaDB"))
	e.mock.ExpectQuery(queries["server_mariadb"]).WithoutArgs().
		WillReturnRows(sqlmock.NewRows([]string{"ro", "sro", "id", "cluster"}).AddRow(0, 0, "1 mock 3306 /data/", ""))
	e.mock.ExpectPrepare(e.sql("acquire"))
	e.mock.ExpectExec(e.sql("acquire")).WithArgs(args...).WillReturnError(mysql.ErrInvalidConn)
	e.mock.ExpectExec(e.sql("proof_clear")).WithArgs(sqlmock.AnyArg()).WillReturnResult(sqlmock.NewResult(0, 1))
	e.expectProof()
	e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, &tokenArg{}), okReply(101, 2))
	if _, err := e.c.TryAcquire(t.Context(), "job", time.Second); err != nil {
		t.Fatalf("TryAcquire: got %v, want nil", err)
	}
	e.done()
	if len(names) == 0 {
		t.Fatal("the proof's name was not seen")
	}
}

// argFunc is a sqlmock.Argument from a function.
type argFunc func(driver.Value) bool

func (f argFunc) Match(v driver.Value) bool { return f(v) }

// A proof whose inspect finds no row for the name an acquire just took
// says so, naming the statement, not "sql: no rows in result set".
func TestClient_firstUse_proofNoRowSaysWhat(t *testing.T) {
	e := newMockEnv(t)
	e.expectAutocommit(1)
	e.mock.ExpectQuery("SELECT VERSION()").WithoutArgs().WillReturnRows(sqlmock.NewRows([]string{"v"}).AddRow("10.11.19-MariaDB"))
	e.expectServerFacts("10.11.19-MariaDB")
	steps := e.proofSteps()
	steps[0].expect(steps[0].answer)
	e.mock.ExpectPrepare(e.sql("inspect"))
	e.mock.ExpectQuery(e.sql("inspect")).WithArgs(sqlmock.AnyArg()).
		WillReturnRows(sqlmock.NewRows([]string{"holder", "fence", "held", "us", "ahead", "min_hold"}))
	e.mock.ExpectExec(e.sql("proof_clear")).WithArgs(sqlmock.AnyArg()).WillReturnResult(sqlmock.NewResult(0, 2))
	_, err := e.c.TryAcquire(t.Context(), "job", time.Second)
	wantErrIs(t, err, ErrUnsupportedServer)
	assertErrContains(t, err, "statement inspect: it found no fence for a name an acquire had just taken")
	if strings.Contains(err.Error(), "no rows in result set") {
		t.Errorf("got %v, want no bare %q", err, sql.ErrNoRows)
	}
	e.done()
}

// A statement of the proof that the session's sql_mode makes fail (a
// syntax error) is refused with an error naming the statement, the step
// and the sql_mode, which the user can change.
func TestClient_firstUse_proofNamesSQLMode(t *testing.T) {
	e := newMockEnv(t)
	e.expectAutocommit(1)
	e.mock.ExpectQuery("SELECT VERSION()").WithoutArgs().WillReturnRows(sqlmock.NewRows([]string{"v"}).AddRow("10.11.19-MariaDB"))
	e.expectServerFacts("10.11.19-MariaDB")
	e.mock.ExpectPrepare(e.sql("acquire"))
	syntax := &mysql.MySQLError{Number: 1064, Message: "You have an error in your SQL syntax"}
	e.mock.ExpectExec(e.sql("acquire")).WithArgs(slices.Repeat([]driver.Value{sqlmock.AnyArg()}, 9)...).WillReturnError(syntax)
	e.mock.ExpectQuery("SELECT @@SESSION.sql_mode").WithoutArgs().WillReturnRows(sqlmock.NewRows([]string{"m"}).AddRow("ORACLE"))
	e.mock.ExpectExec(e.sql("proof_clear")).WithArgs(sqlmock.AnyArg()).WillReturnResult(sqlmock.NewResult(0, 0))
	_, err := e.c.TryAcquire(t.Context(), "job", time.Second)
	wantErrIs(t, err, ErrUnsupportedServer)
	assertErrContains(t, err, `statement acquire failed under this session's sql_mode "ORACLE" (take a free name)`, "1064")
	e.done()
}

// Many Clients making their first use at once, on one table, each proving
// the statements under proof names of its own, which sit side by side in
// the table's index: the server's deadlocks and gap-lock waits between
// those proofs (a CI run saw one on a Group Replication member) are sent
// again, never returned. Every kind's proof the server takes runs: single
// names, sets and semaphores.
func TestClient_firstUse_manyClientsAtOnce(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		// The kinds this server takes: sets are refused through Vitess,
		// semaphores on the one-row servers.
		kinds := []string{"name"}
		if !e.server.Vitess {
			kinds = append(kinds, "set")
		}
		if !e.oneRow() {
			kinds = append(kinds, "slot")
		}
		const clients, rounds = 8, 4
		for round := range rounds {
			var (
				start = make(chan struct{})
				wg    sync.WaitGroup
				errs  = make(chan error, 3*clients)
			)
			for i := range clients {
				db := e.openDB(t)
				c := e.client(t, db, table)
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					ctx := testCtx(t)
					name := fmt.Sprintf("many %d %d", round, i)
					var err error
					switch kinds[i%len(kinds)] {
					case "name":
						var l *Lock
						if l, err = c.TryAcquire(ctx, name, time.Minute); err == nil {
							err = l.Release(ctx)
						}
					case "set":
						var l *Lock
						if l, err = c.TryAcquireSet(ctx, []string{name + " a", name + " b"}, time.Minute); err == nil {
							err = l.Release(ctx)
						}
					case "slot":
						var l *Lock
						if l, err = c.Semaphore(name, 2).TryAcquire(ctx, time.Minute); err == nil {
							err = l.Release(ctx)
						}
					}
					if err != nil {
						errs <- fmt.Errorf("client %d of round %d: %w", i, round, err)
					}
				}()
			}
			close(start)
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			if t.Failed() {
				return
			}
		}
		if e.server.Fake {
			return // it runs no query of the test's own
		}
		if n := e.proofRows(t, table); n != 0 {
			t.Errorf("after the races: %d proof rows, want 0", n)
		}
	})
}

// A deadlock at any step of a proof is sent again, or the proof made again
// under a fresh name, and never returned: the fake injects one into each
// statement the proofs send, in turn, and the first use of single names,
// of sets and of semaphores succeeds and leaves no proof row. (A CI run saw
// a proof on a Group Replication member return 1213 from a step that was
// not sent again.)
func TestClient_firstUse_proofDeadlockSentAgain(t *testing.T) {
	for _, stmt := range []string{"version", "server_mysql", "acquire", "refresh", "check", "release_at_least", "release",
		"proof_clear", "proof_engine", "proof_overflow", "all_acquire", "all_refresh", "all_check", "all_release_at_least", "all_release",
		"slot_acquire", "slot_release"} {
		t.Run(stmt, func(t *testing.T) {
			srv := sqllocktest.New(t)
			if err := srv.Inject(sqllocktest.Fault{Statement: stmt, Err: sqllocktest.Deadlock}); err != nil {
				t.Fatal(err)
			}
			c, err := New(srv.DB(), WithHolder("deadlocks"))
			if err != nil {
				t.Fatal(err)
			}
			ctx := testCtx(t)
			for _, take := range []func() (*Lock, error){
				func() (*Lock, error) { return c.TryAcquire(ctx, "job", time.Minute) },
				func() (*Lock, error) { return c.TryAcquireSet(ctx, []string{"a", "b"}, time.Minute) },
				func() (*Lock, error) { return c.Semaphore("s", 2).TryAcquire(ctx, time.Minute) },
			} {
				l, err := take()
				if err != nil {
					t.Fatalf("first use with a deadlock injected into %s: %v", stmt, err)
				}
				if err := l.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if n := srv.Pending(); n != 0 {
				t.Errorf("the deadlock injected into %s never fired", stmt)
			}
			list, err := c.List(ctx)
			if err != nil || len(list) != 0 {
				t.Errorf("List: got %v, %v, want nothing left", list, err)
			}
			var rows int
			if err := srv.DB().QueryRow("SELECT COUNT(*) FROM sqllock").Scan(&rows); err == nil && rows != 0 {
				t.Errorf("rows left: %d", rows)
			}
		})
	}
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

// The set, semaphore and Once statements are proven at their kind's first
// use, once per Client, not at the Client's first write, and leave no row
// behind.
func TestClient_laterProofs_atFirstUseOnce(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		c := e.client(t, e.db, table)
		ctx := testCtx(t)
		done := func(kind int) bool { return c.eng.Forms().Later[kind] }
		if err := mustAcquire(t, c, "single", time.Minute).Release(ctx); err != nil {
			t.Fatal(err)
		}
		for kind := range engine.NumLater {
			if done(kind) {
				t.Errorf("after a single name: the %s proof made, want it left to its first use", engine.LaterNames[kind])
			}
		}
		uses := []struct {
			kind int
			use  func() error
		}{
			{engine.LaterSets, func() error {
				l, err := c.TryAcquireSet(ctx, []string{"a", "b"}, time.Minute)
				if err == nil {
					err = l.Release(ctx)
				}
				return err
			}},
			{engine.LaterSlots, func() error {
				l, err := c.Semaphore("jobs", 2).TryAcquire(ctx, time.Minute)
				if err == nil {
					err = l.Release(ctx)
				}
				return err
			}},
			{engine.LaterOnce, func() error {
				_, err := c.Once(ctx, "once", func(_ context.Context, _ *Lock) error { return nil })
				return err
			}},
			{engine.LaterSessions, func() error {
				l := mustAcquire(t, c, "kept", 900*time.Millisecond)
				l.KeepAlive(ctx)
				waitFor(t, 10*time.Second, "the first session", func() bool { return done(engine.LaterSessions) })
				return l.Release(ctx)
			}},
		}
		for _, u := range uses {
			if u.kind == engine.LaterSessions && !c.eng.Sessions() {
				continue // TiDB, Vitess, the fake: no session is kept
			}
			err := u.use()
			if errors.Is(err, ErrUnsupportedServer) && e.oneRow() && u.kind != engine.LaterOnce {
				continue // sets through Vitess, semaphores on TiDB and through Vitess
			}
			if err != nil {
				t.Fatalf("first %s: %v", engine.LaterNames[u.kind], err)
			}
			if !done(u.kind) {
				t.Errorf("after the first %s: its proof not made", engine.LaterNames[u.kind])
			}
			if n := e.proofRows(t, table); n != 0 {
				t.Errorf("after the first %s: %d proof rows, want 0", engine.LaterNames[u.kind], n)
			}
		}
	})
}

// tamperConnector connects to a real server and changes the answer of
// every statement whose text holds match, as a layer that runs that one
// statement wrongly would. It prepares everything (it implements no
// ExecerContext), so the text statements go through it too.
type tamperConnector struct {
	driver.Connector
	match  string
	answer func(res driver.Result, err error) (driver.Result, error)
}

func (tc *tamperConnector) Connect(ctx context.Context) (driver.Conn, error) {
	c, err := tc.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &tamperConn{passConn: passConn{c}, tc: tc}, nil
}

type tamperConn struct {
	passConn
	tc *tamperConnector
}

func (c *tamperConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	st, err := c.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, query)
	if err != nil || !strings.Contains(query, c.tc.match) {
		return st, err
	}
	return &tamperStmt{passStmt: passStmt{st}, tc: c.tc}, nil
}

type tamperStmt struct {
	passStmt
	tc *tamperConnector
}

func (s *tamperStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	return s.tc.answer(s.Stmt.(driver.StmtExecContext).ExecContext(ctx, args))
}

// answerWith returns an answer of insert id id and rows affected rows,
// whatever the server said.
func answerWith(id, rows int64) func(driver.Result, error) (driver.Result, error) {
	return func(driver.Result, error) (driver.Result, error) { return rewrittenResult{id: id, rows: rows}, nil }
}

// Each statement a Client sends is proven, with its answer that takes and
// its answer that refuses, before its first real use: a layer that answers
// one of them wrongly is refused then, with an error naming the statement,
// and no lease is taken through it. The single-name statements are proven
// at the Client's first write; the set, semaphore and Once statements at
// their own first use, so a Client whose layer breaks only sets still
// takes single names.
func TestClient_firstUse_provesEveryStatement(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		if e.server.TiDB || e.server.Vitess {
			t.Skipf("%s takes the one-row forms, whose texts these layers do not match", e.server.Label)
		}
		tests := []struct {
			name   string
			match  string // in the statement's text
			answer func(driver.Result, error) (driver.Result, error)
			use    func(ctx context.Context, c *Client) error // the kind's first use
			want   string
		}{
			{"owner's refresh not extended", "SET l.expires_at = GREATEST(IF(l.expires_at = '9999-12-31 23:59:59.999999', COALESCE(s.expires_at, '1000-01-01'), l.expires_at),\n", answerWith(0, 0), nil,
				"statement refresh: a refresh by the owner of a live lease reported 0"},
			{"check changes no row", "SET acquired_at = acquired_at + INTERVAL IF(MOD(MICROSECOND(acquired_at), 2) = 0, 1, -1) MICROSECOND\nWHERE name", answerWith(0, 0), nil,
				"statement check: a check by the owner of a live lease changed 0 rows instead of 1"},
			{"release_at_least not ours", "SET expires_at = acquired_at + INTERVAL ? MICROSECOND,\n    fence", answerWith(0, 0), nil,
				"statement release_at_least"},
			{"release deletes another's", "DELETE FROM", answerWith(0, 1), nil,
				"statement release: a release under another token changed 1 rows instead of 0"},
			{"set refused without 1690", "fence + 1 + 18446744073709551615)", func(res driver.Result, err error) (driver.Result, error) {
				if err != nil {
					return rewrittenResult{id: 5, rows: 6}, nil // the overflow raised no error
				}
				return res, nil
			}, func(ctx context.Context, c *Client) error {
				_, err := c.TryAcquireSet(ctx, []string{"a", "b"}, time.Minute)
				return err
			}, "statement all_acquire: an acquire of a set whose names another owner held succeeded"},
			{"set check changes no row", "AND name IN", func(res driver.Result, err error) (driver.Result, error) {
				return rewrittenResult{rows: 0}, err
			}, func(ctx context.Context, c *Client) error {
				_, err := c.TryAcquireSet(ctx, []string{"a", "b"}, time.Minute)
				return err
			}, "by the owner changed 0 rows instead of 2"},
			{"set refresh extends a set with its lease rows gone", "SET l.expires_at", func() func(driver.Result, error) (driver.Result, error) {
				refusals := 0
				return func(res driver.Result, err error) (driver.Result, error) {
					if err != nil {
						// The first, under another token, stays refused.
						if refusals++; refusals == 2 {
							return rewrittenResult{rows: 1}, nil
						}
					}
					return res, err
				}
			}(), func(ctx context.Context, c *Client) error {
				_, err := c.TryAcquireSet(ctx, []string{"a", "b"}, time.Minute)
				return err
			}, "statement all_refresh: a refresh of a set whose lease rows were deleted succeeded"},
			{"full semaphore gives a slot", "'F', ?, '', UTC_TIMESTAMP(6)", answerWith(slotTaken+1, 2), func(ctx context.Context, c *Client) error {
				_, err := c.Semaphore("jobs", 2).TryAcquire(ctx, time.Minute)
				return err
			}, "statement slot_acquire: taking a slot of a full semaphore reported"},
			{"Once recorded for another token", "SELECT l.name, 'D'", answerWith(1, 1), func(ctx context.Context, c *Client) error {
				_, err := c.Once(ctx, "once", func(_ context.Context, _ *Lock) error { return nil })
				return err
			}, "statement once_record: a completion record under another token reported 1"},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				table := e.newTable(t)
				ctx := testCtx(t)
				db := sql.OpenDB(&tamperConnector{Connector: e.quietConnector(t, func(*mysql.Config) {}), match: tt.match, answer: tt.answer})
				t.Cleanup(func() { db.Close() })
				c := e.client(t, db, table)
				var err error
				if tt.use == nil {
					_, err = c.TryAcquire(ctx, "job", time.Minute)
				} else {
					// The single-name proof passes: the layer breaks only
					// this kind's statements.
					mustAcquire(t, c, "single", time.Minute).Release(ctx)
					err = tt.use(ctx, c)
				}
				wantErrIs(t, err, ErrUnsupportedServer)
				assertErrContains(t, err, tt.want)
				if n := e.proofRows(t, table); n != 0 {
					t.Errorf("%d proof rows left, want 0", n)
				}
				var leases int
				if err := e.db.QueryRow("SELECT COUNT(*) FROM `" + table + "` WHERE kind = 'L'").Scan(&leases); err != nil {
					t.Fatal(err)
				}
				if leases != 0 {
					t.Errorf("%d lease rows after the refusal, want 0", leases)
				}
			})
		}
	})
}

// A set's statements are sent as text, on whichever connection the pool
// gives. MySQL Router with connection sharing refuses a text statement that
// calls LAST_INSERT_ID on a connection nothing has pinned (3566), as it
// refuses SELECT LAST_INSERT_ID(1) there; the set's acquire passes it
// (Router 9.7.4). With no idle connection kept, every statement meets a
// fresh connection, which nothing pinned: this fails if a router refuses it.
func TestClient_TryAcquireSet_freshConnections(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		if e.server.Vitess {
			t.Skip("sets are refused through Vitess")
		}
		table := e.newTable(t)
		db := e.openDB(t)
		db.SetMaxIdleConns(0)
		c := e.client(t, db, table)
		for i := range 3 {
			l := mustAcquireSet(t, c, time.Minute, "a", "b")
			if err := l.Refresh(testCtx(t), time.Minute); err != nil {
				t.Fatalf("Refresh %d: %v", i, err)
			}
			if err := l.Release(testCtx(t)); err != nil {
				t.Fatalf("Release %d: %v", i, err)
			}
		}
	})
}
