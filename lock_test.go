package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock/internal/engine"
	"github.com/sqllock/sqllock/internal/fault"
	"github.com/sqllock/sqllock/observe"
)

// Point 3: Refresh extends from the server's now, only while the lease is
// ours and live, and never shortens it.
func TestLock_Refresh(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		a, b := e.twoClients(t)
		ctx := testCtx(t)

		l := mustAcquire(t, a, "r", 2*time.Second)
		if err := l.Refresh(ctx, time.Hour); err != nil {
			t.Fatalf("Refresh: %v", err)
		}
		if got := inspect(t, a, "r"); got.TTL < 59*time.Minute || got.TTL > time.Hour || got.Fence != l.Fence() {
			t.Fatalf("after Refresh(1h): got %+v, want TTL just under 1h and the same fence", got)
		}
		if d := time.Until(l.ValidUntil()); d < 59*time.Minute || d > time.Hour {
			t.Fatalf("ValidUntil is %v away, want just under 1h", d)
		}
		// A refresh never shortens the lease: the later expiry stays.
		if err := l.Refresh(ctx, 40*time.Millisecond); err != nil {
			t.Fatalf("Refresh: %v", err)
		}
		if got := inspect(t, a, "r"); got.TTL < 59*time.Minute {
			t.Fatalf("after Refresh(40ms): got %+v, want the hour kept", got)
		}
		if d := time.Until(l.ValidUntil()); d < 59*time.Minute {
			t.Fatalf("ValidUntil after Refresh(40ms) is %v away, want the hour kept", d)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		l = mustAcquire(t, a, "r", 40*time.Millisecond)
		time.Sleep(80 * time.Millisecond)
		wantErrIs(t, l.Refresh(ctx, time.Second), ErrNotHeld)

		// Expired and taken over: the new owner's lease is untouched.
		lb := mustAcquire(t, b, "r", 10*time.Second)
		wantErrIs(t, l.Refresh(ctx, time.Second), ErrNotHeld)
		if got := inspect(t, b, "r"); got.Fence != lb.Fence() || got.TTL < 9*time.Second {
			t.Fatalf("got %+v, want b's lease as it was", got)
		}
	})
}

// Point 3, second half: an error that is not loss is not reported as loss.
func TestLock_Refresh_networkErrorIsNotLoss(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		p := startProxy(t, e.serverAddr(t))
		db := e.openDBWith(t, func(c *mysql.Config) { c.Addr = p.Addr() })
		c := e.client(t, db, table)
		l := mustAcquire(t, c, "net", 10*time.Second)

		p.Stall(true)
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := l.Refresh(ctx, 10*time.Second)
		cancel()
		p.Stall(false)
		if err == nil || errors.Is(err, ErrNotHeld) {
			t.Fatalf("Refresh through a stalled network: got %v, want an error that is not ErrNotHeld", err)
		}
		p.CutAll()
		if err := l.Refresh(testCtx(t), 10*time.Second); err != nil {
			t.Fatalf("Refresh after the network healed: %v", err)
		}
	})
}

// Point 4: Release deletes only our own row.
func TestLock_Release(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		a, b := e.twoClients(t)
		ctx := testCtx(t)

		l := mustAcquire(t, a, "x", 10*time.Second)
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
		if got := inspect(t, a, "x"); got.Held || got.Holder != "" || got.Fence != l.Fence() {
			t.Fatalf("after Release: got %+v, want the lease gone and fence %d kept", got, l.Fence())
		}
		wantErrIs(t, l.Release(ctx), ErrNotHeld)
		mustAcquire(t, b, "x", 10*time.Second)

		// Expired, taken over: release is refused and b's lease stays.
		old := mustAcquire(t, a, "y", 30*time.Millisecond)
		time.Sleep(60 * time.Millisecond)
		lb := mustAcquire(t, b, "y", 10*time.Second)
		wantErrIs(t, old.Release(ctx), ErrNotHeld)
		if got := inspect(t, b, "y"); !got.Held || got.Fence != lb.Fence() {
			t.Fatalf("got %+v, want b's lease kept", got)
		}

		// Expired, nobody took it: nobody held the name in between.
		lapsed := mustAcquire(t, a, "z", 30*time.Millisecond)
		time.Sleep(60 * time.Millisecond)
		if err := lapsed.Release(ctx); err != nil {
			t.Fatalf("Release of an expired, untaken lease: %v", err)
		}
		if got := inspect(t, a, "z"); got.Held || got.Holder != "" || got.Fence != lapsed.Fence() {
			t.Fatalf("got %+v, want the lease gone", got)
		}
	})
}

