package sqllock

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock/internal/engine"
	"github.com/sqllock/sqllock/internal/fault"
)

// textCounter connects to the environment's server and counts the
// statements sent as text, by what they begin their work with: the
// session's renewal, and renew_many.
type textCounter struct {
	driver.Connector
	mu           sync.Mutex
	session, own int
}

func (tc *textCounter) Connect(ctx context.Context) (driver.Conn, error) {
	c, err := tc.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &textCountedConn{passConn{c}, tc}, nil
}

// counts returns how many session_renew and renew_many statements went.
func (tc *textCounter) counts() (session, own int) {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	return tc.session, tc.own
}

type textCountedConn struct {
	passConn
	tc *textCounter
}

func (c *textCountedConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	return c.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, query)
}

func (c *textCountedConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	return c.Conn.(driver.QueryerContext).QueryContext(ctx, query, args)
}

func (c *textCountedConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	c.tc.mu.Lock()
	switch {
	case strings.Contains(query, "WHERE name = X'") && strings.Contains(query, "AND kind = 'S' AND owner = X'") && strings.HasPrefix(strings.TrimSpace(query), "UPDATE"):
		c.tc.session++
	case strings.Contains(query, "CONCAT(owner, name) IN (") && strings.Contains(query, "UPDATE"):
		c.tc.own++
	}
	c.tc.mu.Unlock()
	return c.Conn.(driver.ExecerContext).ExecContext(ctx, query, args)
}

// countedTextDB opens the environment's server, counting its statements
// sent as text.
func (e *testEnv) countedTextDB(t *testing.T) (*sql.DB, *textCounter) {
	t.Helper()
	tc := &textCounter{Connector: e.quietConnector(t, func(*mysql.Config) {})}
	db := sql.OpenDB(tc)
	t.Cleanup(func() { db.Close() })
	return db, tc
}

// attachedCount returns how many lease rows of table are attached, and how
// many session rows it has. The leases of a session proof under way
// (engine.ProveSessions) are not counted; its session is.
func attachedCount(t *testing.T, e *testEnv, table string) (leases, sessions int) {
	t.Helper()
	if err := e.db.QueryRowContext(testCtx(t), "SELECT COALESCE(SUM(kind = 'L' AND expires_at = '9999-12-31 23:59:59.999999' AND LEFT(name, ?) <> ?), 0), COALESCE(SUM(kind = 'S'), 0) FROM `"+table+"`",
		len(engine.ProofPrefix), engine.ProofPrefix).Scan(&leases, &sessions); err != nil {
		t.Fatal(err)
	}
	return leases, sessions
}

