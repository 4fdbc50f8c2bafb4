package sqllock

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/sqllock/sqllock/internal/engine"
	"github.com/sqllock/sqllock/internal/sqltext"
)

// An attached lease (queries.sql) ends with its holder's session, not by its
// own expiry. This release writes none; these tests attach a Client's lease
// by hand, as a release that writes them would, and hold every statement
// that reads another owner's lease to the session's end: acquires of a name
// and of a set take it only once the session has ended or is gone, and
// write the taker's own expiry; Inspect, List and the frozen-holder watch
// show the session's end; ForceRelease counts the change in the session,
// with or without a lock-delay. A statement that read the lease's own
// expiry instead would find it live for ever.

// attach turns l's lease on name into an attached one, kept by the session
// named by the first 16 characters of l's token, which ends in left
// (negative: it has ended); it returns the session's name.
func attach(t *testing.T, e *testEnv, table string, l *Lock, name string, left time.Duration) string {
	t.Helper()
	sid := l.Token()[:16]
	ctx := testCtx(t)
	if _, err := e.db.ExecContext(ctx, "INSERT INTO `"+table+"` (name, kind, owner, holder, fence, acquired_at, expires_at) "+
		"VALUES (?, 'S', ?, '', 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND) "+
		"ON DUPLICATE KEY UPDATE expires_at = VALUES(expires_at)", sid, sid, left.Microseconds()); err != nil {
		t.Fatalf("write session %s: %v", sid, err)
	}
	res, err := e.db.ExecContext(ctx, "UPDATE `"+table+"` SET expires_at = '9999-12-31 23:59:59.999999' WHERE name = ? AND kind = 'L' AND owner = ?", name, l.Token())
	if n, _ := res.RowsAffected(); err != nil || n != 1 {
		t.Fatalf("attach %s: %d rows, %v", name, n, err)
	}
	return sid
}

// endSession moves session sid's end to left from now, or deletes its row
// when gone.
func endSession(t *testing.T, e *testEnv, table, sid string, left time.Duration, gone bool) {
	t.Helper()
	q, args := "UPDATE `"+table+"` SET expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND WHERE name = ? AND kind = 'S'", []any{left.Microseconds(), sid}
	if gone {
		q, args = "DELETE FROM `"+table+"` WHERE name = ? AND kind = 'S'", []any{sid}
	}
	if _, err := e.db.ExecContext(testCtx(t), q, args...); err != nil {
		t.Fatalf("session %s: %v", sid, err)
	}
}

// sessionChanges returns session sid's count of changes by others.
func sessionChanges(t *testing.T, e *testEnv, table, sid string) uint64 {
	t.Helper()
	var n uint64
	if err := e.db.QueryRowContext(testCtx(t), "SELECT fence FROM `"+table+"` WHERE name = ? AND kind = 'S'", sid).Scan(&n); err != nil {
		t.Fatalf("session %s: %v", sid, err)
	}
	return n
}

// eachAttachingEnv runs f on every server whose Client reads attached
// leases: not the fake, where no statement writes one, nor TiDB's and
// Vitess's one-row forms, which never read a session (docs/servers.md).
func eachAttachingEnv(t *testing.T, f func(t *testing.T, e *testEnv)) {
	eachServerEnv(t, attaching(f))
}

// eachAttachingVariant is eachAttachingEnv under every DSN variant
// (eachEnv): isolation levels, sql_modes, clientFoundRows and the rest.
func eachAttachingVariant(t *testing.T, f func(t *testing.T, e *testEnv)) {
	eachEnv(t, attaching(f))
}

func attaching(f func(t *testing.T, e *testEnv)) func(t *testing.T, e *testEnv) {
	return func(t *testing.T, e *testEnv) {
		if e.server.Fake || e.oneRow() {
			t.Skip("attached leases are read only by the two-row forms on a real server")
		}
		f(t, e)
	}
}

