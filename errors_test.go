package sqllock

// The loops that keep trying (Elect, Acquire's polling, Once, the
// keep-alive) go on through errors that may pass and stop on final ones.
// sqlmock gives the errors a failover produces, which a server cannot be
// made to give on demand; errors_server_test.go checks the classification
// against the errors real servers give.

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock/internal/fault"
)

// passableErrors are errors a failover or restart produces that applied
// nothing: none of them may end a loop that keeps trying. (Errors with an
// unknown outcome pass too; the fault tests give them through a proxy.)
var passableErrors = []struct {
	name string
	err  error
}{
	{"super read only", errReadOnly},
	{"read-only transaction", mysqlErr(1792, "25006", "Cannot execute statement in a READ ONLY transaction")},
	{"too many connections", mysqlErr(1040, "08004", "Too many connections")},
	{"dial refused", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}},
}

func emptyInspect() *sqlmock.Rows {
	return sqlmock.NewRows([]string{"holder", "fence", "held", "ttl", "ahead"})
}

// A candidate whose server turns read-only during a failover keeps
// campaigning, and leads once the server takes writes again.
func TestClient_readOnlyServer_campaignGoesOn(t *testing.T) {
	for _, tc := range passableErrors {
		t.Run(tc.name, func(t *testing.T) {
			e := newMockEnv(t)
			tok := &tokenArg{}
			// A ttl long enough that no renewal comes before the lead ends.
			args := acquireArgs("leader", mockHolder, 1_000_000, tok)
			e.expectExec("acquire", args, errReply(tc.err))
			e.expectInspect("leader", emptyInspect())
			e.expectExec("acquire", args, errReply(tc.err))
			e.expectInspect("leader", emptyInspect())
			e.expectExec("acquire", args, okReply(42, 1))
			e.expectExec("release", releaseArgs("leader", tok), okReply(0, 1))
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			led := false
			err := e.c.Elect(ctx, "leader", time.Second, Callbacks{
				OnStartedLeading: func(_ context.Context, _ *Lock) error { led = true; cancel(); return nil },
			})
			if !led {
				t.Fatalf("Elect: returned %v without leading", err)
			}
			assertErrIs(t, err, context.Canceled)
			e.done()
		})
	}
	t.Run("final error ends it", func(t *testing.T) {
		e := newMockEnv(t)
		e.expectExec("acquire", acquireArgs("leader", mockHolder, 40_000, &tokenArg{}), errReply(errNoSuchTable))
		err := e.c.Elect(t.Context(), "leader", 40*time.Millisecond, Callbacks{OnStartedLeading: func(_ context.Context, _ *Lock) error { return nil }})
		assertErrIs(t, err, errNoSuchTable)
		e.done()
	})
}