// A Client's kept-alive leases of one ttl are attached to one session, and
// a round then sends one statement for all of them, whatever their number:
// its renewal; renew_many is sent no more. Each lease is still renewed
// (its deadline moves), and held on the server.
func TestSession_oneStatementARound(t *testing.T) {
	eachAttachingEnv(t, func(t *testing.T, e *testEnv) {
		var count sharedCount
		db, tc := e.countedTextDB(t)
		table := e.newTable(t)
		c := e.client(t, db, table, WithObserver(count.observer()))
		w := e.client(t, e.openDB(t), table)
		warm(t, c)
		const ttl, n = 1500 * time.Millisecond, 40
		locks, ctxs, names := keptAlive(t, c, "one", n, ttl)
		waitFor(t, 20*ttl, "every lease attached", func() bool {
			leases, _ := attachedCount(t, e, table)
			return leases == n
		})
		if _, sessions := attachedCount(t, e, table); sessions != 1 {
			t.Fatalf("session rows: got %d, want 1", sessions)
		}
		before := make([]int, n)
		for i, name := range names {
			before[i] = count.of(name)
		}
		s0, own0 := tc.counts()
		waitFor(t, 20*ttl, "every lease renewed three times more", func() bool {
			for i, name := range names {
				if ctxs[i].Err() == nil && count.of(name) < before[i]+3 {
					return false
				}
			}
			return true
		})
		s1, own1 := tc.counts()
		if own1 != own0 {
			t.Errorf("renew_many sent %d times while every lease was attached, want none", own1-own0)
		}
		if s1-s0 < 3 || s1-s0 > 6 {
			t.Errorf("session renewals for three rounds: got %d, want 3 to 6", s1-s0)
		}
		for i, lctx := range ctxs {
			if err := context.Cause(lctx); err != nil && !lostForNoRenewal(err) {
				t.Fatalf("%s: keep-alive ended: %v", names[i], err)
			}
		}
		for _, l := range locks[:3] {
			if got := leaseInfo(t, w, l); !got.Held || got.TTL > ttl {
				t.Errorf("%s on the server: got %+v, want held for at most the session's %v", l.Name(), got, ttl)
			}
		}
		// Released, every lease leaves the session, and the session's row
		// goes once the session has ended after the last (the round finds
		// no keep-alive left, and the session is no longer renewed).
		for _, l := range locks {
			if err := l.Release(testCtx(t)); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(t, 10*ttl, "the session's row deleted", func() bool {
			_, sessions := attachedCount(t, e, table)
			return sessions == 0
		})
	})
}

// The session has ended before its renewal (its Client was paused, or cut
// off from the server, past its ttl): every keep-alive it kept ends with
// ErrLockLost, and another Client takes the names; new leases of that ttl
// get a new session, which keeps them.
func TestSession_endedLosesEveryLease(t *testing.T) {
	eachAttachingEnv(t, func(t *testing.T, e *testEnv) {
		table, a, b := tableOfTwo(t, e)
		warm(t, a, b)
		const ttl, n = 1500 * time.Millisecond, 5
		locks, ctxs, names := keptAlive(t, a, "ended", n, ttl)
		waitFor(t, 20*ttl, "every lease attached", func() bool {
			leases, _ := attachedCount(t, e, table)
			return leases == n
		})
		sid := locks[0].Token()[:sessionChars]
		endSession(t, e, table, sid, -time.Second, false) // as if no renewal came for a ttl
		for i, lctx := range ctxs {
			select {
			case <-lctx.Done():
				assertErrIs(t, context.Cause(lctx), ErrLockLost)
			case <-time.After(5 * ttl):
				t.Fatalf("%s: the keep-alive did not end after its session ended", names[i])
			}
			mustAcquire(t, b, names[i], time.Minute)
		}
		l := mustAcquire(t, a, "after", ttl)
		if l.Token()[:sessionChars] == sid {
			t.Fatalf("a lease after the session ended got its name %s", sid)
		}
		lctx := l.KeepAlive(testCtx(t))
		waitFor(t, 20*ttl, "the new lease attached", func() bool {
			leases, _ := attachedCount(t, e, table)
			return leases == 1
		})
		if err := context.Cause(lctx); err != nil {
			t.Fatalf("the new lease's keep-alive: %v", err)
		}
	})
}

// A forced release of one attached lease, with the default lock-delay or
// none, ends that lease's keep-alive alone: the session's count of changes
// moves, and the round finds which lease went; the others stay attached
// and kept. The forced name is taken once the lock-delay is over.
func TestSession_forcedReleaseEndsThatLeaseAlone(t *testing.T) {
	eachAttachingEnv(t, func(t *testing.T, e *testEnv) {
		for _, delay := range []time.Duration{-1, 0} {
			t.Run(map[bool]string{true: "default", false: "none"}[delay < 0], func(t *testing.T) {
				table := e.newTable(t)
				a := e.client(t, e.openDB(t), table, WithHolder("a"))
				opts := []Option{WithHolder("ops")}
				if delay >= 0 {
					opts = append(opts, WithLockDelay(delay))
				}
				ops := e.client(t, e.openDB(t), table, opts...)
				warm(t, a, ops)
				const ttl, n = 1500 * time.Millisecond, 6
				_, ctxs, names := keptAlive(t, a, "forced", n, ttl)
				waitFor(t, 20*ttl, "every lease attached", func() bool {
					leases, _ := attachedCount(t, e, table)
					return leases == n
				})
				forceLost(t, ops, names[2], ctxs[2], 5*ttl)
				time.Sleep(2 * ttl) // rounds after the one that found it
				for i, lctx := range ctxs {
					if err := context.Cause(lctx); i != 2 && err != nil && !lostForNoRenewal(err) {
						t.Fatalf("%s: keep-alive ended beside the forced one: %v", names[i], err)
					}
				}
				if leases, _ := attachedCount(t, e, table); leases != n-1 {
					t.Fatalf("attached leases after: got %d, want %d", leases, n-1)
				}
				waitFor(t, 10*time.Second, "the forced name free", func() bool {
					l, err := ops.TryAcquire(testCtx(t), names[2], time.Minute)
					return err == nil && l != nil
				})
			})
		}
	})
}

// A Refresh of an attached lease detaches it for the ttl it asks, and the
// keep-alive goes on renewing it on its own row; it is attached again once
// the session ends no earlier than it does.
func TestSession_refreshDetachesThenAttachesAgain(t *testing.T) {
	eachAttachingEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		a := e.client(t, e.db, table)
		warm(t, a)
		const ttl = 1500 * time.Millisecond
		locks, ctxs, _ := keptAlive(t, a, "refreshed", 2, ttl)
		waitFor(t, 20*ttl, "both leases attached", func() bool {
			leases, _ := attachedCount(t, e, table)
			return leases == 2
		})
		refreshed := time.Now()
		if err := locks[0].Refresh(testCtx(t), 3*ttl); err != nil {
			t.Fatal(err)
		}
		if leases, _ := attachedCount(t, e, table); leases != 1 {
			t.Fatalf("attached after a Refresh: got %d, want 1", leases)
		}
		if got := time.Until(locks[0].ValidUntil()); got < 2*ttl {
			t.Fatalf("ValidUntil after Refresh(%v): %v left", 3*ttl, got)
		}
		waitFor(t, 20*ttl, "the refreshed lease attached again", func() bool {
			leases, _ := attachedCount(t, e, table)
			return leases == 2
		})
		// Not before the session ends as late as the Refresh asked: 3 ttl
		// from it, which a session renewed every ttl/3 for ttl reaches
		// after 2 ttl. Attached sooner, the lease would end earlier than
		// its holder was told.
		if took := time.Since(refreshed); took < 2*ttl-ttl/3 {
			t.Fatalf("attached again %v after Refresh(%v), want no sooner than the session reaches its end", took, 3*ttl)
		}
		for i, lctx := range ctxs {
			if err := context.Cause(lctx); err != nil && !lostForNoRenewal(err) {
				t.Fatalf("lease %d: keep-alive ended: %v", i, err)
			}
		}
	})
}