// Point 5: fences grow strictly with every new holder: takeover, release and
// re-acquire; a refresh keeps the fence.
func TestLock_Fence_order(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		a, b := e.twoClients(t)
		ctx := testCtx(t)

		var fences []uint64
		for i := range 6 {
			c := a
			if i%2 == 1 {
				c = b
			}
			ttl := 10 * time.Second
			if i%3 == 2 {
				ttl = 300 * time.Millisecond // to lapse: no Refresh shortens a lease
			}
			l := mustAcquire(t, c, "f", ttl)
			fences = append(fences, l.Fence())
			if err := l.Refresh(ctx, ttl); err != nil {
				t.Fatal(err)
			}
			if got := inspect(t, c, "f"); got.Fence != l.Fence() {
				t.Fatalf("after Refresh: got fence %d, want %d", got.Fence, l.Fence())
			}
			if i%3 == 2 {
				// Let it lapse: the next holder takes it over.
				time.Sleep(ttl + 100*time.Millisecond)
				continue
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		for i := 1; i < len(fences); i++ {
			if fences[i] <= fences[i-1] {
				t.Fatalf("fences %v: got %d after %d, want strictly increasing", fences, fences[i], fences[i-1])
			}
		}
	})
}

// Point 5, the part that needs no clock: a takeover moves the fence past the
// old one even when the old one is far ahead of the server's clock.
func TestLock_Fence_takeoverPassesFutureFence(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		c := e.client(t, e.db, table)
		ctx := testCtx(t)
		mustAcquire(t, c, "g", 10*time.Second)
		const future = uint64(1) << 60
		if _, err := e.db.ExecContext(ctx, "UPDATE `"+table+"` SET fence = IF(kind = '"+e.fenceKind()+"', ?, 0), expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE name = 'g'", future); err != nil {
			t.Fatal(err)
		}
		l := mustAcquire(t, c, "g", 10*time.Second)
		if l.Fence() != future+1 {
			t.Fatalf("got fence %d, want %d", l.Fence(), future+1)
		}
	})
}

// On TiDB fences end at 2^63-2, where its LAST_INSERT_ID(expr) ends less
// one for the refresh: a lease with that fence is acquired, refreshed and
// released, and the acquire after it fails and holds nothing, under every
// DSN, including a lenient sql_mode that would report a smaller fence.
func TestLock_Fence_TiDBLimit(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		if !e.server.TiDB {
			t.Skipf("%s is %s: the limit is TiDB's; elsewhere fences go to 2^64-1 (TestLock_Fence_beyondInt64)", e.server.Label, e.server.Version)
		}
		a, b := e.twoClients(t)
		table := a.table[1 : len(a.table)-1]
		ctx := testCtx(t)
		mustAcquire(t, a, "edge", time.Minute)
		if _, err := e.db.ExecContext(ctx, "UPDATE `"+table+"` SET fence = ?, expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE name = 'edge'", uint64(engine.MaxTiDBFence-1)); err != nil {
			t.Fatal(err)
		}
		l := mustAcquire(t, b, "edge", time.Minute)
		if l.Fence() != engine.MaxTiDBFence {
			t.Fatalf("got fence %d, want %d", l.Fence(), uint64(engine.MaxTiDBFence))
		}
		if err := l.Refresh(ctx, time.Minute); err != nil {
			t.Fatalf("Refresh: %v", err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
		if _, err := a.TryAcquire(ctx, "edge", time.Minute); err == nil || errors.Is(err, ErrNotAcquired) {
			t.Fatalf("acquire past TiDB's largest fence: got %v, want an error", err)
		}
		if got := inspect(t, b, "edge"); got.Held {
			t.Fatalf("after the failed acquire: got %+v, want the name free", got)
		}
	})
}

