package sqllock

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/sqllock/sqllock/internal/fault"
	"github.com/sqllock/sqllock/observe"
)

// A reporter is what a Client tells its logger and its Observer, and how
// often: the Client embeds one, and hands its methods to the packages
// that send and wait (internal/engine, internal/wait).
type reporter struct {
	log         *slog.Logger
	obs         observe.Observer
	skew        rateLimited // noteAhead's
	renewFailed rateLimited // logRenewFailed's
}

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
func observed[E any](r *reporter, f func(E), ev E) {
	defer func() {
		if p := recover(); p != nil {
			r.log.Error("sqllock: an Observer func panicked; the Client goes on", "panic", p)
		}
	}()
	f(ev)
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
		observed(&l.c.reporter, o.HoldStart, observe.HoldEvent{Name: l.Name(), Fence: l.fence, TTL: l.ttl})
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
	observed(&l.c.reporter, l.c.obs.HoldEnd, ev)
}

// refreshed reports a refresh of l for ttl sent at sent, when the lease
// could expire at validUntil, that returned err (lost: it found the lease
// gone).
func (l *Lock) refreshed(sent, validUntil time.Time, ttl time.Duration, lost bool, err error, shared int) {
	if l.c.obs.Refreshed == nil {
		return
	}
	ev := observe.RefreshEvent{Name: l.Name(), Left: validUntil.Sub(sent), TTL: ttl, Took: time.Since(sent), Shared: shared, Err: err}
	switch {
	case lost:
		ev.Outcome = observe.OutcomeHeld
	case err != nil:
		ev.Outcome = errorOutcome(err)
	}
	observed(&l.c.reporter, l.c.obs.Refreshed, ev)
}

// retried reports statement stmt on name, which failed with err and may be
// sent again.
func (r *reporter) retried(stmt, name string, err error) {
	if r.obs.Retried == nil {
		return
	}
	observed(r, r.obs.Retried, observe.RetryEvent{Statement: stmt, Name: name, Outcome: errorOutcome(err), Err: err})
}

// unknown reports an acquire of name whose token was remembered, or settled.
func (r *reporter) unknown(name string, settled bool) {
	if r.obs.Unknown == nil {
		return
	}
	observed(r, r.obs.Unknown, observe.UnknownEvent{Name: name, Settled: settled})
}

// wokeUp reports a wait on name's wake-up channel that ended in st after
// wait, or the channels turned off (st WakeupOff).
func (r *reporter) wokeUp(name string, st observe.WakeupState, wait time.Duration) {
	if r.obs.Wakeup == nil {
		return
	}
	observed(r, r.obs.Wakeup, observe.WakeupEvent{Name: name, State: st, Wait: wait})
}