// Where a server refuses a session (the fake, answering as a server that
// cannot), every lease renews with renew_many, as before sessions: kept
// alive and renewed; the log says so once.
func TestSession_refusedFallsBackToRenewMany(t *testing.T) {
	_, c, count, rec := renewalFake(t, "t_refused")
	warm(t, c)
	const ttl = 900 * time.Millisecond
	_, ctxs, names := keptAlive(t, c, "refused", 5, ttl)
	waitFor(t, 20*ttl, "every lease renewed three times by the shared renewal", func() bool { return count.each(names, 3) })
	for i, lctx := range ctxs {
		if err := context.Cause(lctx); err != nil {
			t.Fatalf("%s: keep-alive ended: %v", names[i], err)
		}
	}
	said := 0
	for _, line := range rec.atLeast(0) {
		said += strings.Count(line, "refused a session")
	}
	if said != 1 {
		t.Fatalf("log lines saying sessions were refused: got %d, want 1", said)
	}
}

// A session's renewal that runs late, after the session ended and another
// owner took a lease of it, does not revive the session: it judges the
// session's end by the clock when it reads the row, not when it began. The
// renewal waits behind a transaction that holds the session's row, as an
// acquire's read of it or a user's would; meanwhile the session ends and
// the other owner takes the lease.
func TestSession_lateRenewalDoesNotRevive(t *testing.T) {
	eachAttachingEnv(t, func(t *testing.T, e *testEnv) {
		table, a, b := tableOfTwo(t, e)
		warm(t, a, b)
		ctx := testCtx(t)
		la := mustAcquire(t, a, "job", time.Hour)
		sid := attach(t, e, table, la, "job", 600*time.Millisecond)

		tx, err := e.openDB(t).BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		var exp string
		if err := tx.QueryRowContext(ctx, "SELECT expires_at FROM `"+table+"` WHERE name = ? AND kind = 'S' FOR UPDATE", sid).Scan(&exp); err != nil {
			t.Fatal(err)
		}
		h := fmt.Sprintf("X'%x'", sid)
		renew := a.eng.Forms().Text().Set("session_renew", "60000000", h, h)
		got := make(chan int64, 1)
		go func() {
			var id int64 = -1 // refused: the guard's bound on its wait
			if res, err := e.openDB(t).ExecContext(ctx, renew); err == nil {
				id, _ = res.LastInsertId()
			} else if !strings.Contains(err.Error(), "1690") {
				t.Errorf("session_renew: %v", err)
			}
			got <- id
		}()
		time.Sleep(900 * time.Millisecond) // the renewal waits; the session ends
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		// The renewal runs now, a second after it began, past the guard's
		// bound for its own wait: it is refused, or finds the session over.
		if id := <-got; id > 0 {
			t.Fatalf("session_renew after the session ended: insert id %d, want 0 or a refusal", id)
		}
		lb := mustAcquire(t, b, "job", time.Minute)
		if lb.Fence() <= la.Fence() {
			t.Fatalf("fence: got %d, want above %d", lb.Fence(), la.Fence())
		}
		if info := inspect(t, a, "job"); info.Holder != "b" {
			t.Fatalf("after: got %+v, want b's", info)
		}
		var left int64
		if err := e.db.QueryRowContext(ctx, "SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) FROM `"+table+"` WHERE name = ? AND kind = 'S'", sid).Scan(&left); err != nil || left > 0 {
			t.Fatalf("the session after the late renewal: %d µs left, %v; want it over", left, err)
		}
	})
}

// Where the server keeps no session (TiDB, Vitess, a node of Galera or
// Group Replication), the log says so once, at Info, when the first
// keep-alive renews, and never again, whatever the number of ttls; where it
// keeps sessions, never. Each lease is renewed all the same.
func TestSession_noSessionSaidOnce(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		if e.server.Fake {
			t.Skip("the fake refuses sessions: TestSession_refusedFallsBackToRenewMany")
		}
		var count sharedCount
		rec, logOpt := newRecorder()
		c := e.newClient(t, logOpt, WithObserver(count.observer()))
		warm(t, c)
		_, ctxs, names := keptAlive(t, c, "said", 3, 900*time.Millisecond)
		_, ctxs2, names2 := keptAlive(t, c, "again", 3, 1200*time.Millisecond)
		waitFor(t, 30*time.Second, "every lease renewed three times", func() bool {
			return count.each(names, 3) && count.each(names2, 3)
		})
		for i, lctx := range append(ctxs, ctxs2...) {
			if err := context.Cause(lctx); err != nil {
				t.Fatalf("%s: keep-alive ended: %v", append(names, names2...)[i], err)
			}
		}
		lines := rec.atLeast(slog.LevelInfo)
		rest := withoutNoSession(t, c, lines)
		if said := len(lines) - len(rest); !c.eng.Sessions() && said != 1 {
			t.Fatalf("on a server that keeps no session, the line %q said %d times, want once", noSessionLine, said)
		}
	})
}

// forceLost force-releases name with ops, live, and waits up to limit for
// the keep-alive context lctx of its holder to end with ErrLockLost.
func forceLost(t *testing.T, ops *Client, name string, lctx context.Context, limit time.Duration) {
	t.Helper()
	if info, err := ops.ForceRelease(testCtx(t), name); err != nil || !info.Held {
		t.Fatalf("ForceRelease %s: %+v, %v", name, info, err)
	}
	select {
	case <-lctx.Done():
		assertErrIs(t, context.Cause(lctx), ErrLockLost)
	case <-time.After(limit):
		t.Fatalf("the keep-alive of the lease forced off %s did not end", name)
	}
}

