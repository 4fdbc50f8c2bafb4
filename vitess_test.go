package sqllock

import (
	"context"
	"database/sql/driver"
	"strings"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/engine"
	"github.com/sqllock/sqllock/internal/fault"
)

// The tests below run on the Vitess keyspaces SQLLOCK_TEST_DSN names
// (scripts/vitess env prints them as SQLLOCK_TEST_VITESS_DSN; .ci/run runs
// every real-server test on them) and skip elsewhere.

// Why tests skip through Vitess: what vtgate does not pass on or refuses,
// named in docs/testing.md.
const (
	vitessNoKill      = "vtgate refuses KILL (VT07001: kill statement execution not permitted), so a test cannot cut a connection from the server's side"
	vitessNoAuth      = "vttestserver's vtgate checks no password (--mysql-auth-server-impl none)"
	vitessNoTimestamp = "vtgate refuses SET timestamp (1105, a syntax error): no session timestamp reaches a tablet through it"
	vitessNoReadOnly  = "through vtgate a session's transaction_read_only=1 did not refuse an autocommit write (no 1792): vtgate does not pass it to the tablet's statement"
	vitessNoIdleKill  = "vtgate does not close a client's session when its wait_timeout passes: the setting goes to the tablet's connections, not to vtgate's"
	vitessNoChannels  = "the wake-up channels stay off through Vitess (TestVitess_wakeupsOff)"
	vitessNoProxy     = "these tests are of the fault proxy itself, not of sqllock, and vtgate cannot prepare their DO ? (1815)"
	vitessCancelsCut  = "vtgate cancelled the acquire when its client's connection was cut, before it committed, so no lease was left to clean up (it may also commit first: then the test runs)"
)

// noSuchTable is the error number a statement on a missing table gets:
// MySQL's 1146, or in a sharded Vitess keyspace vtgate's own 1105 ("table X
// not found"), since vtgate routes by a vschema that does not have it.
func (e *testEnv) noSuchTable() int {
	if e.server.Vitess && e.server.VitessShards > 1 {
		return fault.UnknownError
	}
	return fault.NoSuchTable
}

// skipOnVitess skips t through Vitess, saying why.
func skipOnVitess(t *testing.T, e *testEnv, why string) {
	t.Helper()
	if e.server.Vitess {
		t.Skipf("%s is %s: %s", e.server.Label, e.server.Version, why)
	}
}

func skipUnlessVitess(t *testing.T, e *testEnv) {
	t.Helper()
	if !e.server.Vitess {
		t.Skipf("%s is %s, not Vitess", e.server.Label, e.server.Version)
	}
}

// Through Vitess's vtgate, which puts its session's value in place of every
// LAST_INSERT_ID() without an argument, the first-use check sees the
// statement's own value missed, takes the one-row forms, and the proof
// passes them: a lease is taken, refused to another owner while it is live,
// and its fence is the one the table holds.
func TestVitess_oneRowFormsProven(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipUnlessVitess(t, e)
		ctx := testCtx(t)
		table := e.newTable(t)
		c := e.client(t, e.db, table)
		l, err := c.TryAcquire(ctx, "job", time.Minute)
		if err != nil {
			t.Fatalf("TryAcquire: %v", err)
		}
		if !c.eng.Forms().OneRow || !c.eng.Forms().OnceByRows || c.eng.Forms().TiDB {
			t.Errorf("forms: oneRow %v onceByRows %v tidb %v, want the one-row forms without TiDB's", c.eng.Forms().OneRow, c.eng.Forms().OnceByRows, c.eng.Forms().TiDB)
		}
		if strings.Contains(c.eng.Forms().SQL[qAcquire], "LAST_INSERT_ID()") || strings.Contains(c.eng.Forms().SQL[qAcquire], "SET_VAR") {
			t.Errorf("acquire: got %s, want the one-row form without LAST_INSERT_ID() and TiDB's hint", c.eng.Forms().SQL[qAcquire])
		}
		var fence uint64
		if err := e.db.QueryRowContext(ctx, "SELECT fence FROM `"+table+"` WHERE name = 'job' AND kind = 'L'").Scan(&fence); err != nil {
			t.Fatal(err)
		}
		if l.Fence() != fence {
			t.Errorf("fence: got %d, the table holds %d", l.Fence(), fence)
		}
		other := e.client(t, e.openDB(t), table)
		if _, err := other.TryAcquire(ctx, "job", time.Minute); err == nil {
			t.Fatal("another Client acquired a live lease")
		} else {
			wantErrIs(t, err, ErrNotAcquired)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		l2, err := other.TryAcquire(ctx, "job", time.Minute)
		if err != nil {
			t.Fatalf("TryAcquire after the release: %v", err)
		}
		if l2.Fence() <= l.Fence() {
			t.Errorf("fence after the release: got %d, want more than %d", l2.Fence(), l.Fence())
		}
	})
}

