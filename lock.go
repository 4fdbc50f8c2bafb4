package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqllock/sqllock/internal/engine"
	"github.com/sqllock/sqllock/internal/wait"
	"github.com/sqllock/sqllock/observe"
)

// A Lock is a lease on one name ([Client.TryAcquire]), on a set of names
// ([Client.TryAcquireSet]) or on a semaphore's slot ([Semaphore.TryAcquire]).
// Its methods are safe for concurrent use.
type Lock struct {
	c     *Client
	name  string
	token string
	fence uint64
	ttl   time.Duration // of the acquire; what the keep-alive renews for

	nameArg, tokenArg any // name and token boxed once, as statement arguments

	// refreshing holds a token while a Refresh runs: one at a time, so that
	// validUntil follows the server, and a Refresh waiting for another
	// gives up when its context ends. Made by the first Refresh, under mu:
	// most Locks are released without one.
	refreshing chan struct{}

	mu sync.Mutex
	// validUntil is when the lease could expire at the earliest, on this
	// process's monotonic clock: the send time of the last statement that
	// set the expiry, plus its ttl. The server computed the expiry from a
	// later instant, so the lease is ours at least until then.
	validUntil time.Time
	// endCause is set when the first release starts (by Release, Do's end
	// or Close), before its statement is sent: from then on no keep-alive
	// runs, and a KeepAlive's context ends with it at once.
	endCause error
	// releasing is the release under way, which other release calls wait
	// for and share the result of: made by the first of them, as most
	// releases have none (releaseUnderWay says one runs).
	releasing *releaseFlight
	// lateSent: the acquire sent its statement more than once, the last
	// before lateSent on monoBase's clock (observe.go), and those sends may
	// still commit until orphanWait after it; the release hands the token to the
	// Client's orphan list (acquire.go, rule 3). Zero when sent once. (A
	// duration, not a time.Time, keeps a Lock in its size class.)
	lateSent time.Duration
	// released: the lease was released. releaseUnknown: a Release failed in
	// a way that may have deleted the row. releaseUnderWay: a release is
	// sending its statement.
	released, releaseUnknown, releaseUnderWay bool
	// endObserved: the Observer was told the lease ended (observe.go). It
	// sits in releaseUnknown's padding, so that with heldSince (when it was
	// told it started, on monoBase's clock) a Lock stays in its allocation
	// size class, 208 bytes.
	endObserved bool
	heldSince   time.Duration
	// hold is what the Lock's waiting Acquire left it of its key's wake-up
	// channel (internal/wait), which its release calls; nil when the
	// acquire did not wait, or the channels are off. Close may release the
	// Lock before its Acquire has set it.
	hold atomic.Pointer[wait.Hold]
	ka   *keepAlive // started by the first KeepAlive; keepalive.go
	kind lockKind   // what the kind that acquired the Lock left on it
}

// A lockKind is what the kind of lease that acquired a Lock left on it: a
// name's lease (nameKind), a set's (*lockSet, lock_set.go) or a semaphore's
// slot (*slotKind, semaphore.go). A Lock's refresh, release, check, names
// and wait key go through it: no name says what kind a Lock is. The Lock's
// name is its lease row's, the statements' argument.
type lockKind interface {
	// name, slot, names and fences answer [Lock.Name], [Lock.Slot],
	// [Lock.Names] and [Lock.Fences].
	name(l *Lock) string
	slot() int
	names(l *Lock) []string
	fences(l *Lock) []uint64
	// label names the lease in errors.
	label(l *Lock) string
	// refresh, release and check send the kind's statement and answer as
	// sendRefresh, sendRelease's send and Check do.
	refresh(ctx context.Context, l *Lock, until time.Time, ttl time.Duration) (ok bool, err error)
	release(ctx context.Context, l *Lock, minHold time.Duration) (ours, maybeApplied bool, err error)
	check(ctx context.Context, l *Lock, tx *sql.Tx) error
	// rows are the names of the lease rows the Lock holds under its
	// token, which the Client's shared renewal extends (renewal.go).
	rows(l *Lock) []string
	// waitKey is the key of the queue and wake-up channel the Lock's
	// acquire waited in (internal/wait).
	waitKey(l *Lock) string
	// kick makes this Client's callers waiting for what l held try now.
	kick(l *Lock)
	// orphans are the orphan list and keys under which l's token is
	// remembered once released (rememberLate).
	orphans(l *Lock) (orphanList, []string)
}

// A nameKind is the lockKind of a lease on one name, l.name.
type nameKind struct{}