// isAttach reports whether query is a session_attach (sent as text) of
// the Client's leases: not of the proof's (engine.ProveSessions), which
// names its lease with engine.ProofPrefix.
func isAttach(query string) bool {
	return strings.Contains(query, "SET l.expires_at = '9999-12-31 23:59:59.999999'") && !isProofs(query)
}

// isDetach reports whether query is a session_detach of the Client's
// leases, not of the proof's (isAttach).
func isDetach(query string) bool {
	return strings.Contains(query, "SET l.expires_at = s.expires_at") && !isProofs(query)
}

// isProofs reports whether query names the proof's lease
// (engine.ProofPrefix), in hex as the session statements are sent.
func isProofs(query string) bool {
	return strings.Contains(query, strings.ToLower(hex.EncodeToString([]byte(engine.ProofPrefix))))
}

// heldNow returns how many statements the connector holds back.
func (lc *lateConnector) heldNow() int {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	return len(lc.held)
}

// attachState reads name's lease, straight: whether it is attached, and
// how long it lasts on its own row when not.
func (le *lateEnv) attachState(t *testing.T, name string) (owner string, attached bool, left time.Duration) {
	t.Helper()
	var us int64
	err := le.straight.QueryRow("SELECT owner, expires_at = '9999-12-31 23:59:59.999999', "+
		"IF(expires_at = '9999-12-31 23:59:59.999999', 0, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at)) "+
		"FROM `"+le.table+"` WHERE name = ? AND kind = 'L'", name).Scan(&owner, &attached, &us)
	if err != nil {
		t.Fatalf("lease %s: %v", name, err)
	}
	return owner, attached, time.Duration(us) * time.Microsecond
}

// An attach whose reply is lost has run: the lease is attached on the
// server while the Client counts it its own row's. renew_many, which skips
// attached rows, then extends fewer leases than it carried, and the lease
// refreshes on its own, which detaches it: it is never lost, and the
// session's next attach takes it for good. (Each send of the attach loses
// its reply: a resend that answers finds the lease attached already.)
// Under every DSN variant.
func TestSession_attachReplyLost_leaseKept(t *testing.T) {
	eachAttachingVariant(t, func(t *testing.T, e *testEnv) {
		var count sharedCount
		le := newLateEnv(t, e, WithObserver(count.observer()))
		const ttl = 1200 * time.Millisecond
		lost := 0
		le.lc.setDecide(func(q string, _ []driver.NamedValue) lateAction {
			if isAttach(q) && lost < fault.MaxTransientAttempts {
				lost++
				return lose
			}
			return pass
		})
		l := mustAcquire(t, le.c, "lost", ttl)
		lctx := l.KeepAlive(testCtx(t))
		waitFor(t, 30*ttl, "an attach whose every send lost its reply, then one that answers", func() bool {
			le.lc.mu.Lock()
			n := lost
			le.lc.mu.Unlock()
			count.mu.Lock()
			alone := count.alone
			count.mu.Unlock()
			_, attached, _ := le.attachState(t, "lost")
			return n == fault.MaxTransientAttempts && attached && alone > 0
		})
		time.Sleep(3 * ttl) // rounds kept by the session
		if err := context.Cause(lctx); err != nil {
			t.Fatalf("keep-alive ended: %v", err)
		}
		_, err := le.witness.TryAcquire(testCtx(t), "lost", time.Minute)
		wantErrIs(t, err, ErrNotAcquired)
	})
}

// An attach that runs late, after its lease was refreshed past the
// session's end, does not attach it: an attached lease lasts as long as its
// session, which would end it before the ValidUntil the Refresh returned.
// One that runs after the lease was released and taken by another owner
// leaves that owner's lease alone, though it ends before the session (kept
// by another lease of the Client). Under every DSN variant.
func TestSession_attachRunsLate(t *testing.T) {
	for _, after := range []string{"refreshed", "taken"} {
		t.Run(after, func(t *testing.T) {
			eachAttachingVariant(t, func(t *testing.T, e *testEnv) {
				le := newLateEnv(t, e)
				le.lc.setDecide(func(q string, _ []driver.NamedValue) lateAction {
					if isAttach(q) {
						return hold
					}
					return pass
				})
				const ttl = 2400 * time.Millisecond
				l := mustAcquire(t, le.c, "late", ttl)
				l.KeepAlive(testCtx(t))
				mustAcquire(t, le.c, "keep", ttl).KeepAlive(testCtx(t))
				waitFor(t, 30*ttl, "an attach held back", func() bool { return le.lc.heldNow() > 0 })
				want, least := l.Token(), 30*time.Minute
				if after == "refreshed" {
					if err := l.Refresh(testCtx(t), time.Hour); err != nil {
						t.Fatal(err)
					}
				} else {
					if err := l.Release(testCtx(t)); err != nil {
						t.Fatal(err)
					}
					// Shorter than the session, which the round renews
					// for 2.4 s every 0.8 s: only the owner keeps the
					// attach off it.
					w := mustAcquire(t, le.witness, "late", 600*time.Millisecond)
					want, least = w.Token(), time.Microsecond
				}
				if ran, _ := le.lc.runHeldAnyway(le.straight); ran == 0 {
					t.Fatal("no attach held back")
				}
				owner, attached, left := le.attachState(t, "late")
				if owner != want || attached || left < least {
					t.Fatalf("after the late attach: owner %q attached %v, %v left; want %q, its own row, at least %v left", owner, attached, left, want, least)
				}
			})
		})
	}
}

