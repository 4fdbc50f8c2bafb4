package sqllock

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
)

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

// (d) Eight callers on four Clients: fn succeeds once; a failure hands the
// run to another caller; later calls run nothing.
func TestClient_Once(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		cs := make([]*Client, 4)
		for i := range cs {
			cs[i] = e.client(t, e.openDB(t), table, WithRetry(LinearBackoff(10*time.Millisecond)))
		}
		ctx := testCtx(t)
		for _, failFirst := range []bool{false, true} {
			name := "seed"
			if failFirst {
				name = "seed-after-failure"
			}
			var runs, running, overlap atomic.Int32
			boom := errors.New("boom")
			fn := func(ctx context.Context, _ *Lock) error {
				if running.Add(1) > 1 {
					overlap.Add(1)
				}
				defer running.Add(-1)
				n := runs.Add(1)
				time.Sleep(50 * time.Millisecond)
				if failFirst && n == 1 {
					return boom
				}
				return nil
			}
			type result struct {
				ran bool
				err error
			}
			results := make(chan result, 8)
			var wg sync.WaitGroup
			for i := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ran, err := cs[i%len(cs)].Once(ctx, name, fn)
					results <- result{ran, err}
				}()
			}
			wg.Wait()
			close(results)
			var ranOK, ranFailed int
			for r := range results {
				switch {
				case r.ran && r.err == nil:
					ranOK++
				case r.ran && errors.Is(r.err, boom):
					ranFailed++
				case !r.ran && r.err == nil:
				default:
					t.Fatalf("%s: Once returned %v, %v", name, r.ran, r.err)
				}
			}
			wantFailed := 0
			if failFirst {
				wantFailed = 1
			}
			if ranOK != 1 || ranFailed != wantFailed || int(runs.Load()) != 1+wantFailed || overlap.Load() != 0 {
				t.Fatalf("%s: got %d successful and %d failed runs (fn called %d times, %d overlapping), want 1 and %d",
					name, ranOK, ranFailed, runs.Load(), overlap.Load(), wantFailed)
			}
			if ran, err := cs[0].Once(ctx, name, fn); ran || err != nil || runs.Load() != int32(1+wantFailed) {
				t.Fatalf("%s: Once after success: got %v, %v, want false, nil and no run", name, ran, err)
			}
		}
	})
}

// A runner that died (its lease left to expire) is taken over.
func TestClient_Once_runnerDied(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		a, b := e.twoClients(t)
		ctx := testCtx(t)
		dead := mustAcquire(t, a, "init", 200*time.Millisecond) // never released
		ran, err := b.Once(ctx, "init", func(_ context.Context, _ *Lock) error { return nil })
		if !ran || err != nil {
			t.Fatalf("Once after a dead runner: got %v, %v, want true, nil", ran, err)
		}
		wantErrIs(t, dead.Release(ctx), ErrNotHeld)
		if ran, err := a.Once(ctx, "init", func(_ context.Context, _ *Lock) error { return errors.New("ran twice") }); ran || err != nil {
			t.Fatalf("Once after success: got %v, %v, want false, nil", ran, err)
		}
	})
}

// Once writes its record only while the lease row is its own, at every
// isolation level: under READ COMMITTED a plain read of the lease row inside
// the record's INSERT ... SELECT takes no lock. Here the record's write
// waits (on a lock of the record's key, held by another session) after the
// lease lapsed, and another Client comes to take the name over: whatever the
// order, fn runs once and one call reports it.
func TestClient_Once_recordOnlyWhileLeaseHeld(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		if e.variant.isolation != "" {
			t.Skip("each isolation level is a subtest of every other variant")
		}
		for _, level := range isolationLevels {
			t.Run(level, func(t *testing.T) { onceRecordRace(t, e, level) })
		}
	})
}