// tableOfTwo returns a fresh table and two Clients on it, each with a
// *sql.DB of its own, holding as "a" and "b".
func tableOfTwo(t *testing.T, e *testEnv) (table string, a, b *Client) {
	table = e.newTable(t)
	return table, e.client(t, e.db, table, WithHolder("a")), e.client(t, e.openDB(t), table, WithHolder("b"))
}

func TestAttached_acquireWaitsForTheSession(t *testing.T) {
	eachAttachingEnv(t, func(t *testing.T, e *testEnv) {
		table, a, b := tableOfTwo(t, e)
		ctx := testCtx(t)
		la := mustAcquire(t, a, "job", time.Minute)
		sid := attach(t, e, table, la, "job", 30*time.Second)

		// Live with its session: held, for the session's 30 s.
		_, err := b.TryAcquire(ctx, "job", time.Minute)
		wantErrIs(t, err, ErrNotAcquired)
		_, err = b.TryAcquireSet(ctx, []string{"free", "job"}, time.Minute)
		wantErrIs(t, err, ErrNotAcquired)
		if info := inspect(t, b, "free"); info.Held {
			t.Fatalf("free after a refused set: %+v, want untouched", info)
		}
		if info := inspect(t, b, "job"); !info.Held || info.Holder != "a" || info.Fence != la.Fence() || info.TTL > 30*time.Second || info.TTL < 20*time.Second {
			t.Fatalf("Inspect: got %+v, want a's lease, its fence %d untouched by the refusals, with the session's 30 s left", info, la.Fence())
		}
		all, err := b.List(ctx)
		if err != nil || len(all) != 1 || all[0].Name != "job" || all[0].TTL > 30*time.Second || all[0].TTL < 20*time.Second {
			t.Fatalf("List: got %+v, %v, want job with the session's 30 s left", all, err)
		}
		var holder string
		var past int64
		if err := e.db.QueryRowContext(ctx, a.eng.Forms().Text().Named("frozen_lease"), "job").Scan(&holder, &past); err != nil ||
			past > -20e6 || past < -30e6 {
			t.Fatalf("frozen_lease: got %q, %d µs past, %v, want the session's 30 s ahead", holder, past, err)
		}
		look := a.eng.Forms().Text().Set("look", sqltext.Hex("job"))
		if got := lookNames(t, e, look); len(got) != 1 {
			t.Fatalf("look while the session lives: got %q, want job", got)
		}

		// The session ends: so has the lease, though its row says 9999.
		endSession(t, e, table, sid, -time.Second, false)
		if info := inspect(t, b, "job"); info.Held {
			t.Fatalf("Inspect after the session ended: got %+v, want not held", info)
		}
		if all, err := b.List(ctx); err != nil || len(all) != 0 {
			t.Fatalf("List after the session ended: got %+v, %v, want none", all, err)
		}
		if got := lookNames(t, e, look); len(got) != 0 {
			t.Fatalf("look after the session ended: got %q, want none", got)
		}
		lb := mustAcquire(t, b, "job", time.Minute)
		if lb.Fence() <= la.Fence() {
			t.Fatalf("fence of the takeover: got %d, want above %d", lb.Fence(), la.Fence())
		}
		// The taker's lease lasts its own ttl: not the 9999 it found, nor
		// ended with the session it does not belong to.
		if info := inspect(t, a, "job"); !info.Held || info.Holder != "b" || info.TTL > time.Minute || info.TTL < 50*time.Second {
			t.Fatalf("after the takeover: got %+v, want b's lease with its own minute", info)
		}
		wantErrIs(t, la.Refresh(ctx, time.Minute), ErrNotHeld)
	})
}

// acquireCounter connects to the environment's server and counts the
// sends of acquire and of acquire_attached, told apart by the mark their
// update starts with (queries.sql).
type acquireCounter struct {
	driver.Connector
	plain, attached atomic.Int64
}

func (ac *acquireCounter) Connect(ctx context.Context) (driver.Conn, error) {
	c, err := ac.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return acquireCountedConn{passConn{c}, ac}, nil
}