// Kept-alive sets join the session as names do: every lease of each set is
// attached and a round sends the session's renewal alone. A Refresh of a
// set detaches its leases, which renew_many keeps from then on; a forced
// release of one name of another set ends that set's keep-alive alone, and
// its other name, never released, is detached and ends as its lease would
// have, not with the session. Under every DSN variant: every session
// statement but session_close runs here.
func TestSession_setsAttached(t *testing.T) {
	eachAttachingVariant(t, func(t *testing.T, e *testEnv) {
		db, tc := e.countedTextDB(t)
		table := e.newTable(t)
		c := e.client(t, db, table, WithHolder("a"))
		ops := e.client(t, e.openDB(t), table, WithHolder("ops"), WithLockDelay(0))
		warm(t, c, ops)
		const ttl, n = 1500 * time.Millisecond, 3
		var (
			locks []*Lock
			ctxs  []context.Context
		)
		for i := range n {
			l := mustAcquireSet(t, c, ttl, fmt.Sprintf("s%d-a", i), fmt.Sprintf("s%d-b", i))
			locks, ctxs = append(locks, l), append(ctxs, l.KeepAlive(testCtx(t)))
		}
		waitFor(t, 20*ttl, "every lease of every set attached", func() bool {
			leases, _ := attachedCount(t, e, table)
			return leases == 2*n
		})
		s0, own0 := tc.counts()
		time.Sleep(2 * ttl)
		if s1, own1 := tc.counts(); own1 != own0 || s1-s0 < 3 {
			t.Fatalf("over two ttl with every set attached: %d session renewals and %d renew_many, want 3 or more and none", s1-s0, own1-own0)
		}

		if err := locks[0].Refresh(testCtx(t), time.Minute); err != nil {
			t.Fatal(err)
		}
		if leases, _ := attachedCount(t, e, table); leases != 2*n-2 {
			t.Fatalf("attached after a set's Refresh: %d, want %d", leases, 2*n-2)
		}
		forceLost(t, ops, "s1-b", ctxs[1], 5*ttl)
		time.Sleep(2 * ttl) // rounds after the one that found it
		for _, i := range []int{0, 2} {
			if err := context.Cause(ctxs[i]); err != nil && !lostForNoRenewal(err) {
				t.Fatalf("set %d: keep-alive ended beside the forced one: %v", i, err)
			}
		}
		// A set whose keep-alive a loaded machine starved past its
		// deadline (lostForNoRenewal) is not held to be kept.
		for _, i := range []int{0, 2} {
			if ctxs[i].Err() != nil {
				continue
			}
			for _, name := range locks[i].Names() {
				if info := inspect(t, ops, name); !info.Held || info.Holder != "a" {
					t.Fatalf("%s: got %+v, want held by a", name, info)
				}
			}
		}
		// The lost set's other name was detached (session_detach): it is
		// nobody's, and free once the session's end it had passes, though
		// the session lives on for the third set.
		if leases, _ := attachedCount(t, e, table); ctxs[2].Err() == nil && leases != 2 {
			t.Fatalf("attached at the end: %d, want the 2 of the third set", leases)
		}
		waitFor(t, 5*ttl, "s1-a free", func() bool {
			_, err := ops.TryAcquire(testCtx(t), "s1-a", time.Minute)
			return err == nil
		})
	})
}

// A semaphore's slots kept alive are attached to the session as names and
// sets are, and a round then renews them with the session's one statement:
// renew_many is sent no more. A forced release of one slot ends that
// slot's keep-alive alone, with the others, of the same semaphore and of
// another, kept; the slot is free once its lock-delay of none is done.
func TestSession_slotsAttached(t *testing.T) {
	eachAttachingVariant(t, func(t *testing.T, e *testEnv) {
		slotServer(t, e)
		db, tc := e.countedTextDB(t)
		table := e.newTable(t)
		c := e.client(t, db, table, WithHolder("a"))
		ops := e.client(t, e.openDB(t), table, WithHolder("ops"), WithLockDelay(0))
		warm(t, c, ops)
		const ttl = 1500 * time.Millisecond
		var (
			locks []*Lock
			ctxs  []context.Context
		)
		for _, sem := range []string{"sa", "sa", "sb"} {
			l := mustSlot(t, c, sem, 2, ttl)
			locks, ctxs = append(locks, l), append(ctxs, l.KeepAlive(testCtx(t)))
		}
		waitFor(t, 20*ttl, "every slot attached", func() bool {
			leases, _ := attachedCount(t, e, table)
			return leases == len(locks)
		})
		s0, own0 := tc.counts()
		time.Sleep(2 * ttl)
		if s1, own1 := tc.counts(); own1 != own0 || s1-s0 < 3 {
			t.Fatalf("over two ttl with every slot attached: %d session renewals and %d renew_many, want 3 or more and none", s1-s0, own1-own0)
		}
		if _, err := ops.Semaphore("sa", 2).TryAcquire(testCtx(t), time.Minute); !errors.Is(err, ErrNotAcquired) {
			t.Fatalf("a slot of sa, both attached: got %v, want ErrNotAcquired", err)
		}

		lost := locks[1]
		if info, err := ops.Semaphore("sa", 2).ForceRelease(testCtx(t), lost.Slot()); err != nil || !info.Held {
			t.Fatalf("ForceRelease of slot %d: %+v, %v", lost.Slot(), info, err)
		}
		select {
		case <-ctxs[1].Done():
			assertErrIs(t, context.Cause(ctxs[1]), ErrLockLost)
		case <-time.After(5 * ttl):
			t.Fatalf("the keep-alive of the slot forced off did not end")
		}
		time.Sleep(2 * ttl) // rounds after the one that found it
		for _, i := range []int{0, 2} {
			err := context.Cause(ctxs[i])
			if err != nil && !lostForNoRenewal(err) {
				t.Fatalf("slot lock %d: keep-alive ended beside the forced one: %v", i, err)
			}
			if err != nil {
				continue // starved past its deadline on a loaded machine
			}
			infos, ierr := ops.Semaphore(locks[i].Name(), 2).Inspect(testCtx(t))
			if ierr != nil || !infos[locks[i].Slot()-1].Held || infos[locks[i].Slot()-1].Holder != "a" {
				t.Fatalf("slot lock %d: Inspect got %+v, %v, want slot %d held by a", i, infos, ierr, locks[i].Slot())
			}
		}
		l, err := ops.Semaphore("sa", 2).TryAcquire(testCtx(t), time.Minute)
		if err != nil || l.Slot() != lost.Slot() {
			t.Fatalf("a slot of sa after the forced release: got %v, %v, want slot %d", l, err, lost.Slot())
		}
	})
}