func (nameKind) name(l *Lock) string                    { return l.name }
func (nameKind) slot() int                              { return 0 }
func (nameKind) names(l *Lock) []string                 { return []string{l.name} }
func (nameKind) fences(l *Lock) []uint64                { return []uint64{l.fence} }
func (nameKind) label(l *Lock) string                   { return strconv.Quote(l.name) }
func (nameKind) rows(l *Lock) []string                  { return []string{l.name} }
func (nameKind) waitKey(l *Lock) string                 { return l.name }
func (nameKind) kick(l *Lock)                           { l.c.wait.Kick(l.name) }
func (nameKind) orphans(l *Lock) (orphanList, []string) { return &l.c.orphans, []string{l.name} }

// A releaseFlight is one release of a Lock under way, as the calls that
// wait for it see it; err is set when done is closed. It is made, under the
// Lock's mu, by the first call that waits for the release: most releases
// have none.
type releaseFlight struct {
	done chan struct{}
	err  error
}

// newLock returns the Lock for a lease just acquired.
func newLock(c *Client, name, token string, fence uint64, ttl time.Duration, validUntil time.Time) *Lock {
	return &Lock{c: c, name: name, token: token, fence: fence, ttl: ttl, validUntil: validUntil,
		nameArg: name, tokenArg: token, kind: nameKind{}}
}

// lapseState is when l's lease could expire at the earliest, and whether
// its release started: what its hold of the wake-up channel reads when the
// lease could have lapsed (internal/wait).
func (l *Lock) lapseState() (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.validUntil, l.released || l.endCause != nil
}

// Name returns the name the lease is on: for a set, the first of
// [Lock.Names]; for a semaphore's slot, the semaphore's name.
func (l *Lock) Name() string { return l.kind.name(l) }

// Token returns the random owner token that identifies this lease.
func (l *Lock) Token() string { return l.token }

// Fence returns the lease's fencing token. Fences of a name grow strictly with
// every new holder, so a store that keeps the highest it has seen can refuse
// a write from a holder that lost its lease. A Refresh keeps the fence.
func (l *Lock) Fence() uint64 { return l.fence }

// ValidUntil returns the instant, on this process's monotonic clock, before
// which the lease cannot have expired: the latest send time of the acquire or
// of a successful Refresh plus its ttl, if the client's and the server's
// clocks run at the same rate (they need not agree).
func (l *Lock) ValidUntil() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.validUntil
}

// Refresh extends the lease to ttl from the server's now, in one statement,
// if it is still ours and live; a ttl shorter than the lease has left changes
// neither it nor [Lock.ValidUntil]. It returns an error wrapping [ErrNotHeld]
// when the lease is gone; any other error means the outcome is unknown, not
// that the lease is lost, and Refresh may be called again.
func (l *Lock) Refresh(ctx context.Context, ttl time.Duration) error {
	if err := checkTTL(ttl); err != nil {
		return err
	}
	l.mu.Lock()
	released := l.released
	if l.refreshing == nil {
		l.refreshing = make(chan struct{}, 1)
	}
	refreshing := l.refreshing
	l.mu.Unlock()
	if released {
		return l.releasedErr()
	}
	select {
	case refreshing <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("sqllock: refresh %q: %w", l.name, ctx.Err())
	}
	defer func() { <-refreshing }()
	sent := time.Now()
	until := l.ValidUntil()
	ok, err := l.sendRefresh(ctx, until, ttl)
	return l.refreshAnswered(sent, until, ttl, ok, err, 0)
}

// refreshAnswered takes the answer to a refresh of the lease sent at sent,
// when it was valid until until, for ttl: ok, it was extended; err, the
// outcome is unknown. shared is how many leases the statement extended,
// when it was the Client's shared renewal (renewal.go); 0 for the Lock's
// own. It returns what Refresh does.
func (l *Lock) refreshAnswered(sent, until time.Time, ttl time.Duration, ok bool, err error, shared int) error {
	if err != nil {
		// The refresh may have been applied, or may yet be: it never moves
		// the expiry earlier, so ValidUntil stands.
		l.refreshed(sent, until, ttl, false, err, shared)
		return l.c.serverError("refresh "+l.label(), err)
	}
	if !ok {
		// The lease lapsed: the name may be free for a caller waiting in
		// this Client.
		l.kickAll()
		err := fmt.Errorf("%w: the lease on %s expired or was taken over", ErrNotHeld, l.label())
		l.refreshed(sent, until, ttl, true, err, shared)
		l.holdEnded(observe.HoldLost, err)
		return err
	}
	l.mu.Lock()
	if t := sent.Add(ttl); t.After(l.validUntil) {
		l.setValidUntil(t)
	}
	l.mu.Unlock()
	l.c.held.readd(l) // after l.mu: the registry's lock comes first
	l.refreshed(sent, until, ttl, false, nil, shared)
	return nil
}

