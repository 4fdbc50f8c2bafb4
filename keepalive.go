package sqllock

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqllock/sqllock/observe"
)

// maxDefaultSafetyMargin caps the safety margin a keep-alive uses unless
// [WithSafetyMargin] sets one: ttl/10, at most this.
const maxDefaultSafetyMargin = 5 * time.Second

// defaultSafetyMargin is how long before the lease could expire a keep-alive
// gives up, unless told otherwise: long enough for the work to notice its
// context and stop, and for the client's and server's clocks to drift apart
// over one lease.
func defaultSafetyMargin(ttl time.Duration) time.Duration {
	return min(ttl/10, maxDefaultSafetyMargin)
}

// keepAlive is the state of a Lock's keep-alive goroutine. Its fields other
// than the channels are guarded by the Lock's mu.
type keepAlive struct {
	stop     chan struct{} // closed by stopKeepAlive
	stopOnce sync.Once
	done     chan struct{} // closed when the goroutine has exited
	// moved is signalled when the Lock's validUntil changes, so that the
	// goroutine moves its deadline (a Refresh only moves it out).
	moved  chan struct{}
	margin time.Duration
	// deadline is validUntil minus margin, in nanoseconds after monoBase:
	// the instant the contexts end if no renewal moves it. Written under
	// mu with validUntil, read without it by a leaseContext's every check.
	deadline atomic.Int64
	// deadT is the goroutine's deadline timer while it runs: setDeadline
	// moves it, so that a round of the shared renewal moves the deadline
	// without waking the goroutine (one wake-up a lease a ttl, at 100,000
	// leases a fifth of the Client's CPU).
	deadT *time.Timer

	stopCause error  // why stop was closed; set before closing it
	cause     error  // why the contexts ended; nil while they run
	lastErr   error  // of the last renewal, if it failed; nil after a success
	detached  uint64 // refreshes of the lease sent since it started (session.go)
	cancels   []context.CancelCauseFunc
}

// setDeadline moves ka's deadline, and the goroutine's timer, to a margin
// before validUntil. l.mu must be held.
func (ka *keepAlive) setDeadline(validUntil time.Time) {
	d := validUntil.Add(-ka.margin).Sub(monoBase)
	ka.deadline.Store(int64(d))
	if ka.deadT != nil {
		ka.deadT.Reset(d - time.Since(monoBase))
	}
}

// deadlineAt returns ka's deadline.
func (ka *keepAlive) deadlineAt() time.Time {
	return monoBase.Add(time.Duration(ka.deadline.Load()))
}

// rearm sets the goroutine's timer to ka's deadline now, and returns it.
func (l *Lock) rearm(ka *keepAlive) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	ka.setDeadline(l.validUntil)
	return ka.deadlineAt()
}

// KeepAlive starts renewing the lease in the background, if it is not
// renewed already, and returns a context derived from ctx that ends when
// the lease is lost or the Lock is released.
//
// The renewing goroutine belongs to the Lock: its life does not depend on
// ctx (which only scopes the returned context and lends its values), and
// [Lock.Release] stops it and waits for it to exit. It renews for the ttl of
// the acquire, every ttl/3; a renewal that fails is retried after a short
// pause, and only [ErrNotHeld], or running out of time, counts as loss.
//
// The returned context ends, with a cause wrapping [ErrLockLost], as soon as
// a renewal finds the lease taken over, and at the latest a safety margin,
// min(ttl/10, 5s), before the lease could expire, on this process's
// monotonic clock from the send of the last successful acquire or renewal.
// After [Lock.Release] the cause wraps [ErrNotHeld], after [Client.Close]
// [ErrClosed]; once a release has started, KeepAlive returns an ended
// context. A [Lock.Refresh] that lengthens the lease moves the deadline.
//
// The deadline is exact after a pause (SIGSTOP, a paused VM): once it has
// passed, Err and Done report the loss whether or not the timer has fired,
// in this context and so in the one the fn of [Client.Do], [Lock.Do],
// [Client.Once] and [Callbacks].OnStartedLeading receive. Work checked
// before a pause and finished after it: fence it with [Lock.Fence]
// (docs/guarantees.md, "A holder stopped past its lease").
func (l *Lock) KeepAlive(ctx context.Context) context.Context {
	return l.keepAlive(ctx, defaultSafetyMargin(l.ttl))
}

