package wait

import (
	"context"
	"errors"
	"time"

	"github.com/sqllock/sqllock/internal/fault"
)

// Every kind of waiting acquire (one name, a set, a semaphore's slot)
// waits in Acquire, in one loop, on this package's machinery: the Client's
// fair queue of callers per key, whose head alone sends statements; the
// key's wake-up channel, which hands the key from one process to the next;
// the look, which asks about many names in one statement; and the bound on
// the waiting calls' statements. What a kind differs in is its Call.

// A Call is one waiting acquire, as its kind of lease makes it, used by one
// goroutine. Its Key names its queue in the Client and its wake-up channel:
// each kind makes its own, and no two kinds share one.
type Call interface {
	// Key names the call's queue and wake-up channel; Label what it waits
	// for in Config.Woke's events; Op begins its errors: `acquire "x"`.
	Key() string
	Label() string
	Op() string
	// TTL bounds a wait on the key's channel (its lease's ttl, or less).
	TTL() time.Duration
	// Look is the one lease name a look can answer for now, or "" when
	// none: the look is single names' alone.
	Look() string
	// Shared reports whether the key may be held by several leases at
	// once (a semaphore of more than one slot without lanes): then an
	// acquisition does not make the next caller in line wait, and the
	// lease does not keep the channel.
	Shared() bool
	// Final reports whether err, which wraps Config.NotAcquired, ends the
	// call at once instead of counting as a refused attempt.
	Final(err error) bool
	// Backoff is the Client's retry strategy: how long to wait after the
	// attempt-th refused attempt, and false when it gives up.
	Backoff(attempt int) (wait time.Duration, ok bool)
	// Attempt sends one attempt. Taken, the call keeps its lease, and
	// lease reports when the lease could expire at the earliest and
	// whether its release started: the Hold's lapse reads it.
	Attempt(ctx context.Context) (lease func() (until time.Time, ended bool), err error)
}

// Acquire waits for call's lease, for a strategy that may retry: the call
// joins its key's queue and waits there, trying only while it is the head.
// With wake-up channels on, the head of a key this Client waited for waits
// on the channel instead of sleeping between attempts. Taken, it returns
// the lease's Hold of the channel, for its release to call; nil when the
// channels are off.
func (e *Engine) Acquire(ctx context.Context, call Call) (*Hold, error) {
	key := call.Key()
	taken := false
	ws := &e.channels
	t := e.queues.join(key)
	useWake := ws.on && ws.contended(key)
	waited := false        // refused, or queued behind another process
	var behind ownLease    // the head's wait behind a lease of this Client
	refusedBefore := false // an attempt of this call was refused
	defer func() {
		if ws.on && (!taken || call.Shared()) && e.queues.waiting(key) == 0 {
			// Nobody here waits for the key any more: the next process
			// may have the channel this queue holds.
			ws.letGo(ctx, key, nil)
		}
	}()
	for {
		gaveUp, head, due := t.turn()
		if gaveUp {
			refusal, held := t.refusal()
			if refusal != nil {
				return nil, e.errorf("%s: %w: the retry strategy gave up (last error: %w)", call.Op(), e.notAcquired, refusal)
			}
			if held == nil {
				held = e.errorf("%s: %w: the retry strategy gave up", call.Op(), e.notAcquired)
			}
			return nil, held
		}
		if head && !useWake && ws.on {
			// A release of this Client that had waited for the key
			// makes the queue wait behind the other processes.
			useWake = ws.contended(key)
		}
		granted := false // the channel woke this head: the key was let go of
		if head && useWake {
			if e.ahead != nil {
				e.ahead(ctx)
			}
			began := time.Now()
			st, queued, err := ws.wait(ctx, key, call.TTL())
			if err == nil && (st != stFailed || !ws.refused.Load()) {
				ws.told(call.Label(), st, time.Since(began))
			}
			if err != nil {
				t.leave()
				return nil, e.ended(call, err, t)
			}
			waited = waited || queued
			granted = st == stGranted
			if st == stGranted || st == stTimedOut {
				due = 0 // the channel was the wait
			}
			due = behind.wait(st, due, call.TTL(), t.kickPending())
		}
		kicked := false // a release of this Client woke this head
		if head && due <= 0 {
			kicked = t.takeKick() // this attempt sees every release so far
		}

		if !head || due > 0 {
			if err := t.sleep(ctx, head, due); err != nil {
				t.leave()
				return nil, e.ended(call, err, t)
			}
			continue
		}

		if refusedBefore && !granted && !kicked && e.queues.keys() > lookAbove {
			if name := call.Look(); name != "" {
				// The name was held at the last answer, and this Client
				// waits for many: ask whether it is free, with the other
				// names due now, in one statement (look.go), and send the
				// acquire only if it is.
				held, err := e.looks.held(ctx, name)
				if err != nil && (errors.Is(err, e.closed) || fault.CtxErr(ctx) != nil) {
					t.leave()
					return nil, e.ended(call, err, t)
				}
				if err == nil && held {
					t.setHeld(e.heldBy(name))
					if ws.on {
						ws.waited(key) // as a refused acquire does
					}
					if !t.refused(call) {
						return nil, e.heldBy(name)
					}
					continue
				}
				// Free, or the look failed: the acquire decides.
			}
		}
		if err := e.enterAttempt(ctx); err != nil {
			t.leave()
			return nil, e.ended(call, err, t)
		}
		lease, err := call.Attempt(ctx)
		e.exitAttempt()
		if err == nil {
			var h *Hold
			if ws.on {
				h = &Hold{e: e, key: key, lease: lease, contended: waited, probe: !waited}
				if !call.Shared() {
					// The channel the queue holds, if any, goes with the
					// lease: whichever head waited on it. A semaphore's
					// other slots may be free: its queue keeps the
					// channel, and lets go of it when it empties.
					ws.handTo(ctx, key, h, h.adopt)
				}
				if waited {
					ws.waited(key)
				}
			}
			t.acquired(call, call.Shared())
			taken = true
			return h, nil
		}
		// The context is read once: it may end at any moment, and a caller
		// whose context ended must see its error whatever the answer was.
		cerr := fault.CtxErr(ctx)
		switch {
		case cerr == nil && errors.Is(err, e.notAcquired) && !call.Final(err):
			t.setHeld(err)
			waited, refusedBefore = true, true
			if ws.on {
				useWake = true
				ws.waited(key) // the callers behind this one wait on the channel too
			}
		case cerr == nil && e.passable(err):
			// A failover, a restart, a full server: it may pass, so it
			// counts as a refused attempt; the last one says why the call
			// failed if it does not, for every caller in the queue.
			t.setRefusal(err)
		default:
			t.leave()
			return nil, e.failed(call, err, cerr, t)
		}
		if !t.refused(call) {
			return nil, err
		}
	}
}