// A record written already (an earlier attempt whose reply was lost) counts
// as written; a lease that is not ours writes none.
func TestClient_Once_recordRetried(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		a, b := e.twoClients(t)
		ctx := testCtx(t)
		l := mustAcquire(t, a, "job", time.Minute)
		for i := range 2 {
			if err := l.recordOnce(ctx); err != nil {
				t.Fatalf("record, attempt %d: got %v, want nil", i+1, err)
			}
		}
		if ran, err := b.Once(ctx, "job", func(_ context.Context, _ *Lock) error { return errors.New("ran again") }); ran || err != nil {
			t.Fatalf("Once after the record: got %v, %v, want false, nil", ran, err)
		}

		lost := mustAcquire(t, a, "lost", 20*time.Millisecond)
		time.Sleep(40 * time.Millisecond)
		mustAcquire(t, b, "lost", time.Minute)
		wantErrIs(t, lost.recordOnce(ctx), ErrLockLost)
		if done, err := b.onceDone(ctx, "lost"); done || err != nil {
			t.Fatalf("record of a lost lease: got %v, %v, want none", done, err)
		}
	})
}

func TestClient_Once_args(t *testing.T) {
	done := func() *sqlmock.Rows { return sqlmock.NewRows([]string{"1"}).AddRow(1) }
	notDone := func() *sqlmock.Rows { return sqlmock.NewRows([]string{"1"}) }
	// acquired expects a call that finds no record and takes the lease.
	acquired := func(e *mockEnv, tok *tokenArg) {
		e.expectQuery("once_done", []driver.Value{"seed"}, notDone())
		e.expectExec("acquire", acquireArgs("seed", mockHolder, onceTTL.Microseconds(), tok), okReply(42, 1))
	}
	boom := errors.New("boom")
	tests := []struct {
		name    string
		expect  func(e *mockEnv, tok *tokenArg)
		fnErr   error
		wantRan bool
		wantErr []error
	}{
		{"runs and records", func(e *mockEnv, tok *tokenArg) {
			acquired(e, tok)
			e.expectQuery("once_done", []driver.Value{"seed"}, notDone())
			e.expectExec("once_record", []driver.Value{"seed", tok}, okReply(1, 1))
			e.expectExec("release", releaseArgs("seed", tok), okReply(0, 1))
		}, nil, true, nil},
		{"done before", func(e *mockEnv, tok *tokenArg) {
			e.expectQuery("once_done", []driver.Value{"seed"}, done())
		}, nil, false, nil},
		{"done while waiting", func(e *mockEnv, tok *tokenArg) {
			acquired(e, tok)
			e.expectQuery("once_done", []driver.Value{"seed"}, done())
			e.expectExec("release", releaseArgs("seed", tok), okReply(0, 1))
		}, nil, false, nil},
		{"fn fails: no record", func(e *mockEnv, tok *tokenArg) {
			acquired(e, tok)
			e.expectQuery("once_done", []driver.Value{"seed"}, notDone())
			e.expectExec("release", releaseArgs("seed", tok), okReply(0, 1))
		}, boom, true, []error{boom}},
		{"taken over: record refused", func(e *mockEnv, tok *tokenArg) {
			acquired(e, tok)
			e.expectQuery("once_done", []driver.Value{"seed"}, notDone())
			e.expectExec("once_record", []driver.Value{"seed", tok}, okReply(0, 1))
			e.expectExec("release", releaseArgs("seed", tok), okReply(0, 0))
		}, nil, true, []error{ErrLockLost, ErrNotHeld}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newMockEnv(t)
			tt.expect(e, &tokenArg{})
			ran, err := e.c.Once(t.Context(), "seed", func(_ context.Context, _ *Lock) error { return tt.fnErr })
			if ran != tt.wantRan {
				t.Errorf("ran: got %v, want %v", ran, tt.wantRan)
			}
			if tt.wantErr == nil && err != nil {
				t.Errorf("err: got %v, want nil", err)
			}
			assertErrIs(t, err, tt.wantErr...)
			e.done()
		})
	}
}

// waitForStatements waits until n statements that mention table are running
// on other sessions, stably: that many are waiting for a row lock. (On
// MariaDB an acquire starts with SET STATEMENT: queries.sql, lock_wait_mariadb.
// Through Vitess the server runs vttablet's rewriting, which does not quote
// the table's name; vttestserver's one mysqld serves every shard.)
func waitForStatements(t *testing.T, db *sql.DB, table string, n int) {
	t.Helper()
	ctx := testCtx(t)
	stable := 0
	waitFor(t, 30*time.Second, fmt.Sprintf("%d statements on %s waiting", n, table), func() bool {
		var got int
		err := scanProcesslist(ctx, db, "SELECT COUNT(*) FROM information_schema.PROCESSLIST "+
			"WHERE ID <> CONNECTION_ID() AND INFO LIKE CONCAT('%INSERT %INTO %', ?, '%')", []any{table}, &got)
		if err != nil {
			t.Fatal(err)
		}
		if got >= n {
			stable++
		} else {
			stable = 0
		}
		time.Sleep(50 * time.Millisecond)
		return stable >= 3
	})
}