// Fences are unsigned 64-bit end to end: a fence at or past 2^63, which the
// driver's insert id carries as a negative int64, is reported as it is, and an
// acquire that cannot go past the largest fence fails and holds nothing.
func TestLock_Fence_beyondInt64(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		if e.server.TiDB {
			t.Skip("TiDB's LAST_INSERT_ID(expr) takes a signed value: its fences end at 2^63-2 (TestLock_Fence_TiDBLimit)")
		}
		a, b := e.twoClients(t)
		table := a.table[1 : len(a.table)-1]
		ctx := testCtx(t)
		setFence := func(name string, fence uint64) {
			t.Helper()
			mustAcquire(t, a, name, time.Minute)
			// The fence goes as text: vtgate turns a bound uint64 past 2^63
			// into a negative INT64.
			if _, err := e.db.ExecContext(ctx, "UPDATE `"+table+"` SET fence = IF(kind = '"+e.fenceKind()+"', "+strconv.FormatUint(fence, 10)+", 0), expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE name = ?", name); err != nil {
				t.Fatal(err)
			}
		}
		const big = uint64(1)<<63 + 5
		setFence("big", big)
		l := mustAcquire(t, b, "big", time.Minute)
		if l.Fence() != big+1 {
			t.Fatalf("got fence %d, want %d", l.Fence(), big+1)
		}
		if got := inspect(t, a, "big"); !got.Held || got.Holder != "b" || got.Fence != big+1 {
			t.Fatalf("Inspect: got %+v, want b holding fence %d", got, big+1)
		}
		infos, err := a.List(ctx)
		if err != nil || len(infos) != 1 || infos[0].Fence != big+1 {
			t.Fatalf("List: got %+v, %v, want one lease with fence %d", infos, err, big+1)
		}
		_, err = a.TryAcquire(ctx, "big", time.Minute)
		wantErrIs(t, err, ErrNotAcquired)
		if got := inspect(t, a, "big"); !got.Held || got.Holder != "b" || got.Fence != big+1 {
			t.Fatalf("after a refused acquire: got %+v, want b's lease untouched", got)
		}
		if err := l.Refresh(ctx, time.Minute); err != nil {
			t.Fatalf("Refresh: %v", err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}

		// No fence comes after the largest: the acquire fails and holds nothing.
		setFence("last", math.MaxUint64)
		if _, err := b.TryAcquire(ctx, "last", time.Minute); err == nil || errors.Is(err, ErrNotAcquired) {
			t.Fatalf("acquire past the largest fence: got %v, want a server error", err)
		}
		if got := inspect(t, a, "last"); got.Held || got.Fence != math.MaxUint64 {
			t.Fatalf("after the failed acquire: got %+v, want no live lease and fence %d", got, uint64(math.MaxUint64))
		}
	})
}

// A Refresh for less than the lease has left keeps the lease as it is, and
// ValidUntil with it.
// A refresh that waits over a second for its row, here behind the holder's
// own Lock.Check transaction, fails the session guard's clock test when it
// runs at last (NOW(6) is the statement's start, SYSDATE(6) a second
// later), as a statement a starved server started late does. It wrote
// nothing: it is sent again at once, finds the row free, and Refresh
// succeeds. (Before, the refresh failed, and a TryAcquire would have.)
func TestLock_Refresh_waitedPastASecond(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipFakeFor(t, e, "it needs the server's row locks and reads the processlist")
		if e.server.TiDB {
			t.Skip("TiDB's autocommit statements do not wait for a row another transaction locked")
		}
		var clockRefusals atomic.Int32
		table := e.newTable(t)
		c := e.client(t, e.db, table, WithObserver(observe.Observer{Retried: func(ev observe.RetryEvent) {
			t.Logf("sent again: %s: %v", ev.Statement, ev.Err)
			if fault.ClockGuard(ev.Err) {
				clockRefusals.Add(1)
			}
		}}))
		ctx := testCtx(t)
		l := mustAcquire(t, c, "late", time.Minute)
		before := l.ValidUntil()
		tx := checkedTx(t, c, l)
		refreshed := make(chan error, 1)
		go func() { refreshed <- l.Refresh(ctx, 2*time.Minute) }()

		// Once the refresh waits for the row, a second and more.
		other := e.openDB(t)
		waitFor(t, 20*time.Second, "the refresh to wait for its row", func() bool {
			var n int
			if err := scanProcesslist(ctx, other, "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE 'UPDATE %' AND INFO LIKE ? AND ID <> CONNECTION_ID()", []any{"%" + table + "%"}, &n); err != nil {
				t.Fatal(err)
			}
			return n > 0
		})
		time.Sleep(1200 * time.Millisecond)
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
		if err := <-refreshed; err != nil {
			t.Fatalf("Refresh after a wait of over a second: got %v, want nil", err)
		}
		if n := clockRefusals.Load(); n < 1 {
			t.Fatalf("the refresh met the clock test %d times, want at least once: the test did not make it wait long enough", n)
		}
		if !l.ValidUntil().After(before) {
			t.Fatalf("ValidUntil: got %v, want after %v", l.ValidUntil(), before)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

func TestLock_Refresh_shorterKeepsTheLease(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		c := e.newClient(t)
		l := mustAcquire(t, c, "s", time.Minute)
		until := l.ValidUntil()
		if err := l.Refresh(testCtx(t), time.Second); err != nil {
			t.Fatalf("Refresh(1s): %v", err)
		}
		if got := l.ValidUntil(); got.Before(until) {
			t.Fatalf("ValidUntil after Refresh(1s): %v ahead, want %v ahead or later", time.Until(got), time.Until(until))
		}
		if got := inspect(t, c, "s"); got.TTL < 50*time.Second {
			t.Fatalf("lease after Refresh(1s): got %v left, want the minute kept", got.TTL)
		}
		l.Release(testCtx(t))
	})
}