// Elect whose server never answered returns its context's error wrapping
// the last error it met, so the caller learns why it never led.
func TestElect_returnsLastError(t *testing.T) {
	e := newMockEnv(t)
	// The proof taken as made: its thirty statements through the mock's
	// unordered matching, under -race on a loaded machine, could use up
	// the 200ms below, and its cut would be the last error.
	e.c.markProven()
	e.proven = true
	e.expectPrepareError("acquire", errReadOnly)
	e.mock.MatchExpectationsInOrder(false)
	for range 200 { // more than 200ms of campaigning sends
		e.mock.ExpectPrepare(e.sql("acquire")).WillReturnError(errReadOnly)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	err := e.c.Elect(ctx, "leader", 40*time.Millisecond, Callbacks{OnStartedLeading: func(_ context.Context, _ *Lock) error { return nil }})
	assertErrIs(t, err, context.DeadlineExceeded, errReadOnly)
}

// passedDeadline is a context whose deadline has passed while its timer has
// not yet fired (ctx.Err() is still nil), as happens for a moment with every
// deadline: a statement cut by it fails before the context says it ended.
type passedDeadline struct{ context.Context }

func (passedDeadline) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

// Issue 20, point 7. An Elect whose attempt fails as its deadline passes,
// before the context says it ended, still returns the attempt's error, with
// the last refusal: the campaign reads the context once, as Acquire does,
// and the refusal is not mistaken for another leader's lease.
func TestElect_deadlinePassingMidAttempt_keepsLastError(t *testing.T) {
	e := newMockEnv(t)
	// The proof taken as made, as in TestElect_returnsLastError: under
	// load its statements could use up the 300ms, and its cut would be
	// the last error.
	e.c.markProven()
	e.proven = true
	e.expectPrepareError("acquire", errReadOnly)
	e.mock.MatchExpectationsInOrder(false)
	for range 200 {
		e.mock.ExpectPrepare(e.sql("acquire")).WillReturnError(errReadOnly)
		e.mock.ExpectPrepare(e.sql("inspect")).WillReturnError(errReadOnly)
	}
	parent, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	err := e.c.Elect(passedDeadline{parent}, "leader", 40*time.Millisecond, Callbacks{OnStartedLeading: func(_ context.Context, _ *Lock) error { return nil }})
	assertErrIs(t, err, context.DeadlineExceeded, errReadOnly)
}

// Acquire's polling goes on through errors that may pass, counting each as
// an attempt, and stops on a final one.
func TestClient_Acquire_pollsThroughPassableErrors(t *testing.T) {
	for _, tc := range passableErrors {
		t.Run(tc.name, func(t *testing.T) {
			e := newMockEnv(t, WithRetry(LinearBackoff(time.Millisecond)))
			tok := &tokenArg{}
			args := acquireArgs("job", mockHolder, 1_000_000, tok)
			e.expectExec("acquire", args, errReply(tc.err), okReply(0, 1), errReply(tc.err), okReply(7, 1))
			l, err := e.c.Acquire(t.Context(), "job", time.Second)
			if err != nil {
				t.Fatalf("Acquire: got %v, want nil", err)
			}
			if l.Fence() != 7 {
				t.Errorf("fence: got %d, want 7", l.Fence())
			}
			e.done()
		})
	}
	t.Run("strategy gives up: the last error", func(t *testing.T) {
		e := newMockEnv(t, WithRetry(LimitRetry(LinearBackoff(time.Millisecond), 2)))
		e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, &tokenArg{}), errReply(errReadOnly), errReply(errReadOnly))
		_, err := e.c.Acquire(t.Context(), "job", time.Second)
		assertErrIs(t, err, errReadOnly)
		e.done()
	})
	t.Run("context ends: the last error too", func(t *testing.T) {
		t.Parallel() // waits out its deadline
		e := newMockEnv(t, WithRetry(LinearBackoff(time.Hour)))
		e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, &tokenArg{}), errReply(errReadOnly))
		// Far enough that a loaded machine answers the first attempt
		// before it: then the error is the refusal, not the cancelled query.
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		_, err := e.c.Acquire(ctx, "job", time.Second)
		assertErrIs(t, err, ErrNotAcquired, context.DeadlineExceeded, errReadOnly)
		e.done()
	})
	t.Run("final error ends it", func(t *testing.T) {
		e := newMockEnv(t, WithRetry(LinearBackoff(time.Millisecond)))
		e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, &tokenArg{}), errReply(errReadOnly), errReply(errSyntax))
		_, err := e.c.Acquire(t.Context(), "job", time.Second)
		assertErrIs(t, err, errSyntax)
		e.done()
	})
}

// Once waits out errors that may pass, on its record and on its lease.
func TestClient_Once_waitsOutPassableErrors(t *testing.T) {
	notDone := func() *sqlmock.Rows { return sqlmock.NewRows([]string{"1"}) }
	e := newMockEnv(t, WithRetry(LinearBackoff(time.Millisecond)))
	tok := &tokenArg{}
	e.expectPrepare("once_done")
	e.prepared["once_done"] = &sqlmock.ExpectedPrepare{}
	e.mock.ExpectQuery(e.sql("once_done")).WithArgs("seed").WillReturnError(errReadOnly)
	e.mock.ExpectQuery(e.sql("once_done")).WithArgs("seed").WillReturnRows(notDone())
	e.expectExec("acquire", acquireArgs("seed", mockHolder, onceTTL.Microseconds(), tok), errReply(errReadOnly), okReply(42, 1))
	e.mock.ExpectQuery(e.sql("once_done")).WithArgs("seed").WillReturnError(errReadOnly)
	e.mock.ExpectQuery(e.sql("once_done")).WithArgs("seed").WillReturnRows(notDone())
	e.expectExec("once_record", []driver.Value{"seed", tok}, okReply(1, 1))
	e.expectExec("release", releaseArgs("seed", tok), okReply(0, 1))
	ran, err := e.c.Once(t.Context(), "seed", noop)
	if !ran || err != nil {
		t.Fatalf("Once: got %v, %v, want true, nil", ran, err)
	}
	e.done()
}