// A session_detach that fails is sent again by the next round: a set of
// which one name was forced off leaves its other name attached to a
// session the Client renews for another lease, and a lease that stayed
// attached would be held, by nobody, for as long as the Client lives.
// The detach is refused (a deadlock, which the round sends again until its
// deadline) for longer than a round may go on.
func TestSession_detachFailed_sentAgain(t *testing.T) {
	eachAttachingEnv(t, func(t *testing.T, e *testEnv) {
		le := newLateEnv(t, e)
		ops := e.client(t, le.straight, le.table, WithHolder("ops"), WithLockDelay(0))
		refusing, refused := true, 0
		le.lc.setDecide(func(q string, _ []driver.NamedValue) lateAction {
			if isDetach(q) && refusing {
				refused++
				return refuse
			}
			return pass
		})
		const ttl = 1500 * time.Millisecond
		kept := mustAcquire(t, le.c, "kept", ttl)
		kctx := kept.KeepAlive(testCtx(t))
		set := mustAcquireSet(t, le.c, ttl, "x-a", "x-b")
		sctx := set.KeepAlive(testCtx(t))
		waitFor(t, 20*ttl, "the three leases attached", func() bool {
			leases, _ := attachedCount(t, e, le.table)
			return leases == 3
		})
		forceLost(t, ops, "x-b", sctx, 5*ttl)
		waitFor(t, 10*ttl, "a session_detach refused", func() bool {
			le.lc.mu.Lock()
			defer le.lc.mu.Unlock()
			return refused > 0
		})
		time.Sleep(ttl + ttl/2) // past the round's deadline
		if _, attached, _ := le.attachState(t, "x-a"); !attached {
			t.Fatal("x-a detached while every session_detach was refused")
		}
		le.lc.mu.Lock()
		refusing = false
		le.lc.mu.Unlock()
		waitFor(t, 10*ttl, "x-a free", func() bool {
			_, err := ops.TryAcquire(testCtx(t), "x-a", time.Minute)
			return err == nil
		})
		if err := context.Cause(kctx); err != nil && !lostForNoRenewal(err) {
			t.Fatalf("the other lease's keep-alive ended: %v", err)
		}
	})
}

// A kept-alive lease lost for no renewal while attached (its session's
// renewals refused, as through a server's crash), its Lock not released,
// its keep-alive the last of its ttl. The session's row is the end of the
// lease, and is not renewed any more; the class deletes it only once the
// session has ended, never at its next round: the name stays the holder's
// until the ValidUntil it was given, and is free after it, with no session
// row left. A margin of two thirds of the ttl leaves two rounds between
// the loss and the ValidUntil.
func TestSession_lostLeaseLastsToItsValidUntil(t *testing.T) {
	eachAttachingEnv(t, func(t *testing.T, e *testEnv) {
		le := newLateEnv(t, e)
		ops := e.client(t, le.straight, le.table, WithHolder("ops"), WithLockDelay(0))
		var (
			mu       sync.Mutex
			starving bool
		)
		le.lc.setDecide(func(string, []driver.NamedValue) lateAction {
			mu.Lock()
			defer mu.Unlock()
			if starving {
				return refuse
			}
			return pass
		})
		const ttl = 3 * time.Second
		l, kctx := le.keptAttached(t, "lost", ttl, ttl*2/3)
		mu.Lock()
		starving = true
		mu.Unlock()
		select {
		case <-kctx.Done():
		case <-time.After(3 * ttl):
			t.Fatal("the keep-alive did not end while every statement was refused")
		}
		if cause := context.Cause(kctx); !lostForNoRenewal(cause) {
			t.Fatalf("the keep-alive ended with %v, want lost for no renewal", cause)
		}
		mu.Lock()
		starving = false
		mu.Unlock()
		heldToValidUntil(t, ops, l, 3*ttl)
		waitFor(t, 3*ttl, "the session's row deleted", func() bool {
			_, sessions := attachedCount(t, e, le.table)
			return sessions == 0
		})
	})
}