// keepAlive is KeepAlive with the safety margin given; the first call fixes
// it for the Lock.
func (l *Lock) keepAlive(ctx context.Context, margin time.Duration) context.Context {
	kctx, cancel := context.WithCancelCause(ctx)
	l.mu.Lock()
	cause := l.endCause
	switch {
	case cause != nil:
	case l.released:
		cause = l.releasedErr()
	case l.ka == nil:
		l.ka = &keepAlive{stop: make(chan struct{}), done: make(chan struct{}),
			moved: make(chan struct{}, 1), margin: margin}
		l.ka.setDeadline(l.validUntil)
		go l.renew(context.WithoutCancel(ctx), l.ka)
	default:
		cause = l.ka.cause
	}
	if cause == nil {
		l.ka.cancels = append(l.ka.cancels, cancel)
		lctx := &leaseContext{Context: kctx, l: l, ka: l.ka}
		l.mu.Unlock()
		return lctx
	}
	l.mu.Unlock()
	// Not under mu: cancel calls ctx's Done, and ctx may be this Lock's own
	// context (fn passing its context back to KeepAlive), whose check takes mu.
	cancel(cause)
	return kctx
}

// A leaseContext is a running keep-alive's context: its Err and Done first
// compare the monotonic clock with the keep-alive's deadline and, once it
// has passed, end the keep-alive as its timer would. After a pause the
// timer and the work's own are both overdue, and Go runs them in any
// order: without the check, work that resumed first would find its context
// live and do one more unit beside the next holder. The check costs a
// monotonic clock read and an atomic load: 34 ns an Err against 2.4 ns
// (BenchmarkLeaseContext_Err).
type leaseContext struct {
	context.Context // from context.WithCancelCause, its cancel in ka.cancels
	l               *Lock
	ka              *keepAlive
}

func (c *leaseContext) Done() <-chan struct{} {
	c.check()
	return c.Context.Done()
}

func (c *leaseContext) Err() error {
	c.check()
	return c.Context.Err()
}

// Value checks too, for the Go releases whose [context.Cause] reads the
// cause through Value without calling Err first (golang/go#73258).
func (c *leaseContext) Value(key any) any {
	c.check()
	return c.Context.Value(key)
}

// check ends the keep-alive if its deadline has passed and the context is
// still running.
func (c *leaseContext) check() {
	if time.Since(monoBase) < time.Duration(c.ka.deadline.Load()) || c.Context.Err() != nil {
		return
	}
	if c.l.expire(c.ka) {
		select {
		case c.ka.moved <- struct{}{}: // the renewer sees the end at once and gives the lease up
		default:
		}
	}
}

// expire ends ka's contexts as lost if its deadline, a margin before
// ValidUntil, has passed, and reports whether they have ended. The
// keep-alive's timer and a leaseContext's check both end them through it,
// so the instant and the cause are the same whichever comes first.
func (l *Lock) expire(ka *keepAlive) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ka.cause == nil && !time.Now().Before(l.validUntil.Add(-ka.margin)) {
		l.endLocked(ka, l.expiringErr(ka.margin, ka.lastErr))
	}
	return ka.cause != nil
}

// stopKeepAlive ends the keep-alive ka, if one runs, and waits for its
// goroutine to exit. Its contexts end with the Lock's endCause.
func (l *Lock) stopKeepAlive(ka *keepAlive) {
	if ka == nil {
		return
	}
	l.mu.Lock()
	cause := l.endCause
	l.mu.Unlock()
	ka.stopOnce.Do(func() {
		ka.stopCause = cause
		close(ka.stop)
	})
	<-ka.done
}

// setValidUntil records when the lease could expire at the earliest and
// moves the keep-alive's deadline to follow. A deadline already passed ends
// the keep-alive's contexts before setValidUntil returns. l.mu must be held.
func (l *Lock) setValidUntil(t time.Time) {
	l.validUntil = t
	ka := l.ka
	if ka == nil || ka.cause != nil {
		return
	}
	ka.setDeadline(t)
	switch now := time.Now(); {
	case !now.Before(t):
		// The Refresh was sent before a pause (SIGSTOP, a VM paused) or a
		// starvation longer than the lease, and its reply read after it.
		l.endLocked(ka, errorf("%w: after a Refresh whose reply came late, the lease on %s may have expired %v ago, the process stopped or starved past it",
			ErrLockLost, l.label(), now.Sub(t).Round(time.Millisecond)))
	case !now.Before(t.Add(-ka.margin)):
		l.endLocked(ka, errorf("%w: after a Refresh, the lease on %s may expire within the safety margin %v",
			ErrLockLost, l.label(), ka.margin))
	}
	select {
	case ka.moved <- struct{}{}:
	default: // a signal is pending; the goroutine reads validUntil afresh
	}
}