// onceRecordRace runs TestClient_Once_recordOnlyWhileLeaseHeld's race with
// both Clients' sessions at level.
func onceRecordRace(t *testing.T, e *testEnv, level string) {
	table := e.newTable(t)
	a := e.client(t, e.isolated(t, level), table, WithHolder("a"))
	b := e.client(t, e.isolated(t, level), table, WithHolder("b"),
		WithRetry(LinearBackoff(10*time.Millisecond)))
	ctx := testCtx(t)
	// Each Client's first use (its proofs, the first kind's proof of Once)
	// is made before the race: a proof's statement on the table counted
	// below as a Once waiting would let the blocker go too early.
	for _, c := range []*Client{a, b} {
		if _, err := c.Once(ctx, "warm", func(context.Context, *Lock) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}

	// Another session holds the lock of the record's key until rollback (in
	// a pessimistic transaction on TiDB, whose optimistic ones lock nothing
	// before commit).
	blocker, err := e.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Close()
	begin := "START TRANSACTION" // BEGIN opens a block under MariaDB's sql_mode=ORACLE
	if e.server.TiDB {
		begin = "BEGIN PESSIMISTIC"
	}
	if _, err := blocker.ExecContext(ctx, begin); err != nil {
		t.Fatal(err)
	}
	defer blocker.ExecContext(context.WithoutCancel(ctx), "ROLLBACK")
	if _, err := blocker.ExecContext(ctx, "INSERT INTO `"+table+"` (name, kind, owner, holder, fence, acquired_at, expires_at) VALUES ('job', 'D', 'x', 'blocker', 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))"); err != nil {
		t.Fatal(err)
	}

	var runs atomic.Int32
	type result struct {
		who string
		ran bool
		err error
	}
	results := make(chan result, 2)
	go func() {
		ran, err := a.Once(ctx, "job", func(ctx context.Context, _ *Lock) error {
			runs.Add(1)
			// The lease lapses, as if this process had stalled.
			_, err := e.db.ExecContext(ctx, "UPDATE `"+table+"` SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE name = 'job' AND kind = 'L'")
			return err
		})
		results <- result{"a", ran, err}
	}()
	waitForStatements(t, e.db, table, 1) // a's record waits
	go func() {
		ran, err := b.Once(ctx, "job", func(_ context.Context, _ *Lock) error {
			runs.Add(1)
			return nil
		})
		results <- result{"b", ran, err}
	}()
	// b waits too: for the lease row, or for the record's key.
	waitForStatements(t, e.db, table, 2)
	if _, err := blocker.ExecContext(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	reported, ran := 0, 0
	for range 2 {
		r := <-results
		if r.ran {
			ran++
		}
		if r.ran && r.err == nil {
			reported++
		} else if r.ran && !errors.Is(r.err, ErrLockLost) || !r.ran && r.err != nil {
			t.Errorf("%s: Once returned %v, %v", r.who, r.ran, r.err)
		}
	}
	// MySQL and MariaDB lock the lease row when the record's statement reads
	// it, so the takeover waits, finds the record and does not run fn. TiDB
	// locks nothing before commit: the takeover goes ahead and runs fn, and
	// the first record's commit must then fail, so that its call reports the
	// lost lease (ErrLockLost) rather than a second success. On TiDB the
	// first record may also commit before the takeover's Once reads the
	// records (the blocker's rollback lets both go at once): then the
	// takeover finds it and runs nothing. Either way one call reports the
	// run and one record is written.
	wantRuns := []int{1}
	if e.server.TiDB {
		wantRuns = []int{1, 2}
	}
	if reported != 1 || runs.Load() != int32(ran) || !slices.Contains(wantRuns, ran) {
		t.Fatalf("got %d calls reporting a run, %d saying fn ran, and fn run %d times, want 1, and %v for both", reported, ran, runs.Load(), wantRuns)
	}
	var owners int
	if err := e.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+table+"` WHERE name = 'job' AND kind = 'D'").Scan(&owners); err != nil || owners != 1 {
		t.Fatalf("got %d records, %v, want 1", owners, err)
	}
}