// sendRefresh sends the refresh of the Lock's lease; ok reports whether it
// was extended (for a set, every lease of it). An error that is not the
// refresh's answer comes back as it is, for Refresh to wrap.
func (l *Lock) sendRefresh(ctx context.Context, until time.Time, ttl time.Duration) (ok bool, err error) {
	return l.kind.refresh(ctx, l, until, ttl)
}

// refresh sends qRefresh for the lease row l.name.
func (nameKind) refresh(ctx context.Context, l *Lock, until time.Time, ttl time.Duration) (ok bool, err error) {
	l.detach() // the refresh detaches the lease from its session
	name, token := l.keyArgs()
	res, _, err := l.c.eng.Exec(ctx, engine.Send{Stmt: qRefresh, Until: until, Args: []any{ttl.Microseconds(), name, token}})
	if err != nil {
		return false, err
	}
	id, err := res.LastInsertId()
	if err != nil {
		return false, fmt.Errorf("sqllock: refresh %q: %w", l.name, err)
	}
	return id != 0, nil
}

// Release stops the Lock's keep-alive and deletes the lease, in one statement
// guarded by the token, so it never removes another owner's lease. It returns
// an error wrapping [ErrNotHeld] when someone took the name over (the work
// done under the lease may have overlapped theirs) or the Lock was already
// released; after any other error the outcome is unknown, and Release may be
// called again. It frees the name even when ctx has ended, so that a deferred
// Release works: the statement runs on a context of its own, with ctx's
// values, that ends [ReleaseTimeout] after the call.
func (l *Lock) Release(ctx context.Context) error {
	parent := ctx
	if _, ok := ctx.Deadline(); ok || ctx.Done() != nil {
		parent = context.WithoutCancel(ctx) // else ctx never ends: one allocation less
	}
	rctx, cancel := context.WithTimeout(parent, l.c.releaseTimeout)
	defer cancel()
	err := l.release(rctx, 0, nil)
	if cerr := ctx.Err(); err != nil && cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("%w (%w)", err, cerr)
	}
	return err
}

// release ends the Lock's keep-alive, if it runs, with cause (nil: the Lock
// was released), then ends the lease: it deletes the row, or with minHold > 0
// keeps it until acquired_at + minHold (do.go). It reports the outcome as
// Release does. A call made while another runs waits for it, as long as ctx
// allows, and returns its result.
func (l *Lock) release(ctx context.Context, minHold time.Duration, cause error) error {
	l.mu.Lock()
	if l.released {
		l.mu.Unlock()
		return l.releasedErr()
	}
	if l.releaseUnderWay {
		f := l.releasing
		if f == nil {
			f = &releaseFlight{done: make(chan struct{})}
			l.releasing = f
		}
		l.mu.Unlock()
		select {
		case <-f.done:
			return f.err
		case <-ctx.Done():
			return fmt.Errorf("sqllock: release %q: %w", l.name, ctx.Err())
		}
	}
	l.releaseUnderWay = true
	if l.endCause == nil {
		if cause == nil {
			cause = l.releasedCause()
		}
		l.endCause = cause
	}
	ka := l.ka
	l.mu.Unlock()

	// Before the statement: a renewal racing the delete would report loss,
	// and a keep-alive's context must not outlive the lease.
	l.stopKeepAlive(ka)
	sent := l.c.obsNow(l.c.obs.Released != nil || l.c.obs.HoldEnd != nil)
	err := l.sendRelease(ctx, minHold)
	if err != nil && ka != nil && !errors.Is(err, ErrNotHeld) {
		// Attached, the lease would last as long as its session, which
		// the Client renews for its other leases: the next round
		// detaches it, so that it ends as its own lease would.
		l.c.renewals.lost(l)
	}
	l.releaseDone(sent, err)
	l.mu.Lock()
	l.releaseUnderWay = false
	f := l.releasing
	l.releasing = nil
	if f != nil {
		f.err = err
	}
	l.mu.Unlock()
	if f != nil {
		close(f.done)
	}
	return err
}