// counts returns the sends of acquire and of acquire_attached so far.
func (ac *acquireCounter) counts() (plain, attached int64) {
	return ac.plain.Load(), ac.attached.Load()
}

type acquireCountedConn struct {
	passConn
	ac *acquireCounter
}

func (c acquireCountedConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	st, err := c.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	switch {
	case strings.Contains(query, "LAST_INSERT_ID(IF(expires_at = '9999-12-31 23:59:59.999999', 3,"):
		return acquireCountedStmt{passStmt{st}, &c.ac.plain}, nil
	case strings.Contains(query, "LAST_INSERT_ID(IF(owner = ?, 2, IF(IF(expires_at = '9999-12-31 23:59:59.999999'"):
		return acquireCountedStmt{passStmt{st}, &c.ac.attached}, nil
	}
	return st, nil
}

type acquireCountedStmt struct {
	passStmt
	n *atomic.Int64
}

func (s acquireCountedStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	s.n.Add(1)
	return s.Stmt.(driver.StmtExecContext).ExecContext(ctx, args)
}

// An acquire that finds the lease attached sends acquire_attached after
// it; the Client then remembers the name, and its next acquires of it send
// acquire_attached alone, one statement, which still decides every lease
// rightly: an attached lease held while its session lives and taken once
// it has ended, a lease detached since (unattached) held while it lasts.
// Once the Client has taken the name, it forgets it: the next acquire is
// acquire alone again.
func TestAttached_acquireFoundAttachedSendsOneStatementAfter(t *testing.T) {
	eachAttachingVariant(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		a := e.client(t, e.db, table, WithHolder("a"))
		ac := &acquireCounter{Connector: e.quietConnector(t, func(*mysql.Config) {})}
		db := sql.OpenDB(ac)
		t.Cleanup(func() { db.Close() })
		b := e.client(t, db, table, WithHolder("b"))
		warm(t, b)
		ctx := testCtx(t)
		var plain0, attached0 int64
		try := func(name string, want string, plain, attached int64) *Lock {
			t.Helper()
			p0, a0 := ac.counts()
			l, err := b.TryAcquire(ctx, name, time.Minute)
			if want == "held" {
				wantErrIs(t, err, ErrNotAcquired)
			} else if err != nil {
				t.Fatalf("TryAcquire %s: %v, want it taken", name, err)
			}
			p, at := ac.counts()
			if p-p0 != plain || at-a0 != attached {
				t.Fatalf("TryAcquire %s (%s): sent %d acquire and %d acquire_attached, want %d and %d", name, want, p-p0, at-a0, plain, attached)
			}
			return l
		}
		plain0, attached0 = ac.counts()
		if plain0 == 0 || attached0 != 0 {
			t.Fatalf("the warm-up sent %d acquire, %d acquire_attached: the counter does not tell them apart", plain0, attached0)
		}

		la := mustAcquire(t, a, "job", time.Minute)
		sid := attach(t, e, table, la, "job", 30*time.Second)
		try("job", "held", 1, 1) // found attached: both
		try("job", "held", 0, 1) // remembered: acquire_attached alone
		try("job", "held", 0, 1)
		endSession(t, e, table, sid, -time.Second, false)
		lb := try("job", "taken", 0, 1) // the session has ended
		if lb.Fence() <= la.Fence() {
			t.Fatalf("fence of the takeover: got %d, want above %d", lb.Fence(), la.Fence())
		}
		if err := lb.Release(ctx); err != nil {
			t.Fatal(err)
		}
		try("job", "taken", 1, 0).Release(ctx) // taken: forgotten

		// Remembered, then detached by its holder's Refresh: its own
		// expiry holds it, and acquire_attached reads that as acquire.
		lo := mustAcquire(t, a, "other", time.Minute)
		attach(t, e, table, lo, "other", 30*time.Second)
		try("other", "held", 1, 1)
		if err := lo.Refresh(ctx, time.Minute); err != nil {
			t.Fatal(err)
		}
		try("other", "held", 0, 1)
		if err := lo.Release(ctx); err != nil {
			t.Fatal(err)
		}
		try("other", "taken", 0, 1)
	})
}

