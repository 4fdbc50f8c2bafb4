package sqllock

import (
	"database/sql"
	"database/sql/driver"
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

// lateShortLease is the lease a held send would move the expiry back to:
// far below the 30s refreshThenRunHeld wants left, and long enough to
// outlast the steps before that Refresh on a loaded machine.
const lateShortLease = 5 * time.Second

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

// A Lock acquired for 5s whose first send was held back, and whose resend
// took the name, is refreshed for a minute; the held send then runs. It
// finds the lease ours and must not move its expiry back to 5s ahead. (5s,
// not 1s: on a loaded machine a 1s lease ran out before the Refresh.)
func TestLate_acquireRunsLateAfterLongerRefresh_keepsTheLease(t *testing.T) {
	eachLateKind(t, eachEnv, func(t *testing.T, k lateKind, le *lateEnv) {
		le.holdFirst(func(q string, args []driver.NamedValue) bool { return k.isAcquire(le, q, args, "r") })
		l, err := k.acquire(testCtx(t), le.c, "r", 2, lateShortLease)
		if err != nil {
			t.Fatalf("acquire, first send held: %v", err)
		}
		le.refreshThenRunHeld(t, l, "after the late acquire")
	})
}

// A Lock refreshed for 5s, whose first send of that refresh was held back
// (the resend extended the lease), is refreshed for a minute; the held send
// then runs. It finds the lease ours and must not move its expiry back to
// 5s ahead: Refresh never shortens a lease.
func TestLate_refreshRunsLateAfterLongerRefresh_keepsTheLease(t *testing.T) {
	eachLateKind(t, eachEnv, func(t *testing.T, k lateKind, le *lateEnv) {
		l, err := k.acquire(testCtx(t), le.c, "f", 2, time.Minute)
		if err != nil {
			t.Fatalf("acquire: %v", err)
		}
		token := l.Token()
		le.holdFirst(func(q string, args []driver.NamedValue) bool { return k.isRefresh(le, q, args, token) })
		if err := l.Refresh(testCtx(t), lateShortLease); err != nil {
			t.Fatalf("Refresh(5s), first send held: %v", err)
		}
		le.refreshThenRunHeld(t, l, "after the late Refresh(5s)")
	})
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
	for _, refresh := range []bool{false, true} {
		op := map[bool]string{false: "acquire", true: "refresh"}[refresh]
		t.Run(op, func(t *testing.T) {
			eachLateKind(t, eachEnv, func(t *testing.T, k lateKind, le *lateEnv) {
				sends := 0
				var token string
				le.lc.setDecide(func(q string, args []driver.NamedValue) lateAction {
					mine := k.isAcquire(le, q, args, "m")
					if refresh {
						mine = k.isRefresh(le, q, args, token)
					}
					if mine {
						if sends++; sends == 1 {
							return hold
						}
					}
					return pass
				})
				l, err := k.acquire(testCtx(t), le.c, "m", 1, time.Minute)
				if err != nil {
					t.Fatalf("acquire: %v", err)
				}
				if refresh {
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