// Check in a transaction: a takeover of the expired lease waits until the
// transaction commits.
func TestLock_Check_takeoverWaitsForCommit(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		a, b := e.twoClients(t)
		// b would end the transaction once the lease has been over for
		// frozenAfter (internal/engine/frozen.go; frozen_test.go tests
		// that): here its watch never starts, and the takeover waits for
		// the commit, however long the machine takes.
		b.eng.SetFrozenLook(time.Hour)
		ctx := testCtx(t)
		type result struct {
			l   *Lock
			err error
			at  time.Time
		}
		var (
			l  *Lock
			tx *sql.Tx
			r  result
		)
		const tries = 5
		// late reports whether r is MariaDB's answer to an acquire that
		// waited out its second behind the row (queries.sql,
		// lock_wait_mariadb; only a wait ends in 1205) before a loaded
		// machine or server had committed, which a later try may redo.
		// The client may read that answer after the commit has returned.
		late := func(r result, try int) bool {
			n, _ := fault.Errno(r.err)
			return e.server.MariaDB && n == fault.LockWaitTimeout && errors.Is(r.err, ErrNotAcquired) && try < tries-1
		}
		for try := 0; ; try++ {
			name := fmt.Sprintf("rows-%d", try)
			// Long enough that Check comes before the lapse on a loaded machine.
			l = mustAcquire(t, a, name, time.Second)
			tx = checkedTx(t, a, l)
			// The lease has expired by the server's clock, which decides the
			// takeover: ValidUntil is the client's earlier bound, and a loaded
			// machine can leave the row live past it by a slow round trip.
			time.Sleep(time.Until(l.ValidUntil()))
			waitServerExpired(t, a, name)

			took := make(chan result, 1)
			go func() {
				l, err := b.TryAcquire(ctx, name, time.Minute)
				took <- result{l, err, time.Now()}
			}()
			if e.variant.name == "optimistic" {
				// TiDB's optimistic transactions lock nothing before commit:
				// the takeover goes ahead, and the commit fails instead.
				r := <-took
				if r.err != nil {
					t.Fatalf("takeover: %v", r.err)
				}
				err := tx.Commit()
				if n, _ := fault.Errno(err); n != fault.TiDBWriteConflict {
					t.Fatalf("Commit after a takeover, optimistic: got %v, want TiDB's write conflict (9007)", err)
				}
				return
			}
			select {
			case r := <-took:
				if late(r, try) {
					// On MariaDB the acquire waits a second at most
					// (queries.sql, lock_wait_mariadb), and reports the
					// name held: a machine that stalled the test half a
					// second past its wait proves nothing. Again, on a
					// name of its own.
					t.Logf("try %d: the takeover's wait ran out before the commit on a loaded machine: %v", try, r.err)
					tx.Rollback()
					continue
				}
				t.Fatalf("takeover returned before the commit: %v, %v", r.l, r.err)
			case <-time.After(500 * time.Millisecond):
			}
			committed := time.Now()
			if err := tx.Commit(); err != nil {
				t.Fatalf("Commit: %v", err)
			}
			r = <-took
			if late(r, try) {
				t.Logf("try %d: the takeover's wait ran out as the commit came on a loaded machine: %v", try, r.err)
				continue
			}
			if r.err != nil {
				t.Fatalf("takeover after the commit: %v", r.err)
			}
			if r.at.Before(committed) {
				t.Fatalf("takeover returned at %v, before the commit at %v", r.at, committed)
			}
			break
		}

		// Now the lease is b's: a's Check fails, and b's holds.
		tx2, err := a.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx2.Rollback()
		wantErrIs(t, l.Check(ctx, tx2), ErrNotHeld)
		// tx2 is on a's *sql.DB, not b's: any one on the same database does.
		if err := r.l.Check(ctx, tx2); err != nil {
			t.Fatalf("Check by the new holder: %v", err)
		}
		// The row lock holds up b's own release too, until tx2 ends.
		tx2.Rollback()
		if err := r.l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// Check writes the lease row in the caller's transaction, at every isolation
// level: a written row is what a multi-writer cluster certifies at commit,
// where a shared lock would be local to one node. Its answer does not change
// with the DSN, and a second Check in the same transaction answers the same.
func TestLock_Check_writesLeaseRow(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		for _, level := range isolationLevels {
			t.Run(level, func(t *testing.T) {
				db := e.isolated(t, level)
				c := e.client(t, db, table)
				ctx := testCtx(t)
				l := mustAcquire(t, c, level, time.Minute)
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback()
				// The write flips the lowest bit of acquired_at's microseconds,
				// and the transaction sees its own write.
				micro := func() int {
					t.Helper()
					var us int
					err := tx.QueryRowContext(ctx, "SELECT MICROSECOND(acquired_at) FROM `"+table+"` WHERE name = ? AND kind = 'L'", level).Scan(&us)
					if err != nil {
						t.Fatal(err)
					}
					return us
				}
				before := micro()
				for i, want := range []int{before ^ 1, before} {
					if err := l.Check(ctx, tx); err != nil {
						t.Fatalf("Check %d: got %v, want nil", i+1, err)
					}
					if got := micro(); got != want {
						t.Fatalf("after Check %d: got acquired_at's microseconds %d, want %d (written by the transaction)", i+1, got, want)
					}
				}
				if err := tx.Commit(); err != nil {
					t.Fatal(err)
				}
				if got := inspect(t, c, level); !got.Held || got.Fence != l.Fence() {
					t.Fatalf("after Check: got %+v, want the lease unchanged", got)
				}

				// Expired, and then taken over: not held. (A Check that finds
				// nothing may still lock the row it read, until the rollback.)
				short := mustAcquire(t, c, level+"-short", 20*time.Millisecond)
				time.Sleep(40 * time.Millisecond)
				for _, takeover := range []bool{false, true} {
					if takeover {
						mustAcquire(t, c, level+"-short", time.Minute)
					}
					tx, err := db.BeginTx(ctx, nil)
					if err != nil {
						t.Fatal(err)
					}
					wantErrIs(t, short.Check(ctx, tx), ErrNotHeld)
					if err := tx.Rollback(); err != nil {
						t.Fatal(err)
					}
				}
			})
		}
	})
}