// A semaphore's slot attached to a live session is held: refused to
// another token, shown held with the session's time left (Inspect), and
// counted live by the check of a new slot count (which refuses to resize
// while a slot is held). Once the session has ended (or its row is gone),
// the slot is taken over, and lasts the taker's own ttl.
func TestAttached_slotWaitsForTheSession(t *testing.T) {
	eachAttachingVariant(t, func(t *testing.T, e *testEnv) {
		slotServer(t, e)
		table, a, b := tableOfTwo(t, e)
		ctx := testCtx(t)
		for _, c := range []struct {
			sem  string
			gone bool
		}{{"one", false}, {"two", true}} {
			la := mustSlot(t, a, c.sem, 1, time.Minute)
			sid := attach(t, e, table, la, slotName(c.sem, 1), 30*time.Second)

			_, err := b.Semaphore(c.sem, 1).TryAcquire(ctx, time.Minute)
			wantErrIs(t, err, ErrNotAcquired)
			_, err = b.Semaphore(c.sem, 2).TryAcquire(ctx, time.Minute) // the check of n = 2
			wantErrIs(t, err, ErrSlotCount)
			infos, err := b.Semaphore(c.sem, 1).Inspect(ctx)
			if err != nil || len(infos) != 1 || !infos[0].Held || infos[0].Holder != "a" || infos[0].TTL > 30*time.Second || infos[0].TTL < 20*time.Second {
				t.Fatalf("%s: Inspect while the session lives: got %+v, %v, want a's slot with the session's 30 s left", c.sem, infos, err)
			}

			endSession(t, e, table, sid, -time.Second, c.gone)
			infos, err = b.Semaphore(c.sem, 1).Inspect(ctx)
			if err != nil || len(infos) != 1 || infos[0].Held {
				t.Fatalf("%s: Inspect after the session ended: got %+v, %v, want the slot not held", c.sem, infos, err)
			}
			n := 1
			if c.gone {
				n = 2 // the check: every slot free, so the count becomes 2
			}
			lb, err := b.Semaphore(c.sem, n).TryAcquire(ctx, time.Minute)
			if err != nil || lb.Fence() <= la.Fence() {
				t.Fatalf("%s: TryAcquire of %d slots after the session ended: got %v, want a slot, its fence above %d", c.sem, n, err, la.Fence())
			}
			infos, err = a.Semaphore(c.sem, n).Inspect(ctx)
			if err != nil || len(infos) != n || !infos[lb.Slot()-1].Held || infos[lb.Slot()-1].Holder != "b" || infos[lb.Slot()-1].TTL > time.Minute || infos[lb.Slot()-1].TTL < 50*time.Second {
				t.Fatalf("%s after the takeover: got %+v, %v, want b's slot %d with its own minute", c.sem, infos, err, lb.Slot())
			}
			wantErrIs(t, la.Refresh(ctx, time.Minute), ErrNotHeld)
		}
	})
}

// A set takes an attached lease whose session row is gone, and each of its
// names then lasts the set's own ttl.
func TestAttached_setTakesALeaseWhoseSessionIsGone(t *testing.T) {
	eachAttachingEnv(t, func(t *testing.T, e *testEnv) {
		if e.server.Vitess {
			t.Skip("sets are refused through Vitess")
		}
		table, a, b := tableOfTwo(t, e)
		la := mustAcquire(t, a, "d2", time.Minute)
		sid := attach(t, e, table, la, "d2", 30*time.Second)
		_, err := b.TryAcquireSet(testCtx(t), []string{"d1", "d2"}, time.Minute)
		wantErrIs(t, err, ErrNotAcquired)

		endSession(t, e, table, sid, 0, true)
		ls := mustAcquireSet(t, b, time.Minute, "d1", "d2")
		if ls.Fences()[1] <= la.Fence() {
			t.Fatalf("fence of d2: got %d, want above %d", ls.Fences()[1], la.Fence())
		}
		for _, n := range []string{"d1", "d2"} {
			if info := inspect(t, a, n); !info.Held || info.Holder != "b" || info.TTL > time.Minute || info.TTL < 50*time.Second {
				t.Fatalf("%s after the set's takeover: got %+v, want b's lease with its own minute", n, info)
			}
		}
	})
}