// sendRelease sends the statement that ends the lease and reports the outcome as
// Release does.
func (l *Lock) sendRelease(ctx context.Context, minHold time.Duration) error {
	var (
		ours         bool
		maybeApplied bool
		err          error
	)
	ours, maybeApplied, err = l.kind.release(ctx, l, minHold)
	done := time.Now()
	l.hold.Load().Release(ctx, err == nil) // the wake-up channel's part (internal/wait)
	if err != nil {
		if maybeApplied {
			l.mu.Lock()
			l.releaseUnknown = true
			l.mu.Unlock()
		}
		return l.c.serverError("release "+l.label(), err)
	}
	defer l.c.held.remove(l)
	if l.lateSent != 0 && time.Since(monoBase) < l.lateSent+orphanWait {
		// A late send of the acquire could take the name again under this
		// token, which nobody holds from now on (acquire.go, rule 3). A
		// lease kept for a minimum hold ends by acquired_at + minHold, and
		// acquired_at is before now: the list leaves it alone until then.
		var kept time.Time
		if minHold > 0 && ours {
			kept = done.Add(minHold)
		}
		l.rememberLate(kept)
	}
	// Whatever the answer, the lease is no longer ours: a caller waiting
	// for the name in this Client should try now.
	l.kickAll()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.released = true
	if ours {
		return nil
	}
	// No row was ours. If an earlier attempt may have deleted it and this
	// reply came while the lease was certainly still live, nobody can have
	// taken it over: that earlier attempt did delete it.
	if (maybeApplied || l.releaseUnknown) && done.Before(l.validUntil) {
		return nil
	}
	return fmt.Errorf("%w: the lease on %s expired and was taken over", ErrNotHeld, l.label())
}

// release deletes the lease row l.name, or keeps it for minHold.
func (nameKind) release(ctx context.Context, l *Lock, minHold time.Duration) (ours, maybeApplied bool, err error) {
	if minHold > 0 {
		return l.releaseAtLeast(ctx, minHold)
	}
	var res sql.Result
	name, token := l.keyArgs()
	var unknown int
	res, unknown, err = l.c.eng.Exec(ctx, engine.Send{Stmt: qRelease, Args: []any{name, token}})
	if maybeApplied = unknown > 0; err == nil {
		var n int64
		n, err = res.RowsAffected()
		ours = n == 1
	}
	return ours, maybeApplied, err
}

// keyArgs returns the name and token as statement arguments, boxed once
// when the Lock was made.
func (l *Lock) keyArgs() (name, token any) { return l.nameArg, l.tokenArg }

// releasedErr is the error of a call on a released Lock.
func (l *Lock) releasedErr() error {
	err := fmt.Errorf("%w: %s was already released", ErrNotHeld, l.label())
	if l.c.isClosed() {
		return errorf("%w: %w", ErrClosed, err)
	}
	return err
}

// releasedCause is releasedErr as a release's cause (endCause), which the
// Lock's keep-alive contexts end with: unless the Client is closed, it is
// the Lock itself as a lateReleasedErr, whose text is made when it is read,
// so that a release formats nothing.
func (l *Lock) releasedCause() error {
	if l.c.isClosed() {
		return l.releasedErr()
	}
	return (*lateReleasedErr)(l)
}

// A lateReleasedErr is a released Lock's releasedErr, made when read: it
// says and wraps what releasedErr does while the Client is open.
type lateReleasedErr Lock

func (e *lateReleasedErr) Error() string {
	return ErrNotHeld.Error() + ": " + (*Lock)(e).label() + " was already released"
}

func (e *lateReleasedErr) Unwrap() error { return ErrNotHeld }

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// Check verifies, inside the caller's transaction tx, that the lease is still
// this Lock's and live by the server's clock, in one statement that writes the
// lease row, keeping it locked until tx ends: no takeover of the name can
// commit before tx does, so writes made in tx after a successful Check are
// fenced by the lease. It returns an error wrapping [ErrNotHeld] when the
// lease is not ours or has expired (one kept by the Client's session: not
// ours). tx stays the caller's. Keep it short: renewals of the lease's own row
// and acquires of the name wait for it (docs/usage.md#fencing-writes-in-the-same-database-lockcheck),
// and once the lease has been over for 500 ms an acquire of the name may end
// tx, idle, by KILL of its connection, rolling its writes back (a holder
// frozen inside Lock.Check: docs/guarantees.md).
func (l *Lock) Check(ctx context.Context, tx *sql.Tx) error {
	l.mu.Lock()
	released := l.released
	l.mu.Unlock()
	if released {
		return l.releasedErr()
	}
	return l.kind.check(ctx, l, tx)
}

// check sends qCheck for the lease row l.name in tx.
func (nameKind) check(ctx context.Context, l *Lock, tx *sql.Tx) error {
	// By its text, not the Client's prepared statement: tx may come from
	// another *sql.DB, and tx.StmtContext refuses a statement of another.
	res, err := tx.ExecContext(ctx, l.c.eng.Forms().SQL[qCheck], l.name, l.token)
	if err != nil {
		return l.c.serverError(fmt.Sprintf("check %q", l.name), err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return errorf("check %q: %w", l.name, err)
	}
	if n != 1 {
		return fmt.Errorf("%w: the lease on %q expired or was taken over", ErrNotHeld, l.name)
	}
	return nil
}