// The two-row forms are refused through Vitess: by the version vtgate gives
// the proof, and, without it, by the statements' own answers.
func TestVitess_twoRowFormsRefused(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipUnlessVitess(t, e)
		ctx := testCtx(t)
		table := e.newTable(t)
		c := e.client(t, e.db, table)
		chooseFormsOn(t, c, e.db, "9.7.4", true) // as if the first-use check had seen LAST_INSERT_ID() carry
		_, err := c.TryAcquire(ctx, "job", time.Minute)
		wantErrIs(t, err, ErrUnsupportedServer)
		assertErrContains(t, err, "Vitess")
		assertErrContains(t, err, "LAST_INSERT_ID()")
		if c.eng.Forms().Proven {
			t.Error("proven: got true, want false")
		}
		// Without the version, the statements' own answers refuse them:
		// TestServer_proveStatements_twoRowFormsOnVitess (internal/engine).
	})
}

// In a sharded keyspace vtgate runs Once's INSERT ... SELECT as a SELECT ...
// FOR UPDATE and an INSERT in one transaction on the name's shard and hands
// back no insert id; the record is judged by the rows it inserted, so a
// holder's record is written and reported written, and a lost lease's is
// neither.
func TestVitess_onceRecordByRows(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipUnlessVitess(t, e)
		ctx := testCtx(t)
		table := e.newTable(t)
		c := e.client(t, e.db, table)
		runs := 0
		for i := range 2 {
			ran, err := c.Once(ctx, "seed", func(_ context.Context, _ *Lock) error { runs++; return nil })
			if err != nil || ran != (i == 0) {
				t.Fatalf("Once %d: got %v, %v; want %v, nil", i, ran, err, i == 0)
			}
		}
		if runs != 1 {
			t.Errorf("fn ran %d times, want 1", runs)
		}
		l, err := c.TryAcquire(ctx, "taken", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.db.ExecContext(ctx, "UPDATE `"+table+"` SET owner = 'someone else' WHERE name = 'taken' AND kind = 'L'"); err != nil {
			t.Fatal(err)
		}
		err = l.recordOnce(ctx)
		wantErrIs(t, err, ErrLockLost)
		var n int
		if err := e.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+table+"` WHERE name = 'taken' AND kind = 'D'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Errorf("records of a lost lease: got %d, want 0", n)
		}
	})
}