// Check refuses a released Lock without asking the server.
func TestLock_Check_released(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		c := e.newClient(t)
		ctx := testCtx(t)
		l := mustAcquire(t, c, "n", time.Minute)
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		tx, err := c.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		wantErrIs(t, l.Check(ctx, tx), ErrNotHeld)
	})
}

func TestLock_Check_args(t *testing.T) {
	eachMockTable(t, func(t *testing.T, e *mockEnv) {
		l, tok := e.acquired("job")
		e.mock.ExpectBegin()
		e.mock.ExpectExec(e.sql("check")).WithArgs("job", tok).WillReturnResult(sqlmock.NewResult(0, 1))
		e.mock.ExpectExec(e.sql("check")).WithArgs("job", tok).WillReturnResult(sqlmock.NewResult(0, 0))
		e.mock.ExpectExec(e.sql("check")).WithArgs("job", tok).WillReturnError(errDeadlock)
		e.mock.ExpectRollback()
		tx, err := e.db.BeginTx(t.Context(), nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Check(t.Context(), tx); err != nil {
			t.Errorf("Check, row: got %v, want nil", err)
		}
		assertErrIs(t, l.Check(t.Context(), tx), ErrNotHeld)
		// Inside the user's transaction nothing is retried: it is rolled back.
		err = l.Check(t.Context(), tx)
		assertErrIs(t, err, errDeadlock)
		if errors.Is(err, ErrNotHeld) {
			t.Errorf("Check, deadlock: got %v, want an error that is not ErrNotHeld", err)
		}
		tx.Rollback()
	})
}

// A Refresh that waits for another Refresh of the same Lock, stuck on a dead
// connection, ends with its own context.
func TestLock_Refresh_waitEndsWithItsContext(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		c, p := e.proxiedClient(t, e.newTable(t))
		ctx := testCtx(t)
		l := mustAcquire(t, c, "r", time.Minute)
		if err := l.Refresh(ctx, time.Minute); err != nil {
			t.Fatal(err)
		}
		p.ResetCounts()
		p.Stall(true)
		t.Cleanup(func() { p.Stall(false) })
		go func() { _ = l.Refresh(ctx, time.Minute) }()
		waitCommand(t, p, proxyComStmtExecute)
		short, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		err := within(t, "Refresh", func() error { return l.Refresh(short, time.Minute) })
		wantErrIs(t, err, context.DeadlineExceeded)
	})
}