// A renewal that fails with a final error (the table is gone) ends the
// keep-alive at once: no renewal can succeed before the deadline.
func TestLock_KeepAlive_finalErrorIsLoss(t *testing.T) {
	t.Parallel() // waits a third of a 3 s lease
	e := newMockEnv(t)
	tok := &tokenArg{}
	e.expectExec("acquire", acquireArgs("job", mockHolder, 3_000_000, tok), okReply(42, 1))
	e.expectExec("refresh", refreshArgs(3_000_000, "job", tok), errReply(errNoSuchTable))
	l, err := e.c.TryAcquire(t.Context(), "job", 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	kctx := l.KeepAlive(t.Context())
	<-kctx.Done()
	if left := time.Until(l.ValidUntil()); left < time.Second {
		t.Errorf("told %v before the lease could expire, want about two thirds of the ttl", left)
	}
	assertErrIs(t, context.Cause(kctx), ErrLockLost, errNoSuchTable)
	e.done()
}

// A token whose acquire's outcome stayed unknown, and whose cleanup failed,
// is remembered: the next acquire of the name deletes its lease first, and
// forgets it once that DELETE removed the lease, when the acquire had one
// send that may have committed (its resend was refused).
func TestClient_TryAcquire_claimsUnknownAcquire_args(t *testing.T) {
	e := newMockEnv(t)
	lost := &tokenArg{}
	e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, lost),
		errReply(errors.New("invalid connection")), errReply(errReadOnly))
	e.expectExec("release", releaseArgs("job", lost), errReply(&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}))
	if _, err := e.c.TryAcquire(t.Context(), "job", time.Second); err == nil {
		t.Fatalf("TryAcquire: got nil, want an error")
	}
	if n := e.c.orphans.Count("job"); n != 1 {
		t.Fatalf("tokens remembered: got %d, want 1", n)
	}
	e.expectExec("release", releaseArgs("job", lost), okReply(0, 1))
	e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, &tokenArg{}), okReply(9, 1))
	if _, err := e.c.TryAcquire(t.Context(), "job", time.Second); err != nil {
		t.Fatalf("TryAcquire: got %v, want nil", err)
	}
	if n := e.c.orphans.Count("job"); n != 0 {
		t.Errorf("tokens remembered after the claim: got %d, want 0", n)
	}
	// Other names, and later acquires, send nothing more.
	e.expectExec("acquire", acquireArgs("other", mockHolder, 1_000_000, &tokenArg{}), okReply(10, 1))
	if _, err := e.c.TryAcquire(t.Context(), "other", time.Second); err != nil {
		t.Fatalf("TryAcquire: got %v, want nil", err)
	}
	e.done()
}

// An Acquire whose first attempt's outcome stays unknown, and whose cleanup
// fails, retires that token (acquire.go, rule 1): its next attempt deletes
// the lease the token may hold, then acquires under a fresh one. A late
// DELETE by the old token then cannot take the Lock's lease, and no later
// acquire of the name in the Client sends one with the Lock's token.
func TestClient_Acquire_unknownAttemptThenLease_tokenRetired(t *testing.T) {
	e := newMockEnv(t, WithRetry(LinearBackoff(time.Millisecond)))
	old, fresh := &tokenArg{}, &tokenArg{}
	lost := errors.New("invalid connection")
	e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, old), repeatReply(errReply(lost), fault.MaxTransientAttempts)...)
	e.expectExec("release", releaseArgs("job", old), errReply(&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}))
	// The next attempt deletes what the lost one took, then takes the name
	// under a token of its own.
	e.expectExec("release", releaseArgs("job", old), okReply(0, 1))
	e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, fresh), okReply(42, 1))
	l, err := e.c.Acquire(t.Context(), "job", time.Second)
	if err != nil {
		t.Fatalf("Acquire: got %v, want nil", err)
	}
	if l.Token() != fresh.token || fresh.token == old.token {
		t.Errorf("Lock token: got %q, want the fresh %q, not the retired %q", l.Token(), fresh.token, old.token)
	}
	// Four sends were lost: the DELETE removed what one of them wrote, and
	// another may still be in flight. The token stays remembered until no
	// send of it can commit, and each acquire of the name deletes again.
	if n := e.c.orphans.Count("job"); n != 1 {
		t.Errorf("tokens remembered after the DELETE removed the lease of one of four lost sends: got %d, want 1", n)
	}
	// Another acquire of the name sends no DELETE with the Lock's token.
	e.expectExec("release", releaseArgs("job", old), okReply(0, 0))
	e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, &tokenArg{}), okReply(0, 0))
	_, err = e.c.TryAcquire(t.Context(), "job", time.Second)
	assertErrIs(t, err, ErrNotAcquired)
	e.done()
}

