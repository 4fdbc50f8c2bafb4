package sqllock

import (
	"context"
	"database/sql/driver"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/fault"
)

// ---------------------------------------------------------------------------
// Statements that run late, on a real server

// Issue 20, point 1. An Acquire's first attempt commits but its reply is
// lost, and the DELETE that cleans up after it fails on the client, then
// runs on the server after the call's next attempt took the lease. It must
// not delete the lease of the Lock the call returned: the next attempt
// sends another token.
func TestLate_cleanupDeleteRunsLate_keepsTheLock(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		le := newLateEnv(t, e, WithRetry(LinearBackoff(5*time.Millisecond)))
		acquires, releases := 0, 0
		le.lc.setDecide(func(q string, args []driver.NamedValue) lateAction {
			switch {
			case le.is(q, qAcquire) && arg(args, 0) == "x":
				if acquires++; acquires <= fault.MaxTransientAttempts {
					return lose // the attempt's every send: outcome unknown
				}
			case le.is(q, qRelease) && arg(args, 0) == "x":
				if releases++; releases <= fault.MaxTransientAttempts {
					return hold // the cleanup's every send: fails here, runs later
				}
			}
			return pass
		})
		l, err := le.c.Acquire(testCtx(t), "x", time.Minute)
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		if n := le.lc.runHeld(t, le.straight); n == 0 {
			t.Fatal("no cleanup DELETE was held back: the test did not make the race")
		}
		if owner, _ := le.owner(t, "x"); owner != l.Token() {
			t.Fatalf("owner after the late DELETE: got %q, want the Lock's %q (two holders)", owner, l.Token())
		}
		_, err = le.witness.TryAcquire(testCtx(t), "x", time.Minute)
		wantErrIs(t, err, ErrNotAcquired)
		if err := l.Release(testCtx(t)); err != nil {
			t.Fatalf("Release: %v", err)
		}
	})
}

// Issue 20, point 2. A TryAcquire's first send is lost and runs late; its
// resend is refused, the name being another's. When the late send takes the
// name after that owner's release, under a token nobody holds, the Client's
// next acquire of the name must delete that lease, not wait out its ttl.
func TestLate_lostSendTakesNameLater_notBlocked(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		le := newLateEnv(t, e)
		other := mustAcquire(t, le.witness, "y", time.Minute)
		sends := 0
		le.lc.setDecide(func(q string, args []driver.NamedValue) lateAction {
			if le.is(q, qAcquire) && arg(args, 0) == "y" {
				if sends++; sends == 1 {
					return hold
				}
			}
			return pass
		})
		_, err := le.c.TryAcquire(testCtx(t), "y", time.Minute)
		wantErrIs(t, err, ErrNotAcquired)
		if err := other.Release(testCtx(t)); err != nil {
			t.Fatal(err)
		}
		le.lc.setDecide(nil)
		if n := le.lc.runHeld(t, le.straight); n != 1 {
			t.Fatalf("held sends: got %d, want 1", n)
		}
		if owner, _ := le.owner(t, "y"); owner == "" {
			t.Fatal("the late send did not take the name: the test did not make the race")
		}
		l, err := le.c.TryAcquire(testCtx(t), "y", time.Minute)
		if err != nil {
			t.Fatalf("TryAcquire after the late send: got %v, want the name (its lease has no holder)", err)
		}
		if err := l.Release(testCtx(t)); err != nil {
			t.Fatal(err)
		}
	})
}

// Issue 20, point 3. An Acquire attempt whose every send was lost (none ran
// yet) is followed by one that takes the lease; the lost sends then run
// late. They must leave the Lock's lease as it is: neither its owner nor its
// expiry moves (a late send that took the "already ours" branch would set an
// expiry from its own start, which may be earlier than the Lock's
// ValidUntil).
func TestLate_acquireRunsLateUnderTheLock_leaseUntouched(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		le := newLateEnv(t, e, WithRetry(LinearBackoff(5*time.Millisecond)))
		sends := 0
		le.lc.setDecide(func(q string, args []driver.NamedValue) lateAction {
			if le.is(q, qAcquire) && arg(args, 0) == "z" {
				if sends++; sends <= fault.MaxTransientAttempts {
					return hold
				}
			}
			return pass
		})
		l, err := le.c.Acquire(testCtx(t), "z", time.Minute)
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		owner, expires := le.owner(t, "z")
		if owner != l.Token() {
			t.Fatalf("owner: got %q, want the Lock's %q", owner, l.Token())
		}
		time.Sleep(10 * time.Millisecond) // so that a late expiry would differ
		if n := le.lc.runHeld(t, le.straight); n != fault.MaxTransientAttempts {
			t.Fatalf("held sends: got %d, want %d", n, fault.MaxTransientAttempts)
		}
		if gotOwner, gotExpires := le.owner(t, "z"); gotOwner != owner || gotExpires != expires {
			t.Fatalf("lease after the late sends: got owner %q expiring %s, want %q expiring %s", gotOwner, gotExpires, owner, expires)
		}
		if err := l.Release(testCtx(t)); err != nil {
			t.Fatal(err)
		}
		// The late sends were refused, and left nothing behind.
		if owner, _ := le.owner(t, "z"); owner != "" {
			t.Fatalf("after Release: a lease of %q is left", owner)
		}
	})
}

