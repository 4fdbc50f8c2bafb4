package sqllock

import (
	"database/sql"
	"database/sql/driver"
	"strings"
	"testing"
	"time"
)

// ---------------------------------------------------------------------------
// No statement of a Lock, whatever order its sends arrive in, ends its
// lease before its ValidUntil (queries.sql: acquire, refresh and the set
// and slot statements never move an owner's expiry earlier).

// leaseLeft reads, straight, the shortest lease left by the server's clock
// among the lease rows token owns.
func (le *lateEnv) leaseLeft(t *testing.T, token string) time.Duration {
	t.Helper()
	var us int64
	err := le.straight.QueryRow("SELECT MIN(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at)) FROM `"+le.table+"` WHERE kind = 'L' AND owner = ?", token).Scan(&us)
	if err != nil {
		t.Fatalf("lease left of %q: %v", token, err)
	}
	return time.Duration(us) * time.Microsecond
}

// wantLeaseAtLeast fails t unless every lease row of l lasts past min, and
// l's ValidUntil is not beyond what the server holds.
func (le *lateEnv) wantLeaseAtLeast(t *testing.T, l *Lock, min time.Duration, when string) {
	t.Helper()
	left := le.leaseLeft(t, l.Token())
	if left < min {
		t.Fatalf("%s: lease left %v, want at least %v (ValidUntil says %v: two holders once it ends)", when, left, min, time.Until(l.ValidUntil()).Round(time.Millisecond))
	}
	if until := time.Until(l.ValidUntil()); until > left {
		t.Fatalf("%s: ValidUntil %v ahead, beyond the lease the server holds, %v", when, until, left)
	}
}

// newLateEnvFor is newLateEnv for a test of kind "name", "set" or "slot",
// skipped where that kind is refused.
func newLateEnvFor(t *testing.T, e *testEnv, kind string) *lateEnv {
	t.Helper()
	switch kind {
	case "set":
		skipSetsOnVitess(t, e)
	case "slot":
		slotServer(t, e)
	}
	return newLateEnv(t, e)
}

// acquireKind takes, for ttl, the lease of kind "name" (on name), "set" (on
// name 1 and name 2) or "slot" (a slot of a semaphore of two on name).
func (le *lateEnv) acquireKind(t *testing.T, kind, name string, ttl time.Duration) (*Lock, error) {
	switch kind {
	case "set":
		return le.c.TryAcquireSet(testCtx(t), []string{name + "1", name + "2"}, ttl)
	case "slot":
		return le.c.Semaphore(name, 2).TryAcquire(testCtx(t), ttl)
	}
	return le.c.TryAcquire(testCtx(t), name, ttl)
}

// holdFirst makes the connector hold back the first send mine picks and
// pass everything else.
func (le *lateEnv) holdFirst(mine func(q string, args []driver.NamedValue) bool) {
	sends := 0
	le.lc.setDecide(func(q string, args []driver.NamedValue) lateAction {
		if mine(q, args) {
			if sends++; sends == 1 {
				return hold
			}
		}
		return pass
	})
}

// refreshThenRunHeld refreshes l for a minute, runs the one send held back,
// and fails t unless l's lease still lasts past 30s (when says after
// what); then it releases l.
func (le *lateEnv) refreshThenRunHeld(t *testing.T, l *Lock, when string) {
	t.Helper()
	le.lc.setDecide(nil)
	if err := l.Refresh(testCtx(t), time.Minute); err != nil {
		t.Fatalf("Refresh(1m): %v", err)
	}
	if n := le.lc.runHeld(t, le.straight); n != 1 {
		t.Fatalf("held sends: got %d, want 1", n)
	}
	le.wantLeaseAtLeast(t, l, 30*time.Second, when)
	if err := l.Release(testCtx(t)); err != nil {
		t.Fatal(err)
	}
}

// A Lock acquired for 1s whose first send was held back, and whose resend
// took the name, is refreshed for a minute; the held send then runs. It
// finds the lease ours and must not move its expiry back to 1s ahead.
func TestLate_acquireRunsLateAfterLongerRefresh_keepsTheLease(t *testing.T) {
	for _, kind := range []string{"name", "set", "slot"} {
		t.Run(kind, func(t *testing.T) {
			eachEnv(t, func(t *testing.T, e *testEnv) {
				le := newLateEnvFor(t, e, kind)
				le.holdFirst(func(q string, args []driver.NamedValue) bool {
					switch kind {
					case "set":
						return isSetAcquire(q) && !strings.Contains(q, proofLiteral)
					case "slot":
						return isSlotAcquire(q) && !aboutProof(args)
					}
					return le.is(q, qAcquire) && arg(args, 0) == "r"
				})
				l, err := le.acquireKind(t, kind, "r", time.Second)
				if err != nil {
					t.Fatalf("acquire, first send held: %v", err)
				}
				le.refreshThenRunHeld(t, l, "after the late acquire")
			})
		})
	}
}