// An attempt whose first send was lost and whose resend was refused may
// still take the name later, when the other owner's lease ends: its token is
// remembered whatever the answer (rule 2), and the next acquire of the name
// deletes that lease first.
func TestClient_TryAcquire_lostSendThenRefused_tokenRemembered(t *testing.T) {
	e := newMockEnv(t)
	old := &tokenArg{}
	lost := errors.New("invalid connection")
	e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, old), errReply(lost), okReply(0, 0))
	_, err := e.c.TryAcquire(t.Context(), "job", time.Second)
	assertErrIs(t, err, ErrNotAcquired)
	if n := e.c.orphans.Count("job"); n != 1 {
		t.Fatalf("tokens remembered after a lost send and a refusal: got %d, want 1", n)
	}
	e.expectExec("release", releaseArgs("job", old), okReply(0, 0))
	e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, &tokenArg{}), okReply(43, 1))
	if _, err := e.c.TryAcquire(t.Context(), "job", time.Second); err != nil {
		t.Fatalf("TryAcquire: got %v, want nil", err)
	}
	e.done()
}

// Each error the server gives here is classified as the loops need: final
// ones end them, the others are retried or waited out.
func TestClassify_realServerErrors(t *testing.T) {
	if os.Getenv(ownServerEnv) != "" {
		soleServer(t, "makes the server read-only and full under "+ownServerEnv)
	}
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		cases := []classifyCase{
			{"no server listening", func(t *testing.T, e *testEnv) error {
				db := e.openDBWith(t, func(c *mysql.Config) { c.Addr = closedAddr(t) })
				_, err := e.client(t, db, "sqllock").TryAcquire(testCtx(t), "job", time.Second)
				return err
			}, fault.Refused},
			{"read-only transaction", func(t *testing.T, e *testEnv) error {
				if e.server.TiDB {
					t.Skip("TiDB has no read-only transactions: transaction_read_only is a no-op function it refuses (1235)")
				}
				skipOnVitess(t, e, vitessNoReadOnly)
				v := "transaction_read_only"
				if e.server.MariaDB {
					v = "tx_read_only" // MariaDB 10.11's name
				}
				table := e.newTable(t)
				db := e.openDBWith(t, func(c *mysql.Config) { setParam(c, v, "1") })
				_, err := e.client(t, db, table).TryAcquire(testCtx(t), "job", time.Second)
				return wantErrno(t, err, 1792)
			}, fault.Refused},
			{"no such table", func(t *testing.T, e *testEnv) error {
				_, err := e.client(t, e.db, "sqllock_no_such_table").TryAcquire(testCtx(t), "job", time.Second)
				return wantErrno(t, err, e.noSuchTable())
			}, fault.Final},
			{"access denied", func(t *testing.T, e *testEnv) error {
				skipOnVitess(t, e, vitessNoAuth)
				db := e.openDBWith(t, func(c *mysql.Config) { c.User, c.Passwd = "sqllock_no_such_user", "wrong" })
				_, err := e.client(t, db, "sqllock").TryAcquire(testCtx(t), "job", time.Second)
				return wantErrno(t, err, 1045)
			}, fault.Final},
			{"statement time limit", statementTimeLimit, fault.RolledBack},
			{"connection killed while a statement runs", func(t *testing.T, e *testEnv) error {
				skipOnVitess(t, e, vitessNoKill)
				ctx := testCtx(t)
				conn, err := e.db.Conn(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close()
				var id int64
				if err := conn.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id); err != nil {
					t.Fatal(err)
				}
				time.AfterFunc(200*time.Millisecond, func() {
					_, _ = e.openDB(t).Exec(fmt.Sprintf("KILL CONNECTION %d", id))
				})
				var n int
				return conn.QueryRowContext(ctx, "SELECT SLEEP(10)").Scan(&n)
			}, fault.Unknown},
			{"idle session closed by the server", func(t *testing.T, e *testEnv) error {
				skipOnVitess(t, e, vitessNoIdleKill)
				ctx := testCtx(t)
				conn, err := e.db.Conn(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close()
				if _, err := conn.ExecContext(ctx, "SET SESSION wait_timeout = 1"); err != nil {
					t.Fatal(err)
				}
				time.Sleep(2500 * time.Millisecond)
				_, err = conn.ExecContext(ctx, "DO 1")
				return err
			}, fault.Unknown},
		}
		if os.Getenv(ownServerEnv) != "" {
			cases = append(cases, ownServerCases...)
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				err := tc.err(t, e)
				if err == nil {
					t.Fatalf("got no error, want one")
				}
				t.Logf("%s gave: %v", e.server.Label, err)
				if got := classify(err); got != tc.want {
					t.Errorf("classify(%v): got %s, want %s", err, outcomeNames[got], outcomeNames[tc.want])
				}
			})
		}
	})
}