// obsNow is time.Now when on, for an event the Observer listens for, and
// the zero time otherwise.
func (r *reporter) obsNow(on bool) time.Time {
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
		observed(&l.c.reporter, o.Released, observe.ReleaseEvent{Name: l.Name(), Took: time.Since(sent), Err: err})
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

// frozenSeen tells the Observer, as a RetryEvent of statement
// "frozen_holder", that an acquire of name met a frozen holder
// (internal/engine/frozen.go), ended (OutcomeRolledBack) or not
// (OutcomeRefused).
func (r *reporter) frozenSeen(name string, ended bool, err error) {
	if r.obs.Retried == nil {
		return
	}
	out := observe.OutcomeRefused
	if ended {
		out = observe.OutcomeRolledBack
	}
	observed(r, r.obs.Retried, observe.RetryEvent{Statement: "frozen_holder", Name: name, Outcome: out, Err: err})
}

var discardLogger = slog.New(slog.DiscardHandler)

// logRetry reports a statement that failed in a way that is retried, to
// the logger and the Observer.
func (r *reporter) logRetry(ctx context.Context, stmt, name string, err error) {
	r.log.DebugContext(ctx, "sqllock: statement failed; retrying", "name", name, "statement", stmt, "err", err)
	r.retried(stmt, name, err)
}

// logRenewFailed reports a keep-alive renewal that failed without proof
// of loss; the keep-alive tries again.
//
// At most one such line a second per Client: in an outage every lease
// renewing on its own fails each renewal, and a Client holding thousands of
// names would write thousands of lines a second, burying the few that say
// what happened. The line written counts those left out since the last
// ("not_logged"); the Observer still sees every statement, and each
// lease lost is logged on its own (logLost).
func (l *Lock) logRenewFailed(failures int, err error) {
	skipped, due := l.c.renewFailed.due(renewFailedEvery)
	if !due {
		return
	}
	args := []any{"name", l.name, "fence", l.fence, "failures", failures, "err", err}
	if skipped > 0 {
		args = append(args, "not_logged", skipped)
	}
	l.c.log.Warn("sqllock: lease renewal failed; retrying", args...)
}

// renewFailedEvery bounds how often a Client logs a lease's failed renewal.
const renewFailedEvery = time.Second

// logLost reports a lease the keep-alive gave up for lost.
func (l *Lock) logLost(cause error) {
	l.c.log.Error("sqllock: lease lost", "name", l.name, "fence", l.fence, "err", cause)
}

// logClosed reports a lease Close released, or failed to.
func (l *Lock) logClosed(err error) {
	switch {
	case errors.Is(err, ErrNotHeld):
		l.c.log.Warn("sqllock: Close found lease lost already", "name", l.name, "fence", l.fence, "err", err)
		return
	case err != nil:
		l.c.log.Warn("sqllock: Close could not release lease; it expires on its own", "name", l.name, "fence", l.fence, "err", err)
		return
	}
	l.c.log.Info("sqllock: Close released lease", "name", l.name, "fence", l.fence)
}

// Clocks that disagree. On a cluster whose nodes each decide expiry by
// their own clock (Galera, Group Replication multi-primary), a node whose
// clock runs ahead takes other nodes' leases over early, while they are
// live by their holders' reckoning (docs/servers.md, Clocks). Inspect and
// List read, with each lease, how far its acquired_at (written by the
// clock of the node that took it) lies ahead of the reading node's clock:
// a lease's age, negative, unless the writer's clock is ahead by at least
// that much. Past clockSkewWarn the Client warns, at most once a minute.
// It costs nothing beyond the column: the statements are read anyway.

// clockSkewWarn is how far ahead of the reading server's clock a lease's
// acquired_at must lie for the Client to warn: well above what two reads
// of one clock differ by (about 15 ms measured on a loaded machine), and
// below the smallest keep-alive margin worth having.
const clockSkewWarn = 50 * time.Millisecond

// clockSkewEvery bounds how often a Client warns of clocks that disagree.
const clockSkewEvery = time.Minute

// rateLimited lets one kind of warning through at most once a period,
// counting the ones it holds back.
type rateLimited struct {
	mu      sync.Mutex
	last    time.Time
	skipped int
}

// due reports whether a warning may be written now, the first or every
// period at most, and how many were held back since the last one written.
func (w *rateLimited) due(every time.Duration) (skipped int, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	if !w.last.IsZero() && now.Sub(w.last) < every {
		w.skipped++
		return 0, false
	}
	skipped, w.skipped, w.last = w.skipped, 0, now
	return skipped, true
}

// noteAhead warns, through the Client's logger, when the lease on name was
// acquired ahead µs in this server's future (a NULL ahead, ok false, is a
// released lease).
func (r *reporter) noteAhead(name string, ahead int64, ok bool) {
	d := time.Duration(ahead) * time.Microsecond
	if !ok || d <= clockSkewWarn {
		return
	}
	if _, due := r.skew.due(clockSkewEvery); due {
		r.log.Warn("sqllock: a lease was acquired ahead of this server's clock: the clock of the node that took it is ahead of this node's by at least this much, and that node takes leases over early; keep node clocks far closer than the keep-alive's margin (docs/servers.md, Clocks)",
			"name", name, "ahead", d)
	}
}