// Through the mock: where the first-use check sees LAST_INSERT_ID() miss the
// value its own statement set, and the proof's VERSION() says Vitess, the
// Client proves and sends the one-row forms without TiDB's hint, the
// acquire with its first four arguments, and judges Once's record by the
// rows it inserted: 1 written (with no insert id, as vtgate answers in a
// sharded keyspace), 0 refused.
func TestClient_Vitess_sendsOneRowForms(t *testing.T) {
	for _, tc := range []struct {
		rows    int64
		wantErr error
	}{{1, nil}, {0, ErrLockLost}} {
		e := newMockEnv(t)
		e.mock.ExpectQuery(firstUseSQL(e.table)).WithoutArgs().
			WillReturnRows(firstUseRows(1, "9.7.4-2", e.table))
		expectCarries(e.mock, 4)
		expectKeyspace(e.mock)
		e.checked, e.vitess = true, true
		tok := &tokenArg{}
		e.expectExec("tidb_acquire", acquireArgs("job", mockHolder, 60_000_000, tok)[:engine.OneRowAcquireArgs], okReply(1795469000000001, 1))
		e.expectExec("tidb_refresh", refreshArgs(30_000_000, "job", tok), okReply(1795469000000002, 1))
		e.expectExec("once_record", []driver.Value{"job", tok}, okReply(0, tc.rows))

		l, err := e.c.TryAcquire(t.Context(), "job", time.Minute)
		if err != nil {
			t.Fatalf("TryAcquire: got %v, want nil", err)
		}
		if l.Fence() != 1795469000000001 {
			t.Errorf("Fence: got %d, want the insert id 1795469000000001", l.Fence())
		}
		if err := l.Refresh(t.Context(), 30*time.Second); err != nil {
			t.Fatalf("Refresh: got %v, want nil", err)
		}
		err = l.recordOnce(t.Context())
		if tc.wantErr == nil && err != nil {
			t.Errorf("record with %d rows inserted: got %v, want nil", tc.rows, err)
		} else if tc.wantErr != nil {
			wantErrIs(t, err, tc.wantErr)
		}
		for _, i := range tidbStmts {
			if strings.Contains(e.c.eng.Forms().SQL[i], "SET_VAR") || strings.Contains(e.c.eng.Forms().SQL[i], "LAST_INSERT_ID()") {
				t.Errorf("%s: got %s, want no TiDB hint and no LAST_INSERT_ID()", stmtNames[i], e.c.eng.Forms().SQL[i])
			}
		}
		e.done()
	}
}

// Through Vitess a Client asked for wake-up channels takes none: a waiting
// process polls, holds no channel, and takes the name once it is released.
func TestVitess_wakeupsOff(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipUnlessVitess(t, e)
		table := e.newTable(t)
		ctx := testCtx(t)
		a := e.client(t, e.openDB(t), table, WithHolder("a"))
		b := e.client(t, e.openDB(t), table, WithHolder("b"), WithRetry(LinearBackoff(10*time.Millisecond)))
		held := mustAcquire(t, a, "n", time.Minute)
		got := make(chan *Lock, 1)
		go func() {
			l, err := b.Acquire(ctx, "n", time.Minute)
			if err != nil {
				t.Errorf("Acquire: %v", err)
			}
			got <- l
		}()
		waitFor(t, 10*time.Second, "b polls", func() bool { return headAttempts(b, "n") > 3 })
		if !a.wait.Peek("").Refused || !b.wait.Peek("").Refused || b.wait.Peek("n").Holds {
			t.Errorf("channels: refused %v and %v, b holds one %v; want refused, none held", a.wait.Peek("").Refused, b.wait.Peek("").Refused, b.wait.Peek("n").Holds)
		}
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
		l := <-got
		if l == nil || l.Fence() <= held.Fence() {
			t.Fatalf("after the release: got %v, want b holding a fence above %d", l, held.Fence())
		}
	})
}

// A layer that keeps LAST_INSERT_ID() from carrying in front of MariaDB
// gets no one-row forms: under MariaDB's SIMULTANEOUS_ASSIGNMENT their
// takeover would leave the lease expired. The two-row forms stay, and the
// proof refuses them there.
func TestClient_rewritingLayerBeforeMariaDB_keepsTwoRowForms(t *testing.T) {
	e := newMockEnv(t)
	e.mock.ExpectQuery(firstUseSQL(e.table)).WithoutArgs().
		WillReturnRows(firstUseRows(1, "10.11.19-MariaDB", e.table))
	expectCarries(e.mock, 4)
	e.mock.ExpectPrepare(e.sql("inspect")) // a read: the check, no proof
	if _, err := e.c.eng.Stmt(t.Context(), qInspect); err != nil {
		t.Fatalf("the first-use check: %v", err)
	}
	if e.c.eng.Forms().OneRow || e.c.eng.Forms().SQL[qAcquire] != e.sql("acquire") {
		t.Errorf("forms: oneRow %v, acquire %q; want the two-row forms", e.c.eng.Forms().OneRow, e.c.eng.Forms().SQL[qAcquire])
	}
	e.done()
}