// expiringErr is the cause of a keep-alive that ends because the lease may
// expire within margin. When its deadline fires late, after the process was
// stopped (SIGSTOP, a VM paused) or starved past the lease, it says that
// the lease may already have expired, rather than that it expires soon.
// l.mu must be held.
func (l *Lock) expiringErr(margin time.Duration, lastErr error) error {
	if late := -time.Until(l.validUntil); late >= 0 {
		return errorf("%w: no renewal of %s succeeded in time; the lease may have expired %v ago, the process stopped or starved past it%s",
			ErrLockLost, l.label(), late.Round(time.Millisecond), lastErrNote(lastErr))
	}
	return errorf("%w: no renewal of %s succeeded in time; the lease may expire %v from now%s",
		ErrLockLost, l.label(), margin, lastErrNote(lastErr))
}

// lastErrNote is how a cause names the last failed renewal: nothing when
// none failed (none was sent, or its answer had not come).
func lastErrNote(err error) string {
	if err == nil {
		return ""
	}
	return " (last error: " + strings.TrimPrefix(err.Error(), prefix) + ")"
}

// end ends every context of ka with cause, once.
func (l *Lock) end(ka *keepAlive, cause error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.endLocked(ka, cause)
}

// endLocked is end with l.mu held.
func (l *Lock) endLocked(ka *keepAlive, cause error) {
	if ka.cause != nil {
		return
	}
	ka.cause = cause
	for _, cancel := range ka.cancels {
		cancel(cause)
	}
	ka.cancels = nil
}

// lose is the renewer's last act when the lease is lost: it ends ka's
// contexts with cause (unless something ended them first, such as a
// Refresh that left too little lease), logs the loss with the cause the
// contexts got, and forgets the
// Lock as held.
func (l *Lock) lose(ka *keepAlive, cause error) {
	l.mu.Lock()
	l.endLocked(ka, cause)
	cause = ka.cause
	l.mu.Unlock()
	l.c.renewals.lost(l)
	l.logLost(cause)
	l.holdEnded(observe.HoldLost, cause)
	l.c.held.remove(l)
}

// keepAliveEnded reports whether ka's contexts have ended.
func (l *Lock) keepAliveEnded(ka *keepAlive) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return ka.cause != nil
}