// A keep-alive lost while the round that carries it opens the Client's
// first session (its proof stalled): the round attaches the lease all the
// same, and the session, which the Client renews for its other lease,
// would keep it with no holder. The loss is recorded for the session that
// is opening too, and the next round detaches the lease: the name is free
// soon after, while the other lease stays kept.
func TestSession_lostWhileTheSessionOpens(t *testing.T) {
	eachAttachingEnv(t, func(t *testing.T, e *testEnv) {
		le := newLateEnv(t, e)
		ops := e.client(t, le.straight, le.table, WithHolder("ops"), WithLockDelay(0))
		var (
			mu      sync.Mutex
			stalled = true
		)
		le.lc.setDecide(func(q string, args []driver.NamedValue) lateAction {
			mu.Lock()
			defer mu.Unlock()
			proof := isProofs(q)
			for i := range args {
				proof = proof || strings.HasPrefix(arg(args, i), engine.ProofPrefix)
			}
			if stalled && proof {
				return refuse
			}
			return pass
		})
		const ttl = 3 * time.Second
		kept := mustAcquire(t, le.c, "kept", ttl)
		kctx := kept.KeepAlive(testCtx(t))
		l := mustAcquire(t, le.c, "lost", ttl)
		lctx := l.keepAlive(testCtx(t), ttl*2/3)
		select {
		case <-lctx.Done():
		case <-time.After(3 * ttl):
			t.Fatal("the keep-alive did not end while the session's proof was refused")
		}
		if cause := context.Cause(lctx); !lostForNoRenewal(cause) {
			t.Fatalf("the keep-alive ended with %v, want lost for no renewal", cause)
		}
		mu.Lock()
		stalled = false
		mu.Unlock()
		waitFor(t, 5*ttl, "the other lease attached", func() bool {
			_, attached, _ := le.attachState(t, "kept")
			return attached
		})
		waitFor(t, 4*ttl, "the lost lease's name free", func() bool {
			_, err := ops.TryAcquire(testCtx(t), "lost", time.Minute)
			return err == nil
		})
		if err := context.Cause(kctx); err != nil && !lostForNoRenewal(err) {
			t.Fatalf("the other lease's keep-alive ended: %v", err)
		}
	})
}

// A Release of an attached lease that fails (the statement refused until
// Release gives up) stops its keep-alive, while the Client's session, which
// it renews for its other lease, would keep the lease for as long as the
// Client lives, with no holder. The next round detaches it: the name is
// free within about a ttl, and the other lease stays kept.
func TestSession_failedReleaseDetached(t *testing.T) {
	eachAttachingEnv(t, func(t *testing.T, e *testEnv) {
		le := newLateEnv(t, e)
		ops := e.client(t, le.straight, le.table, WithHolder("ops"), WithLockDelay(0))
		const ttl = 1500 * time.Millisecond
		kept := mustAcquire(t, le.c, "kept", ttl)
		kctx := kept.KeepAlive(testCtx(t))
		l := mustAcquire(t, le.c, "released", ttl)
		l.KeepAlive(testCtx(t))
		waitFor(t, 20*ttl, "both leases attached", func() bool {
			leases, _ := attachedCount(t, e, le.table)
			return leases == 2
		})
		le.lc.setDecide(func(q string, args []driver.NamedValue) lateAction {
			if le.is(q, qRelease) && arg(args, 0) == "released" {
				return refuse
			}
			return pass
		})
		le.c.releaseTimeout = 300 * time.Millisecond // Release gives up sooner
		if err := l.Release(testCtx(t)); err == nil || errors.Is(err, ErrNotHeld) {
			t.Fatalf("Release with every send refused: %v, want an error of unknown outcome", err)
		}
		waitFor(t, 4*ttl, "the name free", func() bool {
			_, err := ops.TryAcquire(testCtx(t), "released", time.Minute)
			return err == nil
		})
		if err := context.Cause(kctx); err != nil && !lostForNoRenewal(err) {
			t.Fatalf("the other lease's keep-alive ended: %v", err)
		}
	})
}

// Client.Close deletes its sessions' rows at once, after releasing its
// leases: a lease lost for no renewal and not released (not the Client's
// to release: its holder was told) would end with it, before the
// ValidUntil its holder was given. Close detaches it first; when that
// fails too (every session_detach refused here), it deletes the row only
// if the session has ended. The name stays the holder's until its
// ValidUntil either way; the lease Close released is free at once.
func TestSession_closeKeepsALostLeaseToItsValidUntil(t *testing.T) {
	eachAttachingEnv(t, func(t *testing.T, e *testEnv) {
		le := newLateEnv(t, e)
		ops := e.client(t, le.straight, le.table, WithHolder("ops"), WithLockDelay(0))
		var (
			mu       sync.Mutex
			starving bool
		)
		le.lc.setDecide(func(q string, _ []driver.NamedValue) lateAction {
			mu.Lock()
			defer mu.Unlock()
			if starving || isDetach(q) {
				return refuse
			}
			return pass
		})
		const ttl = 3 * time.Second
		kept := mustAcquire(t, le.c, "kept", ttl)
		kctx := kept.KeepAlive(testCtx(t))
		l, lctx := le.keptAttached(t, "lost", ttl, ttl*2/3)
		waitFor(t, 20*ttl, "the other lease attached", func() bool {
			_, attached, _ := le.attachState(t, "kept")
			return attached
		})
		mu.Lock()
		starving = true
		mu.Unlock()
		select {
		case <-lctx.Done():
		case <-time.After(3 * ttl):
			t.Fatal("the keep-alive did not end while every statement was refused")
		}
		mu.Lock()
		starving = false
		mu.Unlock()
		if cause := context.Cause(lctx); !lostForNoRenewal(cause) {
			t.Fatalf("the keep-alive ended with %v, want lost for no renewal", cause)
		}
		if err := context.Cause(kctx); err != nil && !lostForNoRenewal(err) {
			t.Fatalf("the other lease's keep-alive ended: %v", err)
		}
		if err := le.c.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		mustAcquire(t, ops, "kept", time.Minute)
		heldToValidUntil(t, ops, l, 3*ttl)
	})
}