// An ownLease is a head's wait behind a lease of its own Client that holds
// the key's channel (stLockHeld). That lease's release lets go of the
// channel, which wakes the process waiting first on it, and then kicks the
// head, which queues on the channel behind it; its loss or lapse kicks the
// head too. Were the head to poll meanwhile, its poll could fall between
// the release statement and the woken process's acquire, and take the name
// (or the slot) from it: that process, refused, would hold the channel and
// poll on its strategy, and the one hand-over took up to the strategy's
// longest wait. So the head sends nothing until it is kicked; past ttl
// without a kick (a lease kept by a Client whose keep-alive is stuck, say)
// it polls once, then waits again.
type ownLease struct{ until time.Time }

// wait returns how long the head waits before it tries, given what its
// wait on the channel came to (st), when its strategy would have it try
// (due), and whether a kick is pending: unchanged unless st is stLockHeld.
func (o *ownLease) wait(st state, due, ttl time.Duration, kicked bool) time.Duration {
	if st != stLockHeld || kicked {
		o.until = time.Time{}
		return due
	}
	now := time.Now()
	if o.until.IsZero() {
		o.until = now.Add(ttl)
	}
	if !now.Before(o.until) {
		o.until = time.Time{} // poll once
		return due
	}
	return max(due, o.until.Sub(now))
}

// failed is the error of call whose attempt failed with err, which ends
// it; cerr is its context's error, read once after the attempt.
func (e *Engine) failed(call Call, err, cerr error, t *ticket) error {
	lastErr, _ := t.refusal()
	if cerr != nil && !errors.Is(err, cerr) {
		if lastErr == nil && !errors.Is(err, e.notAcquired) {
			lastErr = err
		}
		if lastErr != nil {
			return e.errorf("%s: %w: %w (last error: %w)", call.Op(), e.notAcquired, cerr, lastErr)
		}
		return e.errorf("%s: %w: %w", call.Op(), e.notAcquired, cerr)
	}
	if cerr != nil && lastErr != nil && errors.Is(err, cerr) {
		// The attempt was cut by ctx; the refusal before it says why.
		return e.errorf("%s: %w: %w (last error: %w)", call.Op(), e.notAcquired, cerr, lastErr)
	}
	if cerr != nil && !errors.Is(err, e.notAcquired) {
		// ctx ended within the attempt (a first use's proof, say):
		// nothing was taken.
		return e.errorf("%s: %w: %w", call.Op(), e.notAcquired, err)
	}
	return err
}

// ended is the error of call whose wait in t ended with err (its
// context's, or the Client's closed error), with the last passable error
// since the last answer, if any.
func (e *Engine) ended(call Call, err error, t *ticket) error {
	lastErr, _ := t.refusal()
	switch {
	case errors.Is(err, e.closed):
		return err
	case lastErr != nil:
		return e.errorf("%s: %w: %w (last error: %w)", call.Op(), e.notAcquired, err, lastErr)
	}
	return e.errorf("%s: %w: %w", call.Op(), e.notAcquired, err)
}

// enterAttempt waits for one of the Client's maxWaitingAttempts slots for
// a waiting call's acquire statement; the caller gives it back with
// exitAttempt. Its error is ctx's, or the Client's closed error.
func (e *Engine) enterAttempt(ctx context.Context) error {
	select {
	case e.attempts <- struct{}{}:
		return nil
	default:
	}
	select {
	case e.attempts <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-e.queues.closing:
		return e.queues.closed
	}
}

func (e *Engine) exitAttempt() { <-e.attempts }
