package sqllock

import (
	"context"
	"errors"

	"github.com/sqllock/sqllock/internal/engine"
	"github.com/sqllock/sqllock/internal/wait"
)

// Every kind of waiting acquire (Acquire of one name, AcquireSet of a set,
// Semaphore.Acquire of a semaphore) waits here, in one loop, on the machinery of
// internal/wait: the Client's fair queue of callers per key, whose head
// alone sends statements; the key's wake-up channel, which hands the key
// from one process to the next; the look, which asks about many names in
// one statement; and the bound on the waiting calls' statements. What a
// kind differs in is its waitCall (wait_kinds.go).

// acquireQueued is the wait of every kind of acquire (wait_kinds.go) for
// a strategy that may retry: the call joins its key's queue and waits
// there, trying only while it is the head. With wake-up channels on
// (internal/wait), the head of a key this Client waited for waits on the channel
// instead of sleeping between attempts.
func (c *Client) acquireQueued(ctx context.Context, call waitCall) (*Lock, error) {
	key, ttl := call.key(), call.leaseTTL()
	var lock *Lock // set when the call returns one
	e := &c.wait
	chans := &e.Channels
	t := e.Queues.Join(key)
	useWake := chans.On() && chans.Contended(key)
	waited := false        // refused, or queued behind another process
	refusedBefore := false // an attempt of this call was refused
	defer func() {
		if chans.On() && (lock == nil || call.shared()) && e.Queues.Waiting(key) == 0 {
			// Nobody here waits for the key any more: the next process
			// may have the channel this queue holds.
			chans.LetGo(ctx, key, nil)
		}
	}()
	for {
		gaveUp, head, due := t.Turn()
		if gaveUp {
			refusal, held := t.Refusal()
			if refusal != nil {
				return nil, errorf("%s: %w: the retry strategy gave up (last error: %w)", call.op(), ErrNotAcquired, refusal)
			}
			if held == nil {
				held = errorf("%s: %w: the retry strategy gave up", call.op(), ErrNotAcquired)
			}
			return nil, held
		}
		if head && !useWake && chans.On() {
			// A release of this Client that had waited for the key
			// makes the queue wait behind the other processes.
			useWake = chans.Contended(key)
		}
		granted := false // the channel woke this head: the key was let go of
		if head && useWake {
			// The table's recheck (internal/engine/tablecheck.go) goes before the wait
			// when it comes due within half its period: a wake-up then
			// within that half finds it fresh, and the acquire follows it
			// at once, not after the recheck's round trip. A difference
			// found now is the acquire's answer.
			_ = c.eng.TableCheckAhead(ctx, engine.TableRecheckEvery/2)
			began := c.obsNow(c.obs.Wakeup != nil)
			st, queued, err := chans.Wait(ctx, key, ttl)
			c.waitWoke(call.label(), st, err, began)
			if err != nil {
				t.Leave()
				return nil, waitEnded(call, err, t)
			}
			waited = waited || queued
			granted = st == wait.Granted
			if st == wait.Granted || st == wait.TimedOut {
				due = 0 // the channel was the wait
			}
		}
		kicked := false // a Release of this Client woke this head
		if head && due <= 0 {
			kicked = t.TakeKick() // this attempt sees every release so far
		}

		if !head || due > 0 {
			if err := t.Sleep(ctx, head, due); err != nil {
				t.Leave()
				return nil, waitEnded(call, err, t)
			}
			continue
		}

		if name := call.lookName(); name != "" && refusedBefore && !granted && !kicked && e.Queues.Len() > wait.LookAbove && !c.orphans.Has(name) {
			// The name was held at the last answer, and this Client
			// waits for many: ask whether it is free, with the other
			// names due now, in one statement (internal/wait's look),
			// and send the acquire only if it is.
			held, err := e.Looks.Held(ctx, name)
			if err != nil && (errors.Is(err, ErrClosed) || ctxErr(ctx) != nil) {
				t.Leave()
				return nil, waitEnded(call, err, t)
			}
			if err == nil && held {
				t.SetHeld(heldError(name))
				if chans.On() {
					chans.Waited(key) // as a refused acquire does
				}
				if !t.Refused(c.retry) {
					return nil, heldError(name)
				}
				continue
			}
			// Free, or the look failed: the acquire decides.
		}
		if err := e.EnterAttempt(ctx); err != nil {
			t.Leave()
			return nil, waitEnded(call, err, t)
		}
		l, err := call.attempt(ctx)
		e.ExitAttempt()
		if err == nil {
			if chans.On() {
				if !call.shared() {
					// The channel the queue holds, if any, goes with the
					// lease: whichever head waited on it. A semaphore's
					// other slots may be free: its queue keeps the
					// channel, and lets go of it when it empties.
					chans.HandTo(ctx, key, l, l.holdChannel)
				}
				if waited {
					chans.Waited(key)
				}
				l.mu.Lock()
				l.contended, l.probe = waited, !waited
				l.mu.Unlock()
			}
			t.Acquired(c.retry, call.shared())
			lock = l
			return l, nil
		}
		// The context is read once: it may end at any moment, and a caller
		// whose context ended must see its error whatever the answer was.
		cerr := ctxErr(ctx)
		switch {
		case cerr == nil && errors.Is(err, ErrNotAcquired) && !call.final(err):
			t.SetHeld(err)
			waited, refusedBefore = true, true
			if chans.On() {
				useWake = true
				chans.Waited(key) // the callers behind this one wait on the channel too
			}
		case cerr == nil && passable(err):
			// A failover, a restart, a full server: it may pass, so it
			// counts as a refused attempt; the last one says why the call
			// failed if it does not, for every caller in the queue.
			t.SetRefusal(err)
		default:
			t.Leave()
			lastErr, _ := t.Refusal()
			if cerr != nil && !errors.Is(err, cerr) {
				if lastErr == nil && !errors.Is(err, ErrNotAcquired) {
					lastErr = err
				}
				if lastErr != nil {
					return nil, errorf("%s: %w: %w (last error: %w)", call.op(), ErrNotAcquired, cerr, lastErr)
				}
				return nil, errorf("%s: %w: %w", call.op(), ErrNotAcquired, cerr)
			}
			if cerr != nil && lastErr != nil && errors.Is(err, cerr) {
				// The attempt was cut by ctx; the refusal before it says why.
				return nil, errorf("%s: %w: %w (last error: %w)", call.op(), ErrNotAcquired, cerr, lastErr)
			}
			if cerr != nil && !errors.Is(err, ErrNotAcquired) {
				// ctx ended within the attempt (a first use's proof, say):
				// nothing was taken.
				return nil, errorf("%s: %w: %w", call.op(), ErrNotAcquired, err)
			}
			return nil, err
		}
		if !t.Refused(c.retry) {
			return nil, err
		}
	}
}

// waitEnded is the error of call whose wait in t ended with err (its
// context's, or ErrClosed), with the last passable error since the last
// answer, if any.
func waitEnded(call waitCall, err error, t *wait.Ticket) error {
	lastErr, _ := t.Refusal()
	switch {
	case errors.Is(err, ErrClosed):
		return err
	case lastErr != nil:
		return errorf("%s: %w: %w (last error: %w)", call.op(), ErrNotAcquired, err, lastErr)
	}
	return errorf("%s: %w: %w", call.op(), ErrNotAcquired, err)
}
