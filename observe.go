package sqllock

import (
	"context"
	"errors"
	"time"

	"github.com/sqllock/sqllock/internal/fault"
	"github.com/sqllock/sqllock/observe"
)

// errorOutcome is the Outcome of a statement's error.
func errorOutcome(err error) observe.Outcome {
	switch {
	case errors.Is(err, ErrClosed):
		return observe.OutcomeClosed
	case isContextErr(err):
		return observe.OutcomeCanceled
	}
	switch classify(err) {
	case fault.RolledBack:
		return observe.OutcomeRolledBack
	case fault.Unknown:
		return observe.OutcomeBroken
	case fault.Refused:
		return observe.OutcomeRefused
	}
	return observe.OutcomeFailed
}

// acquireOutcome is the Outcome of an acquire call that returned err.
func acquireOutcome(err error) observe.Outcome {
	switch {
	case err == nil:
		return observe.OutcomeAcquired
	case errors.Is(err, ErrClosed):
		return observe.OutcomeClosed
	case errors.Is(err, ErrNotAcquired):
		return observe.OutcomeHeld
	}
	return errorOutcome(err)
}

// observed calls f with ev, recovering a panic (see Observer).
func observed[E any](c *Client, f func(E), ev E) {
	defer func() {
		if r := recover(); r != nil {
			c.log.Error("sqllock: an Observer func panicked; the Client goes on", "panic", r)
		}
	}()
	f(ev)
}

// acquireDone reports the acquire call a, begun at start, that returned l
// and err.
func (c *Client) acquireDone(ctx context.Context, a *acquireCall, start time.Time, l *Lock, err error) {
	if c.obs.AcquireDone == nil {
		return
	}
	ev := observe.AcquireEvent{Ctx: ctx, Name: a.name, Outcome: acquireOutcome(err), Start: start,
		Wait: time.Since(start), Attempts: a.attempts, Err: err}
	if l != nil {
		ev.Fence = l.fence
	}
	observed(c, c.obs.AcquireDone, ev)
}

// monoBase is the origin of Lock.heldSince, so that a Lock keeps the start
// of its hold in 8 bytes, on the monotonic clock.
var monoBase = time.Now()

// holdStarted reports the lease of l, just taken, before l is shared.
func (l *Lock) holdStarted() {
	o := &l.c.obs
	if o.HoldStart == nil && o.HoldEnd == nil {
		return
	}
	l.heldSince = time.Since(monoBase)
	if o.HoldStart != nil {
		observed(l.c, o.HoldStart, observe.HoldEvent{Name: l.Name(), Fence: l.fence, TTL: l.ttl})
	}
}

// holdEnded reports the end of l's lease, once, with how it ended.
func (l *Lock) holdEnded(end observe.HoldEnd, err error) {
	if l.c.obs.HoldEnd == nil {
		return
	}
	l.mu.Lock()
	if l.endObserved {
		l.mu.Unlock()
		return
	}
	l.endObserved = true
	l.mu.Unlock()
	ev := observe.HoldEvent{Name: l.Name(), Fence: l.fence, TTL: l.ttl, End: end, Err: err,
		Held: time.Since(monoBase) - l.heldSince}
	observed(l.c, l.c.obs.HoldEnd, ev)
}

// refreshed reports a refresh of l for ttl sent at sent, when the lease
// could expire at validUntil, that returned err (lost: it found the lease
// gone).
func (l *Lock) refreshed(sent, validUntil time.Time, ttl time.Duration, lost bool, err error) {
	if l.c.obs.Refreshed == nil {
		return
	}
	ev := observe.RefreshEvent{Name: l.Name(), Left: validUntil.Sub(sent), TTL: ttl, Took: time.Since(sent), Err: err}
	switch {
	case lost:
		ev.Outcome = observe.OutcomeHeld
	case err != nil:
		ev.Outcome = errorOutcome(err)
	}
	observed(l.c, l.c.obs.Refreshed, ev)
}

// retried reports statement stmt on name, which failed with err and may be
// sent again.
func (c *Client) retried(stmt, name string, err error) {
	if c.obs.Retried == nil {
		return
	}
	observed(c, c.obs.Retried, observe.RetryEvent{Statement: stmt, Name: name, Outcome: errorOutcome(err), Err: err})
}

// unknown reports an acquire of name whose token was remembered, or settled.
func (c *Client) unknown(name string, settled bool) {
	if c.obs.Unknown == nil {
		return
	}
	observed(c, c.obs.Unknown, observe.UnknownEvent{Name: name, Settled: settled})
}

// wokeUp reports a wait on name's wake-up channel that ended in st after
// wait, or the channels turned off (st WakeupOff).
func (c *Client) wokeUp(name string, st observe.WakeupState, wait time.Duration) {
	if c.obs.Wakeup == nil {
		return
	}
	observed(c, c.obs.Wakeup, observe.WakeupEvent{Name: name, State: st, Wait: wait})
}

// obsNow is time.Now when on, for an event the Observer listens for, and
// the zero time otherwise.
func (c *Client) obsNow(on bool) time.Time {
	if !on {
		return time.Time{}
	}
	return time.Now()
}

// releaseDone reports the release of l, sent at sent, that returned err,
// and the end of the lease it made.
func (l *Lock) releaseDone(sent time.Time, err error) {
	o := &l.c.obs
	if o.Released == nil && o.HoldEnd == nil {
		return
	}
	if o.Released != nil {
		observed(l.c, o.Released, observe.ReleaseEvent{Name: l.Name(), Took: time.Since(sent), Err: err})
	}
	l.mu.Lock()
	byClose := errors.Is(l.endCause, ErrClosed)
	lapsed := !sent.Before(l.validUntil)
	l.mu.Unlock()
	switch {
	case byClose:
		// Whatever the answer: Close does not try again.
		l.holdEnded(observe.HoldClosed, err)
	case errors.Is(err, ErrNotHeld):
		l.holdEnded(observe.HoldLost, err)
	case err == nil && lapsed:
		l.holdEnded(observe.HoldLapsed, nil)
	case err == nil:
		l.holdEnded(observe.HoldReleased, nil)
	}
	// Any other error leaves the outcome unknown: a later Release, or
	// Close, reports the end.
}