// heldToValidUntil tries ops's TryAcquire of l's name until just before
// l's ValidUntil, each refused, then until it succeeds, within limit. A
// success whose reply came before the ValidUntil fails the test; one whose
// reply came after may have run after it, and ends the first part.
func heldToValidUntil(t *testing.T, ops *Client, l *Lock, limit time.Duration) {
	t.Helper()
	until := l.ValidUntil()
	for time.Until(until) > 50*time.Millisecond {
		o, err := ops.TryAcquire(testCtx(t), l.Name(), time.Minute)
		switch {
		case err == nil && time.Now().Before(until):
			t.Fatalf("taken %v before the holder's ValidUntil (fence %d)", time.Until(until), o.Fence())
		case err == nil:
			return
		case !errors.Is(err, ErrNotAcquired):
			t.Fatalf("TryAcquire: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	waitFor(t, limit, "the name free after its ValidUntil", func() bool {
		_, err := ops.TryAcquire(testCtx(t), l.Name(), time.Minute)
		return err == nil
	})
}

// keptAttached acquires name with le's Client and keeps it alive with
// margin until a round attaches its lease. A margin that leaves about a
// round between a renewal and the deadline can lose the lease, on a
// loaded machine, before any round attaches it: then a new name is tried
// (name-2, name-3). It returns the Lock and its keep-alive's context.
func (le *lateEnv) keptAttached(t *testing.T, name string, ttl, margin time.Duration) (*Lock, context.Context) {
	t.Helper()
	for i := 1; ; i++ {
		n := name
		if i > 1 {
			n = fmt.Sprintf("%s-%d", name, i)
		}
		l := mustAcquire(t, le.c, n, ttl)
		lctx := l.keepAlive(testCtx(t), margin)
		attached := false
		waitFor(t, 20*ttl, n+" attached, or its keep-alive ended", func() bool {
			_, attached, _ = le.attachState(t, n)
			return attached || lctx.Err() != nil
		})
		if attached && lctx.Err() == nil {
			return l, lctx
		}
		if i == 3 {
			t.Fatalf("%s: three keep-alives ended before a round attached their lease: %v", name, context.Cause(lctx))
		}
		_ = l.Release(testCtx(t)) // lost: ErrNotHeld, or gone already
	}
}

// Close racing the rounds of many kept-alive leases leaves nothing behind:
// no lease (Close releases them) and no session row, whatever statement of
// a round is under way when it starts (a round that begins after Close
// opens no session).
func TestSession_closeRacingARound(t *testing.T) {
	eachAttachingEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		const ttl = 1500 * time.Millisecond // 300 ms lost every lease on the loaded CI machine
		for i := range 8 {
			db := e.openDB(t)
			c, err := New(db, WithTable(table), WithHolder(fmt.Sprintf("c%d", i)))
			if err != nil {
				t.Fatal(err)
			}
			warm(t, c)
			_, ctxs, names := keptAlive(t, c, fmt.Sprintf("close%d", i), 20, ttl)
			waitFor(t, 30*ttl, "leases attached", func() bool {
				leases, _ := attachedCount(t, e, table)
				return leases > 0
			})
			time.Sleep(time.Duration(i) * ttl / 24) // a different instant of the round each time
			if err := c.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			time.Sleep(ttl / 3) // a round that was under way ends
			// A lease whose keep-alive a loaded machine starved past its
			// deadline was lost, not held, and Close leaves its row, which
			// may last a safety margin longer: only the others are
			// counted, live by their own end, or their session's for an
			// attached one.
			lost := map[string]bool{}
			for j, lctx := range ctxs {
				lost[names[j]] = lostForNoRenewal(context.Cause(lctx))
			}
			tb := "`" + table + "`"
			rows, err := e.db.QueryContext(testCtx(t), "SELECT l.name FROM "+tb+" AS l "+
				"LEFT JOIN "+tb+" AS s ON l.expires_at = '9999-12-31 23:59:59.999999' AND s.name = LEFT(l.owner, 16) AND s.kind = 'S' "+
				"WHERE l.kind = 'L' AND IF(l.expires_at = '9999-12-31 23:59:59.999999', COALESCE(s.expires_at, '1000-01-01'), l.expires_at) > UTC_TIMESTAMP(6)")
			if err != nil {
				t.Fatal(err)
			}
			var live []string
			for rows.Next() {
				var name string
				if err := rows.Scan(&name); err != nil {
					t.Fatal(err)
				}
				if !lost[name] {
					live = append(live, name)
				}
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			rows.Close()
			var sessions int
			if err := e.db.QueryRowContext(testCtx(t), "SELECT COUNT(*) FROM "+tb+" WHERE kind = 'S'").Scan(&sessions); err != nil {
				t.Fatal(err)
			}
			if len(live) != 0 || sessions != 0 {
				t.Fatalf("after Close %d: live leases %v and %d session rows, want none", i, live, sessions)
			}
		}
	})
}