// An acquire whose first send was lost and whose resend took the name
// returns a Lock under that token. If the lost send runs after the Lock's
// release, it takes the name under a token nobody holds: the release hands
// the token to the orphan list, and the Client's next acquire of the name
// deletes that lease first.
func TestLate_lostSendTakesNameAfterRelease_notBlocked(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		le := newLateEnv(t, e)
		sends := 0
		le.lc.setDecide(func(q string, args []driver.NamedValue) lateAction {
			if le.is(q, qAcquire) && arg(args, 0) == "w" {
				if sends++; sends == 1 {
					return hold
				}
			}
			return pass
		})
		l, err := le.c.TryAcquire(testCtx(t), "w", time.Minute)
		if err != nil {
			t.Fatalf("TryAcquire: %v", err)
		}
		if err := l.Release(testCtx(t)); err != nil {
			t.Fatal(err)
		}
		le.lc.setDecide(nil)
		if n := le.lc.runHeld(t, le.straight); n != 1 {
			t.Fatalf("held sends: got %d, want 1", n)
		}
		if owner, _ := le.owner(t, "w"); owner != l.Token() {
			t.Fatalf("the late send did not take the name under the released token: the test did not make the race (owner %q)", owner)
		}
		again, err := le.c.TryAcquire(testCtx(t), "w", time.Minute)
		if err != nil {
			t.Fatalf("TryAcquire after the late send: got %v, want the name (its lease has no holder)", err)
		}
		if err := again.Release(testCtx(t)); err != nil {
			t.Fatal(err)
		}
	})
}

// Issue 20, point 6. An acquire whose outcome stays unknown and whose
// cleanup fails after Close has made its pass over the orphan list: the
// token is remembered too late for that pass, so it is deleted at once, and
// the name is not left blocked for the lease.
func TestLate_orphanAfterClose_deleted(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		le := newLateEnv(t, e)
		acquires, releases := 0, 0
		le.lc.setDecide(func(q string, args []driver.NamedValue) lateAction {
			switch {
			case le.is(q, qAcquire) && arg(args, 0) == "c":
				if acquires++; acquires == 1 {
					return loseSlow // runs; its reply is lost while Close runs
				}
				return lose
			case le.is(q, qRelease) && arg(args, 0) == "c":
				if releases++; releases <= fault.MaxTransientAttempts {
					return hold // the cleanup fails
				}
			}
			return pass
		})
		done := make(chan error, 1)
		go func() {
			_, err := le.c.TryAcquire(testCtx(t), "c", time.Minute)
			done <- err
		}()
		time.Sleep(slowPause / 3) // the acquire has run on the server
		if err := le.c.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if err := <-done; err == nil {
			t.Fatal("TryAcquire through a lost reply and a Close: got a Lock, want an error")
		}
		if owner, _ := le.owner(t, "c"); owner != "" {
			t.Fatalf("after Close and the failed cleanup: the lease of %q is left, blocking the name", owner)
		}
	})
}

// A set's acquire whose first send runs late, after the Lock the call
// returned was released, takes the names under a token nobody holds: the
// Client's next acquire of them deletes those leases first.
func TestLate_setSendTakesNamesAfterRelease_notBlocked(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipSetsOnVitess(t, e)
		le := newLateEnv(t, e)
		sends := 0
		le.lc.setDecide(func(q string, _ []driver.NamedValue) lateAction {
			if isSetAcquire(q) && !strings.Contains(q, proofLiteral) {
				if sends++; sends == 1 {
					return hold
				}
			}
			return pass
		})
		l, err := le.c.TryAcquireSet(testCtx(t), []string{"v1", "v2"}, time.Minute)
		if err != nil {
			t.Fatalf("TryAcquireSet, first send held: %v", err)
		}
		le.lc.setDecide(nil)
		if err := l.Release(testCtx(t)); err != nil {
			t.Fatal(err)
		}
		if n := le.lc.runHeld(t, le.straight); n != 1 {
			t.Fatalf("held sends: got %d, want 1", n)
		}
		if owner, _ := le.owner(t, "v2"); owner == "" {
			t.Fatal("the late send did not take the names: the test did not make the race")
		}
		l, err = le.c.TryAcquireSet(testCtx(t), []string{"v1", "v2"}, time.Minute)
		if err != nil {
			t.Fatalf("TryAcquireSet after the late send: got %v, want the names (their leases have no holder)", err)
		}
		if err := l.Release(testCtx(t)); err != nil {
			t.Fatal(err)
		}
	})
}