// ForceRelease of an attached lease takes the default lock-delay from what
// the session has left, and counts the change in the session, so that its
// holder's renewal is told; with no lock-delay it frees the name at once,
// still counts it, and leaves no row, as for an unattached lease.
func TestAttached_forceReleaseCountsTheChange(t *testing.T) {
	eachAttachingEnv(t, func(t *testing.T, e *testEnv) {
		for _, delay := range []time.Duration{-1, 0} { // -1: the default
			t.Run(map[bool]string{true: "default", false: "none"}[delay < 0], func(t *testing.T) {
				table := e.newTable(t)
				a := e.client(t, e.db, table, WithHolder("a"))
				opts := []Option{WithHolder("ops")}
				if delay >= 0 {
					opts = append(opts, WithLockDelay(delay))
				}
				ops := e.client(t, e.openDB(t), table, opts...)
				ctx := testCtx(t)
				la := mustAcquire(t, a, "job", time.Hour)
				sid := attach(t, e, table, la, "job", 30*time.Second)

				got, err := ops.ForceRelease(ctx, "job")
				if err != nil || got.Holder != "a" || !got.Held || got.TTL > 30*time.Second || got.TTL < 20*time.Second {
					t.Fatalf("ForceRelease: got %+v, %v, want a's lease with the session's 30 s left", got, err)
				}
				want := time.Duration(0)
				if delay < 0 {
					want = defaultLockDelay(got.TTL)
				}
				if got.LockDelay > want || got.LockDelay < want-time.Second {
					t.Fatalf("LockDelay: got %v, want %v for the session's %v", got.LockDelay, want, got.TTL)
				}
				if n := sessionChanges(t, e, table, sid); n != 1 {
					t.Fatalf("the session's changes by others: got %d, want 1", n)
				}
				if info := inspect(t, ops, "job"); delay == 0 && info.Holder != "" {
					// As for an unattached lease (force_release): the
					// lock-delay of none that counted the change is
					// deleted with the lease.
					t.Fatalf("after ForceRelease with no lock-delay: got %+v, want no lease row", info)
				}
				wantErrIs(t, la.Refresh(ctx, time.Minute), ErrNotHeld)
				lb, err := ops.TryAcquire(ctx, "job", time.Minute)
				if delay < 0 {
					wantErrIs(t, err, ErrNotAcquired)
					return
				}
				if err != nil || lb.Fence() <= la.Fence() {
					t.Fatalf("TryAcquire after: got %v, want the name free, its fence above %d", err, la.Fence())
				}
			})
		}
	})
}

// ForceRelease of an attached lease whose session has ended finds it not
// live, as an expired lease: it deletes it, with no lock-delay.
func TestAttached_forceReleaseOfAnEndedSession(t *testing.T) {
	eachAttachingEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		a := e.client(t, e.db, table, WithHolder("a"))
		ops := e.client(t, e.openDB(t), table, WithHolder("ops"))
		la := mustAcquire(t, a, "job", time.Hour)
		attach(t, e, table, la, "job", -time.Second)
		got, err := ops.ForceRelease(testCtx(t), "job")
		if err != nil || got.Holder != "a" || got.Held || got.LockDelay != 0 {
			t.Fatalf("ForceRelease: got %+v, %v, want a's lease, not live, and no lock-delay", got, err)
		}
		if info := inspect(t, ops, "job"); info.Held || info.Holder != "" {
			t.Fatalf("after: got %+v, want no lease", info)
		}
	})
}