// Issue 21, point 1. `defer lock.Release(ctx)` runs after the work's context
// has ended: Release must free the name all the same, on every server.
func TestLock_Release_afterContextEnded(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		c := e.client(t, e.db, table)
		witness := e.client(t, e.openDB(t), table)
		t.Run("canceled", func(t *testing.T) {
			ctx, cancel := context.WithCancel(testCtx(t))
			l := mustAcquire(t, c, "canceled", time.Minute)
			cancel()
			if err := l.Release(ctx); err != nil {
				t.Fatalf("Release after the context was canceled: got %v, want nil (the name freed)", err)
			}
			if info := inspect(t, witness, "canceled"); info.Held {
				t.Fatalf("after Release: %+v, want the name free", info)
			}
		})
		t.Run("deadline mid-statement", func(t *testing.T) {
			pc, p := e.proxiedClient(t, table)
			l := mustAcquire(t, pc, "deadline", time.Minute)
			p.Latency(300 * time.Millisecond)
			ctx, cancel := context.WithTimeout(testCtx(t), 100*time.Millisecond)
			defer cancel()
			if err := l.Release(ctx); err != nil {
				t.Fatalf("Release whose deadline ends mid-statement: got %v, want nil (the name freed)", err)
			}
			p.Latency(0)
			if info := inspect(t, witness, "deadline"); info.Held {
				t.Fatalf("after Release: %+v, want the name free", info)
			}
		})
		t.Run("server unreachable", func(t *testing.T) {
			pc, p := e.proxiedClient(t, table)
			l := mustAcquire(t, pc, "unreachable", time.Minute)
			p.Stall(true)
			t.Cleanup(func() { p.Stall(false) })
			ctx, cancel := context.WithCancel(testCtx(t))
			cancel()
			began := time.Now()
			err := l.Release(ctx)
			if took := time.Since(began); took > ReleaseTimeout+2*time.Second {
				t.Errorf("Release against a server that does not answer took %v, want at most ReleaseTimeout (%v) and a little", took, ReleaseTimeout)
			}
			if err == nil || !errors.Is(err, context.Canceled) {
				t.Errorf("Release against a server that does not answer, ctx canceled: got %v, want an error wrapping context.Canceled", err)
			}
		})
	})
}

func TestLock_Refresh_args(t *testing.T) {
	eachMockTable(t, func(t *testing.T, e *mockEnv) {
		l, tok := e.acquired("job")
		e.expectExec("refresh", refreshArgs(1_500_250, "job", tok), okReply(1, 1))
		if err := l.Refresh(t.Context(), 1500*time.Millisecond+250*time.Microsecond); err != nil {
			t.Errorf("Refresh: got %v, want nil", err)
		}
	})
}

func TestLock_Release_args(t *testing.T) {
	eachMockTable(t, func(t *testing.T, e *mockEnv) {
		l, tok := e.acquired("job")
		e.expectExec("release", releaseArgs("job", tok), okReply(0, 1))
		if err := l.Release(t.Context()); err != nil {
			t.Errorf("Release: got %v, want nil", err)
		}
	})
}