// renew is the keep-alive goroutine. While its renewals go well, the
// Client's shared renewal renews the lease (renewal.go), and the goroutine
// only waits: for its deadline, which the rounds move without waking it,
// for Release, and for word that the shared renewal did not extend it. It
// then renews on its own until a renewal succeeds, and joins again. Its
// own renewals run in a goroutine of their own, which renew waits for, so
// that the deadline fires on time even while a renewal hangs on a dead
// connection.
func (l *Lock) renew(base context.Context, ka *keepAlive) {
	defer close(ka.done)
	interval := l.ttl / 3
	attemptTimeout := l.ttl / 4
	l.mu.Lock()
	deadline := l.validUntil.Add(-ka.margin)
	deadT := time.NewTimer(time.Until(deadline))
	ka.deadT = deadT
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		ka.deadT = nil
		deadT.Stop()
		l.mu.Unlock()
	}()
	renewAt := time.Now().Add(interval)
	renewT := time.NewTimer(interval)
	renewT.Stop()
	defer renewT.Stop()

	var (
		results  = make(chan error, 1)
		inFlight context.CancelFunc // non-nil while a renewal of its own runs
		alone    <-chan error       // non-nil while in the shared renewal
		failures int
	)
	shared := func() {
		if l.c.renewals.isOff() {
			renewAt = time.Now().Add(interval)
			renewT.Reset(interval)
			return
		}
		alone = l.c.renewals.join(l.c, l)
	}
	// own starts a renewal on its own; it reports false when the lease was
	// lost instead. After a pause the renewal's timer and the deadline's
	// are both overdue, and either may come first: a lease past its
	// deadline is not renewed for work that has been told it is lost.
	own := func() bool {
		if l.expire(ka) {
			l.lose(ka, nil)
			return false
		}
		// The rounds move the deadline without telling this goroutine.
		deadline = ka.deadlineAt()
		ctx, cancel := context.WithDeadline(base, minTime(deadline, time.Now().Add(attemptTimeout)))
		inFlight = cancel
		go func() { results <- l.c.renewals.own(ctx, func() error { return l.Refresh(ctx, l.ttl) }) }()
		return true
	}
	// retry takes a renewal that failed with err, which is no proof of
	// loss: the next is tried on its own, after a pause. failed also says
	// so in the log.
	retry := func(err error) {
		failures++
		l.mu.Lock()
		ka.lastErr = err
		l.mu.Unlock()
		next := renewBackoff(l.ttl, failures)
		renewAt = time.Now().Add(next)
		renewT.Reset(next)
	}
	failed := func(err error) {
		retry(err)
		l.logRenewFailed(failures, err)
	}
	defer func() {
		if alone != nil {
			l.c.renewals.leave(l)
		}
		if inFlight != nil {
			inFlight()
			<-results
		}
	}()
	shared()
	for {
		select {
		case <-ka.stop:
			l.end(ka, ka.stopCause)
			return
		case <-deadT.C:
			if l.expire(ka) {
				l.lose(ka, nil)
				return
			}
			// A round or a Refresh moved the deadline out as the timer fired.
			deadline = l.rearm(ka)
		case <-ka.moved:
			if l.keepAliveEnded(ka) {
				// A Refresh that left too little lease, or a context that
				// found the deadline passed, ended the contexts.
				l.lose(ka, nil)
				return
			}
			deadline = l.rearm(ka)
			// A short lease is renewed sooner: halfway to the new
			// deadline, if that comes before the renewal planned.
			if soon := time.Now().Add(time.Until(deadline) / 2); alone == nil && inFlight == nil && soon.Before(renewAt) {
				renewAt = soon
				renewT.Reset(time.Until(renewAt))
			}
		case err := <-alone:
			l.c.renewals.leave(l)
			alone = nil
			if err != nil && !l.c.renewals.isOff() {
				// The statement failed: a failed renewal, retried on its
				// own after a pause. The log says it once for the
				// statement's thousands of leases (renewal.go, send).
				retry(err)
				continue
			}
			// The statement extended fewer leases than it carried (or the
			// server refused it): this one refreshes on its own now, which
			// tells whether it was lost.
			if !own() {
				return
			}
		case <-renewT.C:
			if !own() {
				return
			}
		case err := <-results:
			inFlight()
			inFlight = nil
			if l.keepAliveEnded(ka) {
				// A Refresh that left too little lease, or a context that
				// found the deadline passed, ended the contexts while this
				// renewal was on its way. Its success must not start the
				// renewals again: every context has been told the lease is
				// lost, and a lease renewed for nobody would block the name
				// until Release.
				l.lose(ka, nil)
				return
			}
			switch {
			case err == nil:
				failures = 0
				l.mu.Lock()
				ka.lastErr = nil
				l.mu.Unlock()
				deadline = l.rearm(ka)
				shared()
				continue
			case errors.Is(err, ErrNotHeld):
				l.lose(ka, errorf("%w: %w", ErrLockLost, err))
				return
			case renewalCannotPass(err):
				// No renewal can succeed before the deadline: say so now.
				l.lose(ka, errorf("%w: the lease on %s cannot be renewed: %w", ErrLockLost, l.label(), err))
				return
			}
			// Not proof of loss: try again soon, until the deadline.
			failed(err)
		}
	}
}

// renewalCannotPass reports whether a failed renewal's error is final (the
// table is gone, the login or privilege refused): trying again until the
// deadline would only keep the work running longer. An attempt's own
// timeout, and Close, which ends the keep-alive itself, are not.
func renewalCannotPass(err error) bool {
	return !passable(err) && !errors.Is(err, context.DeadlineExceeded) &&
		!errors.Is(err, context.Canceled) && !errors.Is(err, ErrClosed)
}

// renewBackoff is the pause before retrying a failed renewal: from 10ms,
// doubling, at most ttl/10, so that several attempts fit before the deadline.
func renewBackoff(ttl time.Duration, failures int) time.Duration {
	d := 10 * time.Millisecond
	for i := 1; i < failures && d < ttl; i++ {
		d *= 2
	}
	return max(min(d, ttl/10), minBackoff)
}