// A Refresh of an attached lease detaches it: its own expiry becomes the
// later of its session's end and now + ttl, and it lasts after the session
// has ended. A Refresh of an attached lease whose session has ended finds
// it lost. Check passes an attached lease while it is the token's.
func TestAttached_refreshDetaches(t *testing.T) {
	eachAttachingEnv(t, func(t *testing.T, e *testEnv) {
		table, a, b := tableOfTwo(t, e)
		ctx := testCtx(t)
		for _, c := range []struct {
			name    string
			session time.Duration
			refresh time.Duration
		}{{"short", 30 * time.Second, time.Second}, {"long", 30 * time.Second, time.Minute}} {
			l := mustAcquire(t, a, c.name, time.Hour)
			sid := attach(t, e, table, l, c.name, c.session)
			if err := l.Refresh(ctx, c.refresh); err != nil {
				t.Fatalf("Refresh %s: %v", c.name, err)
			}
			endSession(t, e, table, sid, 0, true)
			want := max(c.session, c.refresh)
			if info := inspect(t, b, c.name); !info.Held || info.TTL > want || info.TTL < want-10*time.Second {
				t.Fatalf("%s after its session: got %+v, want it held for the later of %v and %v", c.name, info, c.session, c.refresh)
			}
			if _, err := b.TryAcquire(ctx, c.name, time.Minute); !errors.Is(err, ErrNotAcquired) {
				t.Fatalf("TryAcquire %s: got %v, want it held", c.name, err)
			}
		}

		l := mustAcquire(t, a, "ended", time.Hour)
		sid := attach(t, e, table, l, "ended", 30*time.Second)
		tx := checkedTx(t, a, l)
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		endSession(t, e, table, sid, -time.Second, false)
		tx = checkedTx(t, a, l) // by its owner alone
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
		wantErrIs(t, l.Refresh(ctx, time.Minute), ErrNotHeld)
		if _, err := b.TryAcquire(ctx, "ended", time.Minute); err != nil {
			t.Fatalf("TryAcquire after the session ended and the refresh failed: %v", err)
		}
	})
}

// A kept-alive lease attached by hand to a session that lives goes on
// being kept; one attached to a session that has ended is lost: its
// keep-alive's context ends with ErrLockLost. (Each ttl has a session of
// its own, whose name begins the tokens of its leases.)
func TestAttached_keepAliveKeepsOrLoses(t *testing.T) {
	eachAttachingEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		a := e.client(t, e.db, table, WithHolder("a"))
		ctx := testCtx(t)
		const ttl = 1500 * time.Millisecond

		kept := mustAcquire(t, a, "kept", ttl)
		attach(t, e, table, kept, "kept", 30*time.Second)
		kctx := kept.KeepAlive(ctx)
		lost := mustAcquire(t, a, "lost", ttl+100*time.Millisecond)
		attach(t, e, table, lost, "lost", -time.Second)
		lctx := lost.KeepAlive(ctx)

		select {
		case <-lctx.Done():
			assertErrIs(t, context.Cause(lctx), ErrLockLost)
		case <-time.After(5 * ttl):
			t.Fatal("the keep-alive of a lease whose session ended did not end")
		}
		time.Sleep(2 * ttl) // a few rounds more
		if err := kctx.Err(); err != nil {
			t.Fatalf("the keep-alive of a lease whose session lives: %v", context.Cause(kctx))
		}
		if info := inspect(t, a, "kept"); !info.Held || info.Holder != "a" {
			t.Fatalf("kept: got %+v, want it held", info)
		}
	})
}

// lookNames runs the look query q and returns the names it lists.
func lookNames(t *testing.T, e *testEnv, q string) []string {
	t.Helper()
	rows, err := e.db.QueryContext(context.Background(), q)
	if err != nil {
		t.Fatalf("look: %v", err)
	}
	defer rows.Close()
	var names []string
	for rows.Next() {
		var n []byte
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		names = append(names, string(n))
	}
	if err := rows.Err(); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	return names
}