func TestLock_Refresh_result(t *testing.T) {
	t.Run("extended", func(t *testing.T) {
		e := newMockEnv(t)
		l, tok := e.acquired("job")
		e.expectExec("refresh", refreshArgs(3_600_000_000, "job", tok), okReply(1, 1))
		before := time.Now()
		if err := l.Refresh(t.Context(), time.Hour); err != nil {
			t.Fatalf("Refresh: got %v, want nil", err)
		}
		after := time.Now()
		if v := l.ValidUntil(); v.Before(before.Add(time.Hour)) || v.After(after.Add(time.Hour)) {
			t.Errorf("ValidUntil: got %v, want between %v and %v", v, before.Add(time.Hour), after.Add(time.Hour))
		}
		e.done()
	})
	for _, rows := range []int64{0, 1} {
		t.Run(fmt.Sprintf("insert id 0, %d rows", rows), func(t *testing.T) {
			e := newMockEnv(t)
			l, tok := e.acquired("job")
			valid := l.ValidUntil()
			e.expectExec("refresh", refreshArgs(3_600_000_000, "job", tok), okReply(0, rows))
			assertErrIs(t, l.Refresh(t.Context(), time.Hour), ErrNotHeld)
			if got := l.ValidUntil(); !got.Equal(valid) {
				t.Errorf("ValidUntil: got %v, want %v (unchanged)", got, valid)
			}
			e.done()
		})
	}
	t.Run("after Release, no SQL", func(t *testing.T) {
		e := newMockEnv(t)
		l, tok := e.acquired("job")
		e.expectExec("release", releaseArgs("job", tok), okReply(0, 1))
		if err := l.Release(t.Context()); err != nil {
			t.Fatalf("Release: got %v, want nil", err)
		}
		assertErrIs(t, l.Refresh(t.Context(), time.Hour), ErrNotHeld)
		e.done()
	})
}

func TestLock_Release_result(t *testing.T) {
	tests := []struct {
		name    string
		rows    int64
		wantErr error
	}{
		{"deleted", 1, nil},
		{"not ours", 0, ErrNotHeld},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newMockEnv(t)
			l, tok := e.acquired("job")
			e.expectExec("release", releaseArgs("job", tok), okReply(0, tt.rows))
			if err := l.Release(t.Context()); !errors.Is(err, tt.wantErr) {
				t.Errorf("Release: got %v, want %v", err, tt.wantErr)
			}
			// The second call sends nothing: the mock expects nothing more.
			err := l.Release(t.Context())
			assertErrIs(t, err, ErrNotHeld)
			assertErrContains(t, err, "already released")
			e.done()
		})
	}
}