// A lease whose acquire was sent twice (its first send held back, its
// resend took the name) and that Do's release keeps for a minimum hold is
// kept on purpose: the token goes to the orphan list, for a late send of
// the acquire, but the Client's next acquire must not delete that lease as
// an orphan and run the job again at once. For one name, a set and a slot.
func TestLate_minHoldSentTwice_notRunAgain(t *testing.T) {
	eachLateKind(t, eachServerEnv, func(t *testing.T, k lateKind, le *lateEnv) {
		ctx := testCtx(t)
		sends := 0
		le.lc.setDecide(func(q string, args []driver.NamedValue) lateAction {
			if k.isAcquire(le, q, args, "mh") {
				if sends++; sends == 1 {
					return hold // never run: the late send is another test's
				}
			}
			return pass
		})
		runs := 0
		job := func(context.Context, *Lock) error { runs++; return nil }
		do := func() error {
			return lockDo(k.acquire(ctx, le.c, "mh", 1, time.Minute))(ctx, job, WithMinHold(time.Hour))
		}
		if err := do(); err != nil {
			t.Fatalf("first TryAcquire and Do: %v", err)
		}
		if sends < 2 {
			t.Fatalf("acquire sends: got %d, want 2: the test did not send it twice", sends)
		}
		err := do()
		if !errors.Is(err, ErrNotAcquired) || runs != 1 {
			t.Fatalf("second TryAcquire within the minimum hold: got %v, %d runs, want ErrNotAcquired and 1 run", err, runs)
		}
	})
}

// An acquire whose every reply is lost was sent several times with one
// token; the cleanup DELETE removes the lease one send wrote. Another send,
// held back (a proxy's queue, a starved server thread), commits after that
// DELETE: the token must still be remembered, so that the Client's next
// acquire deletes that lease instead of finding the name blocked for the
// ttl. For one name, a set and a slot.
func TestLate_resentAcquireCommitsAfterCleanup_notBlocked(t *testing.T) {
	eachLateKind(t, eachServerEnv, func(t *testing.T, k lateKind, le *lateEnv) {
		ctx := testCtx(t)
		sends := 0
		le.lc.setDecide(func(q string, args []driver.NamedValue) lateAction {
			if !k.isAcquire(le, q, args, "rs") {
				return pass
			}
			if sends++; sends == 1 {
				return hold // in flight until the test runs it
			}
			return lose // runs; its reply is lost
		})
		try := func() error {
			l, err := k.acquire(ctx, le.c, "rs", 1, time.Hour)
			if err == nil {
				err = l.Release(ctx)
			}
			return err
		}
		if err := try(); err == nil {
			t.Fatal("acquire with every reply lost: got a Lock, want an error")
		}
		if sends != fault.MaxTransientAttempts {
			t.Fatalf("sends: got %d, want %d", sends, fault.MaxTransientAttempts)
		}
		le.lc.setDecide(nil)
		if n := le.lc.runHeld(t, le.straight); n != 1 {
			t.Fatalf("held sends: got %d, want 1", n)
		}
		var held int
		if err := le.straight.QueryRow("SELECT COUNT(*) FROM `" + le.table + "` WHERE kind = 'L' AND owner <> '' AND expires_at > UTC_TIMESTAMP(6) AND name LIKE 'rs%'").Scan(&held); err != nil || held == 0 {
			t.Fatalf("leases after the held send ran: got %d, %v: the test did not make the race", held, err)
		}
		if err := try(); err != nil {
			t.Fatalf("the Client's next acquire after the held send committed: got %v, want it (its lease has no holder)", err)
		}
	})
}