// A set's leases are attached as a name's: a Refresh of the set detaches
// every one of them, for the later of the session's end and its own ttl;
// once their session has ended the set is no longer held: Check passes by
// its owner alone (as check, for the row lock it takes), a Refresh fails
// and does not revive it, and another owner takes the names.
func TestAttached_setRefreshDetaches(t *testing.T) {
	eachAttachingEnv(t, func(t *testing.T, e *testEnv) {
		table, a, b := tableOfTwo(t, e)
		ctx := testCtx(t)
		l := mustAcquireSet(t, a, time.Hour, "r1", "r2")
		sid := attach(t, e, table, l, "r1", 30*time.Second)
		attach(t, e, table, l, "r2", 30*time.Second)
		if err := l.Refresh(ctx, time.Minute); err != nil {
			t.Fatalf("Refresh: %v", err)
		}
		if leases, _ := attachedCount(t, e, table); leases != 0 {
			t.Fatalf("attached after the set's Refresh: %d leases, want none", leases)
		}
		endSession(t, e, table, sid, 0, true)
		for _, n := range []string{"r1", "r2"} {
			if info := inspect(t, b, n); !info.Held || info.TTL > time.Minute || info.TTL < 50*time.Second {
				t.Fatalf("%s after its session: got %+v, want it held for the Refresh's minute", n, info)
			}
		}

		l = mustAcquireSet(t, a, time.Hour, "e1", "e2")
		sid = attach(t, e, table, l, "e1", 30*time.Second)
		attach(t, e, table, l, "e2", 30*time.Second)
		endSession(t, e, table, sid, -time.Second, false)
		tx := checkedTx(t, a, l) // by its owner alone
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
		wantErrIs(t, l.Refresh(ctx, time.Minute), ErrNotHeld)
		if leases, _ := attachedCount(t, e, table); leases != 2 {
			t.Fatalf("attached after the failed Refresh: %d leases, want the 2 of the set, as they were", leases)
		}
		mustAcquireSet(t, b, time.Minute, "e1", "e2")
	})
}

// session_close deletes a session's row at once with all 1 (Client.Close,
// the proof), and with all 0 (the last round of a Client's keep-alives of
// a ttl) only once the session has ended by the server's clock: its end is
// that of every lease still attached to it, whose holder was given a
// ValidUntil up to it. Under every DSN variant.
func TestAttached_sessionCloseWaitsForTheEnd(t *testing.T) {
	eachAttachingVariant(t, func(t *testing.T, e *testEnv) {
		table, a, b := tableOfTwo(t, e)
		closeSession := func(sid, all string) int64 {
			t.Helper()
			h := sqltext.Hex(sid)
			res, _, err := a.eng.Exec(testCtx(t), engine.Send{Stmt: engine.Text, Label: "session_close", Name: "session " + sid,
				Text: a.eng.SessionText("session_close", h, h, all)})
			if err != nil {
				t.Fatalf("session_close %s: %v", all, err)
			}
			n, err := res.RowsAffected()
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
		heldByA := func(name string) {
			t.Helper()
			if _, err := b.TryAcquire(testCtx(t), name, time.Minute); !errors.Is(err, ErrNotAcquired) {
				t.Fatalf("%s: another Client's TryAcquire: %v, want it held", name, err)
			}
		}
		sid := attach(t, e, table, mustAcquire(t, a, "n", time.Minute), "n", time.Minute)
		if n := closeSession(sid, "0"); n != 0 {
			t.Fatalf("session_close 0 of a live session deleted %d rows", n)
		}
		heldByA("n")
		endSession(t, e, table, sid, -time.Millisecond, false)
		if n := closeSession(sid, "0"); n != 1 {
			t.Fatalf("session_close 0 of an ended session deleted %d rows, want 1", n)
		}
		mustAcquire(t, b, "n", time.Minute)

		sid = attach(t, e, table, mustAcquire(t, a, "m", time.Minute), "m", time.Minute)
		heldByA("m")
		if n := closeSession(sid, "1"); n != 1 {
			t.Fatalf("session_close 1 of a live session deleted %d rows, want 1", n)
		}
		mustAcquire(t, b, "m", time.Minute)
	})
}