// A Release called while another release of the Lock is on its way sends
// nothing: it waits for that one and returns its result (the first waiter
// makes the flight's channel).
func TestLock_Release_waitsForTheOneUnderWay(t *testing.T) {
	e := newMockEnv(t)
	l, tok := e.acquired("job")
	r := okReply(0, 1)
	r.delay = 300 * time.Millisecond
	e.expectExec("release", releaseArgs("job", tok), r)
	first := make(chan error, 1)
	go func() { first <- l.Release(t.Context()) }()
	for {
		l.mu.Lock()
		underWay := l.releaseUnderWay
		l.mu.Unlock()
		if underWay {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if err := l.Release(t.Context()); err != nil {
		t.Errorf("second Release: got %v, want nil", err)
	}
	if err := <-first; err != nil {
		t.Errorf("first Release: got %v, want nil", err)
	}
	e.done() // one release sent
}

func TestLock_Refresh_retries(t *testing.T) {
	for _, tc := range transientErrors {
		t.Run(tc.name, func(t *testing.T) {
			t.Run("then success", func(t *testing.T) {
				e := newMockEnv(t, quickBackoff)
				l, tok := e.acquired("job")
				failures := 1
				if tc.rolledBack {
					failures = manyConflicts
				}
				e.expectExec("refresh", refreshArgs(60_000_000, "job", tok), append(repeatReply(errReply(tc.err), failures), okReply(1, 1))...)
				if err := l.Refresh(t.Context(), time.Minute); err != nil {
					t.Errorf("Refresh: got %v, want nil", err)
				}
				e.done()
			})
			t.Run("bounded", func(t *testing.T) {
				e := newMockEnv(t, quickBackoff)
				l, tok := e.acquired("job")
				ctx := t.Context()
				if tc.rolledBack {
					// Conflicts go on past the lease: the retries stop
					// when it could expire.
					l.mu.Lock()
					l.validUntil = time.Now().Add(200 * time.Millisecond)
					l.mu.Unlock()
					e.expectExec("refresh", refreshArgs(60_000_000, "job", tok), repeatReply(errReply(tc.err), 10_000)...)
				} else {
					e.expectExec("refresh", refreshArgs(60_000_000, "job", tok),
						repeatReply(errReply(tc.err), fault.MaxTransientAttempts)...)
				}
				err := l.Refresh(ctx, time.Minute)
				assertErrIs(t, err, tc.err)
				if errors.Is(err, ErrNotHeld) {
					t.Errorf("got %v, want an error not wrapping %v: the outcome is unknown", err, ErrNotHeld)
				}
				if !tc.rolledBack {
					e.done()
				}
			})
		})
	}
	t.Run("final error", func(t *testing.T) {
		e := newMockEnv(t)
		l, tok := e.acquired("job")
		e.expectExec("refresh", refreshArgs(60_000_000, "job", tok), errReply(errSyntax))
		assertErrIs(t, l.Refresh(t.Context(), time.Minute), errSyntax)
		e.done()
	})
}

func TestLock_Release_retries(t *testing.T) {
	lost := mysql.ErrInvalidConn
	tests := []struct {
		name    string
		replies []reply
		expired bool // the lease's ValidUntil has passed
		wantErr error
	}{
		{"lost, then 1 row", []reply{errReply(lost), okReply(0, 1)}, false, nil},
		{"lost, then 0 rows while valid", []reply{errReply(lost), okReply(0, 0)}, false, nil},
		{"lost, then 0 rows after expiry", []reply{errReply(lost), okReply(0, 0)}, true, ErrNotHeld},
		{"deadlock, then 1 row", []reply{errReply(errDeadlock), okReply(0, 1)}, false, nil},
		// A rolled-back attempt deleted nothing: 0 rows means not ours.
		{"deadlock, then 0 rows while valid", []reply{errReply(errDeadlock), okReply(0, 0)}, false, ErrNotHeld},
		{"lost every time", repeatReply(errReply(lost), fault.MaxTransientAttempts), false, lost},
		{"final error", []reply{errReply(errSyntax)}, false, errSyntax},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newMockEnv(t)
			l, tok := e.acquired("job")
			if tt.expired {
				l.mu.Lock()
				l.validUntil = time.Now().Add(-time.Millisecond)
				l.mu.Unlock()
			}
			e.expectExec("release", releaseArgs("job", tok), tt.replies...)
			if err := l.Release(t.Context()); !errors.Is(err, tt.wantErr) {
				t.Errorf("Release: got %v, want %v", err, tt.wantErr)
			}
			e.done()
		})
	}
	// A Release whose every attempt was lost may have deleted the row: a
	// later Release that finds nothing while the lease was valid succeeds.
	t.Run("lost every time, then a second Release finds 0 rows", func(t *testing.T) {
		e := newMockEnv(t)
		l, tok := e.acquired("job")
		e.expectExec("release", releaseArgs("job", tok), repeatReply(errReply(lost), fault.MaxTransientAttempts)...)
		e.expectExec("release", releaseArgs("job", tok), okReply(0, 0))
		assertErrIs(t, l.Release(t.Context()), lost)
		if err := l.Release(t.Context()); err != nil {
			t.Errorf("second Release: got %v, want nil", err)
		}
		e.done()
	})
	t.Run("cancelled in flight, then a second Release finds 0 rows", func(t *testing.T) {
		e := newMockEnv(t)
		e.c.releaseTimeout = time.Second // the first Release waits it out
		l, tok := e.acquired("job")
		e.expectExec("release", releaseArgs("job", tok), reply{rows: 1, delay: time.Minute})
		e.expectExec("release", releaseArgs("job", tok), okReply(0, 0))
		// Long enough for the statement to be sent on a loaded machine; it
		// then hangs for a minute, so the context ends while it is in flight.
		ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
		defer cancel()
		if err := l.Release(ctx); err == nil {
			t.Errorf("Release: got nil, want an error")
		}
		if err := l.Release(t.Context()); err != nil {
			t.Errorf("second Release: got %v, want nil", err)
		}
		e.done()
	})
}

// waitServerExpired returns once the server's clock has passed the expiry of
// name's lease on c's table. Inspect is a plain read: it takes no row lock,
// so it does not wait on a transaction that wrote the row.
func waitServerExpired(t *testing.T, c *Client, name string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); inspect(t, c, name).Held; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the lease of %q is still live by the server's clock 10s on", name)
		}
	}
}