// A slot acquire whose first send is held back and whose resend takes slot 2
// (slot 1 being another's) returns a Lock on slot 2. The first send, run
// late after slot 1 was released, takes slot 1 under the same token; it
// must leave slot 2 the Lock's: the Lock's Refresh succeeds, and a third
// Client cannot take slot 2.
func TestLate_slotSendRunsLate_lockKeepsItsSlot(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		slotServer(t, e)
		le := newLateEnv(t, e)
		ctx := testCtx(t)
		first := mustSlot(t, le.witness, "mv", 2, time.Minute)
		firstSlotSend(le, hold)
		l, err := le.c.Semaphore("mv", 2).TryAcquire(ctx, time.Minute)
		if err != nil || l.Slot() != 2 {
			t.Fatalf("Semaphore.TryAcquire, first send held: got %v, %v, want slot 2", l, err)
		}
		le.lc.setDecide(nil)
		if err := first.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if n := le.lc.runHeld(t, le.straight); n != 1 {
			t.Fatalf("held sends: got %d, want 1", n)
		}
		if owner, _ := le.owner(t, slotName("mv", 1)); owner != l.Token() {
			t.Fatalf("slot 1 after the late send: owner %q, want the Lock's token: the test did not make the race", owner)
		}
		if err := l.Refresh(ctx, time.Minute); err != nil {
			t.Fatalf("Refresh of the Lock on slot %d after the late send: %v", l.Slot(), err)
		}
		third := e.client(t, e.openDB(t), le.table)
		if got, err := third.Semaphore("mv", 2).TryAcquire(ctx, time.Minute); err == nil {
			t.Fatalf("a third Client: got slot %d while the Lock reports slot %d, want ErrNotAcquired", got.Slot(), l.Slot())
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// A slot acquire whose first send is held back, and runs only after the
// slot its resend took was attached to the Client's session, finds the slot
// its own and live: it leaves it attached (its expiry 9999, the session's
// to keep), neither detached to the send's own ttl nor ended.
func TestLate_slotSendRunsLateOnItsAttachedSlot(t *testing.T) {
	eachAttachingEnv(t, func(t *testing.T, e *testEnv) {
		slotServer(t, e)
		le := newLateEnv(t, e)
		ctx := testCtx(t)
		warm(t, le.c)
		firstSlotSend(le, hold)
		const ttl = 1500 * time.Millisecond
		l, err := le.c.Semaphore("att", 1).TryAcquire(ctx, ttl)
		if err != nil {
			t.Fatalf("Semaphore.TryAcquire, first send held: %v", err)
		}
		le.lc.setDecide(nil)
		kctx := l.KeepAlive(ctx)
		row := slotName("att", 1)
		attached := func() bool {
			_, yes, _ := le.attachState(t, row)
			return yes
		}
		waitFor(t, 20*ttl, "the slot attached", attached)
		if n := le.lc.runHeld(t, le.straight); n != 1 {
			t.Fatalf("held sends: got %d, want 1", n)
		}
		if owner, yes, _ := le.attachState(t, row); owner != l.Token() || !yes {
			t.Fatalf("after the late send: owner %q (the Lock's %q), attached %v; want the Lock's, attached", owner, l.Token(), yes)
		}
		time.Sleep(2 * ttl)
		if err := context.Cause(kctx); err != nil && !lostForNoRenewal(err) {
			t.Fatalf("the keep-alive after the late send: %v", err)
		}
		if kctx.Err() == nil && !attached() {
			t.Fatal("two ttl after the late send: the slot is no longer attached")
		}
	})
}

// A slot acquire whose first send takes slot 2 (slot 1 being another's) and
// loses its reply, and whose resend finds slot 1 free, returns a Lock on
// slot 1 and gives slot 2 back at once: the token holds one slot.
func TestLate_slotResendTakesEarlierSlot_holdsOne(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		slotServer(t, e)
		le := newLateEnv(t, e)
		ctx := testCtx(t)
		first := mustSlot(t, le.witness, "one", 2, time.Minute)
		sends := 0
		le.lc.setDecide(func(q string, args []driver.NamedValue) lateAction {
			if isSlotAcquire(q) && !aboutProof(args) {
				switch sends++; sends {
				case 1:
					return lose // takes slot 2; the reply is lost
				case 2:
					if err := first.Release(ctx); err != nil {
						t.Error(err)
					}
				}
			}
			return pass
		})
		l, err := le.c.Semaphore("one", 2).TryAcquire(ctx, time.Minute)
		if err != nil || l.Slot() != 1 || sends != 2 {
			t.Fatalf("Semaphore.TryAcquire: got %v, %v after %d sends, want slot 1 after 2", l, err, sends)
		}
		var n int
		if err := le.straight.QueryRow("SELECT COUNT(*) FROM `"+le.table+"` WHERE kind = 'L' AND owner = ?", l.Token()).Scan(&n); err != nil || n != 1 {
			t.Fatalf("rows of the token: got %d, %v, want 1", n, err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
}