// A Lock refreshed for 1s, whose first send of that refresh was held back
// (the resend extended the lease), is refreshed for a minute; the held send
// then runs. It finds the lease ours and must not move its expiry back to
// 1s ahead: Refresh never shortens a lease.
func TestLate_refreshRunsLateAfterLongerRefresh_keepsTheLease(t *testing.T) {
	for _, kind := range []string{"name", "set", "slot"} {
		t.Run(kind, func(t *testing.T) {
			eachEnv(t, func(t *testing.T, e *testEnv) {
				le := newLateEnvFor(t, e, kind)
				l, err := le.acquireKind(t, kind, "f", time.Minute)
				if err != nil {
					t.Fatalf("acquire: %v", err)
				}
				token := l.Token()
				le.holdFirst(func(q string, args []driver.NamedValue) bool {
					if kind == "set" {
						return strings.Contains(q, "INTERVAL 1000000 MICROSECOND") && strings.Contains(q, hexLiteral(token))
					}
					return le.is(q, qRefresh) && arg(args, 2) == token
				})
				if err := l.Refresh(testCtx(t), time.Second); err != nil {
					t.Fatalf("Refresh(1s), first send held: %v", err)
				}
				le.refreshThenRunHeld(t, l, "after the late Refresh(1s)")
			})
		})
	}
}

// runHeldAnyway runs the statements held back so far, as runHeld does, and
// returns how many ran and how many the server refused (a set's acquire
// fails with 1690 on another owner's lease).
func (lc *lateConnector) runHeldAnyway(db *sql.DB) (ran, refused int) {
	lc.mu.Lock()
	held := lc.held
	lc.held = nil
	lc.mu.Unlock()
	for _, h := range held {
		if _, err := db.Exec(h.query, h.args...); err != nil {
			refused++
		}
	}
	return len(held), refused
}

// A release with a minimum hold (Do's WithMinHold) keeps the lease until
// acquired_at + the hold and no longer: a send of the Lock's acquire or
// refresh that runs after it must not prolong it (nor revive it). The
// release leaves the lease under the token's released form.
func TestLate_sendAfterMinHoldRelease_doesNotProlong(t *testing.T) {
	for _, kind := range []string{"acquire", "refresh", "set acquire", "set refresh", "slot acquire"} {
		t.Run(kind, func(t *testing.T) {
			eachEnv(t, func(t *testing.T, e *testEnv) {
				set := strings.HasPrefix(kind, "set")
				switch {
				case set:
					skipSetsOnVitess(t, e)
				case strings.HasPrefix(kind, "slot"):
					slotServer(t, e)
				}
				le := newLateEnv(t, e)
				sends := 0
				var token string
				le.lc.setDecide(func(q string, args []driver.NamedValue) lateAction {
					var mine bool
					switch kind {
					case "acquire":
						mine = le.is(q, qAcquire) && arg(args, 0) == "m"
					case "refresh":
						mine = le.is(q, qRefresh) && arg(args, 2) == token
					case "set acquire":
						mine = isSetAcquire(q) && !strings.Contains(q, proofLiteral)
					case "set refresh":
						mine = token != "" && strings.HasPrefix(q, "UPDATE") && strings.Contains(q, "expires_at = GREATEST(") && strings.Contains(q, hexLiteral(token))
					case "slot acquire":
						mine = isSlotAcquire(q) && !aboutProof(args)
					}
					if mine {
						if sends++; sends == 1 {
							return hold
						}
					}
					return pass
				})
				var l *Lock
				var err error
				switch {
				case set:
					l, err = le.c.TryAcquireSet(testCtx(t), []string{"m1", "m2"}, time.Minute)
				case kind == "slot acquire":
					l, err = le.c.Semaphore("m", 1).TryAcquire(testCtx(t), time.Minute)
				default:
					l, err = le.c.TryAcquire(testCtx(t), "m", time.Minute)
				}
				if err != nil {
					t.Fatalf("acquire: %v", err)
				}
				if strings.HasSuffix(kind, "refresh") {
					token = l.Token()
					if err := l.Refresh(testCtx(t), time.Hour); err != nil {
						t.Fatalf("Refresh, first send held: %v", err)
					}
				}
				le.lc.setDecide(nil)
				if err := l.release(testCtx(t), 2*time.Second, nil); err != nil {
					t.Fatalf("release with a minimum hold: %v", err)
				}
				if n, _ := le.lc.runHeldAnyway(le.straight); n != 1 {
					t.Fatalf("held sends: got %d, want 1", n)
				}
				var left int64
				if err := le.straight.QueryRow("SELECT MAX(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at)) FROM `" + le.table + "` WHERE kind = 'L'").Scan(&left); err != nil {
					t.Fatal(err)
				}
				if d := time.Duration(left) * time.Microsecond; d > 2*time.Second {
					t.Fatalf("after the late send: a lease lasts %v, want at most the 2s minimum hold", d)
				}
			})
		})
	}
}
