package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/sqllock/sqllock/internal/fault"
	"github.com/sqllock/sqllock/internal/wait"
	"github.com/sqllock/sqllock/observe"
)

// The acquire path: TryAcquire, Acquire (which waits in internal/wait) and
// Elect's campaign each make one acquireCall, which draws the call's owner
// token, sends its attempts, and owns what an attempt whose outcome stays
// unknown leaves behind: it deletes that lease at once, and when the DELETE
// does not settle it, hands the token to the Client's orphan list when the
// call ends. Read from TryAcquire down; the orphan list is internal/settle's
// Book, and its DELETEs are in held.go.

// checkName returns an error naming what is wrong with a lock name.
func checkName(name string) error {
	switch {
	case name == "":
		return errors.New("sqllock: empty lock name")
	case len(name) > MaxNameLen:
		return fmt.Errorf("sqllock: lock name is %d bytes, longer than the %d the table holds", len(name), MaxNameLen)
	case isSemaphoreRow(name):
		return fmt.Errorf("sqllock: lock name %q ends with the bytes that mark a semaphore's rows (0x00 'slot', maybe with two digits): those names are the semaphores' (semaphore.go)", name)
	}
	return nil
}

// checkTTL returns an error naming what is wrong with a lease length.
func checkTTL(ttl time.Duration) error {
	switch {
	case ttl < MinTTL:
		return fmt.Errorf("sqllock: ttl %v is below the minimum %v", ttl, MinTTL)
	case ttl > MaxTTL:
		return fmt.Errorf("sqllock: ttl %v is beyond the maximum %v", ttl, MaxTTL)
	}
	return nil
}

// cleanupTimeout bounds the DELETE that undoes an acquire whose outcome is
// unknown because the caller's context ended while it ran.
const cleanupTimeout = time.Second

// TryAcquire makes one attempt to take the lease on name for ttl, by the
// server's clock: it succeeds when the name is free or its lease has expired,
// and returns an error wrapping [ErrNotAcquired] when another owner's lease is
// live. A deadlock or a broken connection is retried with the same token, for
// up to 5s; a lease whose acquire's outcome stays unknown is deleted.
// A holder's Lock.Check transaction that keeps the lease row locked 500 ms
// after the lease ended is ended, on MariaDB and MySQL (docs/guarantees.md).
func (c *Client) TryAcquire(ctx context.Context, name string, ttl time.Duration) (*Lock, error) {
	a, err := c.newAcquireCall(name, ttl)
	if err != nil {
		return nil, err
	}
	return a.try(ctx)
}

// Acquire takes the lease on name like [Client.TryAcquire], waiting between
// attempts as the Client's [RetryStrategy] says, until it succeeds, the
// strategy gives up, or ctx ends; when ctx ends first, the error satisfies
// both errors.Is(err, ErrNotAcquired) and errors.Is(err, ctx.Err()). Errors
// that may pass (a failover, too many connections) count as refused attempts,
// and the final error wraps the last; others end the call at once (see
// docs/usage.md#acquiring-and-waiting).
func (c *Client) Acquire(ctx context.Context, name string, ttl time.Duration) (*Lock, error) {
	a, err := c.newAcquireCall(name, ttl)
	if err != nil {
		return nil, err
	}
	start := c.obsNow(c.obs.AcquireDone != nil)
	var l *Lock
	if _, ok := c.retry.Backoff(1); !ok {
		// A strategy that never retries makes Acquire a TryAcquire; a
		// queue would only delay its one answer.
		l, err = a.attempt(ctx)
	} else {
		l, err = a.waitFor(ctx, &a)
	}
	c.acquireDone(ctx, &a, start, l, err)
	return l, err
}

// An acquireCall is one call that takes a lease on name for ttl (TryAcquire,
// Acquire, Elect's campaign). It owns the call's owner token and what an
// attempt whose outcome stays unknown leaves behind. It is used by one
// goroutine.
//
// A statement whose reply was lost (the connection broke after it was sent,
// or the caller's context cut it) may still run on the server later: in a
// thread pool's or a proxy's queue, behind a row lock, or as TCP delivers it
// after the socket closed. So is the DELETE that cleans up after it. Hence
// the rules, all applied here:
//
//  1. A token any of whose statements had an unknown outcome is retired: the
//     call's later attempts draw a fresh one. A late DELETE by the old token
//     then cannot take the lease of the Lock the call returns, nor a late
//     acquire under it extend or shorten that lease.
//  2. A retired token is handed to the Client's orphan list at once, whatever
//     the call's later attempts answer, unless a DELETE by it settled it:
//     one sent after the token's last statement could still commit
//     (orphanWait after its last send), or one that removed the lease when
//     only one send of the token may have committed. The list deletes its
//     lease before the Client's next acquire of the name, and at Close,
//     again until that bound when several sends may be in flight.
//  3. An attempt whose statement was sent again (exec retries a broken
//     connection with the same token) and then took the lease returns a Lock
//     under that token: its earlier send may run late. While the Lock holds
//     the name, that send finds the lease already ours, and an acquire of
//     the owner never moves its expiry earlier (queries.sql), so the lease
//     still lasts past the Lock's ValidUntil, whatever Refresh did since.
//     After the Lock's release it could take the name
//     under a token nobody holds: so the Lock's release hands the token to
//     the orphan list until such a send can no longer commit (lateSent).
type acquireCall struct {
	c        *Client
	name     string   // a set's label for a set (acquire_set.go)
	names    []string // a set's names, sorted; nil for one name
	ttl      time.Duration
	token    string
	tokenErr error // renew could not draw a token
	attempts int   // acquire statements sent, for the Observer
	pending  *Lock // the Lock a name's statement under way would start
	got      *Lock // the Lock a waiting call's attempt took (waitFor)
}

// newAcquireCall checks an acquire's arguments, before anything is sent,
// and draws the owner token for it.
func (c *Client) newAcquireCall(name string, ttl time.Duration) (acquireCall, error) {
	if err := checkName(name); err != nil {
		return acquireCall{}, err
	}
	if err := checkTTL(ttl); err != nil {
		return acquireCall{}, err
	}
	token, err := c.renewals.token(ttl)
	if err != nil {
		return acquireCall{}, fmt.Errorf("sqllock: token: %w", err)
	}
	return acquireCall{c: c, name: name, ttl: ttl, token: token}, nil
}

// try makes one attempt, told to the Observer as one acquire call: a
// TryAcquire's, or one of Elect's, whose campaign is a TryAcquire again and
// again with the same call (elect.go).
func (a *acquireCall) try(ctx context.Context) (*Lock, error) {
	start := a.c.obsNow(a.c.obs.AcquireDone != nil)
	a.attempts = 0 // this attempt's statements, not the campaign's
	l, err := a.attempt(ctx)
	a.c.acquireDone(ctx, a, start, l, err)
	return l, err
}

// attempt sends one acquire statement, and cleans up after it when its
// outcome stays unknown (run, below).
func (a *acquireCall) attempt(ctx context.Context) (*Lock, error) { return a.run(ctx, a) }

// waitFor waits for call's lease, a's or its kind's (setCall, slotCall), in
// the Client's queue for its key (internal/wait's Engine.Acquire, one loop
// for every kind), and gives the Lock it took its hold of the wake-up
// channel. It runs for a strategy that may retry.
func (a *acquireCall) waitFor(ctx context.Context, call wait.Call) (*Lock, error) {
	h, err := a.c.wait.Acquire(ctx, call)
	if err != nil {
		return nil, err
	}
	a.got.hold.Store(h)
	return a.got, nil
}

// took is an attempt's answer as internal/wait's Call.Attempt gives it.
func (a *acquireCall) took(l *Lock, err error) (func() (time.Time, bool), error) {
	if err != nil {
		return nil, err
	}
	a.got = l
	return l.lapseState, nil
}

// What internal/wait's Engine.Acquire needs of a name's waiting acquire
// (wait.Call): its key is the name, and so is the look's. A name with an
// orphan to delete is not looked at: only the acquire's path deletes it.

func (a *acquireCall) Key() string                         { return a.name }
func (a *acquireCall) Label() string                       { return a.name }
func (a *acquireCall) Op() string                          { return fmt.Sprintf("acquire %q", a.name) }
func (a *acquireCall) TTL() time.Duration                  { return a.ttl }
func (a *acquireCall) Final(error) bool                    { return false }
func (a *acquireCall) Shared() bool                        { return false }
func (a *acquireCall) Backoff(n int) (time.Duration, bool) { return a.c.retry.Backoff(n) }
func (a *acquireCall) Attempt(ctx context.Context) (func() (time.Time, bool), error) {
	return a.took(a.attempt(ctx))
}

func (a *acquireCall) Look() string {
	if a.c.orphans.Has(a.name) {
		return ""
	}
	return a.name
}

// A name's part of an attempt (leaseKind): the acquire statement of
// queries.sql, whose insert id is the fence, or 0 when the name is held.

func (a *acquireCall) ready(context.Context) error { return nil } // with the statement's prepare (internal/engine/exec.go)
func (a *acquireCall) claim(ctx context.Context)   { a.c.claimOrphans(ctx, &a.c.orphans, a.name) }

func (a *acquireCall) send(ctx context.Context) (sql.Result, int, error) {
	// Each argument is boxed once (a string or an int64 converted to any
	// allocates), and the Lock, made first, keeps name and token boxed for
	// Refresh and Release: the statements use them several times.
	c := a.c
	a.pending = newLock(c, a.name, a.token, 0, a.ttl, time.Time{})
	nameArg, tokenArg := a.pending.keyArgs()
	us := any(a.ttl.Microseconds())
	return c.eng.Acquire(ctx, a.name, // internal/engine/exec.go
		nameArg, tokenArg, c.holderArg, us, nameArg,
		tokenArg, c.holderArg, tokenArg, us)
}

func (a *acquireCall) heldBy(_ context.Context, err error) error {
	if n, ok := fault.Errno(err); ok && n == fault.LockWaitTimeout {
		// Another transaction kept the lease row locked past the
		// acquire's bound (queries.sql, lock_wait_mariadb; on MySQL,
		// innodb_lock_wait_timeout): a holder's Lock.Check, most likely.
		// The name is held; say so now.
		return fmt.Errorf("%w: %q is held: its lease row stayed locked by another transaction (a holder's Lock.Check?): %w", ErrNotAcquired, a.name, err)
	}
	return nil
}

func (a *acquireCall) read(ctx context.Context, res sql.Result, sent, last time.Time, unknown int) (*Lock, bool, error) {
	name := a.name
	id, err := res.LastInsertId()
	if err != nil {
		if unknown > 0 {
			a.retire(last, unknown == 1) // rule 2: nothing settled it
		}
		return nil, false, fmt.Errorf("sqllock: acquire %q: %w", name, err)
	}
	// The OK packet carries the insert id unsigned; the driver hands it
	// over as an int64, negative from 2^63 on.
	fence := uint64(id)
	switch {
	case fence == 0:
		if unknown > 0 {
			// An earlier send of this attempt may commit later, once the
			// other owner's lease ends (rule 2).
			a.retire(last, unknown == 1)
		}
		return nil, false, heldError(name)
	case fence == 3:
		// An attached lease's mark (queries.sql, acquire), which
		// acquire_attached never answers: the engine sends it in its
		// place. Held, to be safe: nothing was written.
		return nil, false, heldError(name)
	case fence <= 2:
		// The lease row's mark came through: the fence row was missing
		// while the lease was ours, which only a hand-made change can do.
		// The lease is ours, under a token nobody will use: give it back.
		a.cleanup(ctx, last, unknown+1)
		return nil, false, fmt.Errorf("sqllock: acquire %q: the fence row is missing (mark %d); the table was changed by hand", name, fence)
	}
	if r := a.c.eng.Forms().FenceBeyond(fence); r != "" {
		// Past the largest fence the server takes (TiDB's): the statement
		// may have written one above what it reported.
		a.cleanup(ctx, last, unknown+1)
		return nil, false, fmt.Errorf("sqllock: acquire %q: %s", name, r)
	}
	l := a.pending
	a.pending = nil
	l.fence, l.validUntil = fence, sent.Add(a.ttl)
	return l, false, nil
}

// heldError is the error of an acquire of name refused because another
// owner's lease is live.
func heldError(name string) error {
	return fmt.Errorf("%w: %q is held by another owner", ErrNotAcquired, name)
}

// cleanup deletes the row the attempt may have written (its outcome is
// unknown, or it lost the race with Close), with a context of its own: the
// caller's may have ended. sends of the attempt may have committed, or may
// still, the last sent before last. Then it retires the token (rule 1), and
// hands it to the orphan list unless the DELETE settled it (rule 2): a
// DELETE that removes the lease settles it only when one send could
// commit; of several, the others may still be in flight.
func (a *acquireCall) cleanup(ctx context.Context, last time.Time, sends int) {
	a.cleanupIn(ctx, &a.c.orphans, a.name, last, sends)
}

// cleanupIn is cleanup with the token remembered under key of list: a
// name's, or a semaphore's (slotCall).
func (a *acquireCall) cleanupIn(ctx context.Context, list orphanList, key string, last time.Time, sends int) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if a.c.deleteOrphan(ctx, list, key, newOrphan(a.token, a.ttl, last, sends == 1)) {
		a.renew()
		return
	}
	a.retireIn(list, key, last, sends == 1)
}

// retire hands the call's token, whose last statement was sent before last,
// to the Client's orphan list (rule 2), and draws a fresh one for the
// call's next attempt (rule 1). once says that one send of it at most may
// have committed.
func (a *acquireCall) retire(last time.Time, once bool) { a.retireIn(&a.c.orphans, a.name, last, once) }

// retireIn is retire with the token remembered under key of list.
func (a *acquireCall) retireIn(list orphanList, key string, last time.Time, once bool) {
	a.c.log.Warn("sqllock: an acquire's outcome stays unknown; its lease, if any, is deleted before this Client's next acquire of the name", "name", a.name)
	list.book().Remember(key, newOrphan(a.token, a.ttl, last, once))
	a.c.unknown(key, false)
	if a.c.isClosed() {
		// Close's pass over the orphan list may have run already.
		a.c.releaseOrphansOf(list, key)
	}
	a.renew()
}

// renew draws a fresh token for the call's next attempt (rule 1). Should
// the system's random source fail, the call has no token, and its next
// attempt fails before anything is sent.
func (a *acquireCall) renew() {
	token, err := a.c.renewals.token(a.ttl)
	if err != nil {
		a.token, a.tokenErr = "", fmt.Errorf("sqllock: token: %w", err)
		return
	}
	a.token = token
}

// One attempt of every kind of lease (a name, a set, a slot of a
// semaphore) runs here, in run: the checks before anything is sent, the
// claim of the leases earlier acquires may have left, the statement, sent
// again with the same token while its connection breaks (fault.Send), the
// cleanup of an outcome left unknown (acquireCall's rules, acquire.go), what
// a failure means, and the Lock's start, including a Close that raced it.
// What a kind differs in is its leaseKind: its statement and how its answer
// is read, in acquire.go (a name), acquire_set.go (a set) and semaphore.go (a
// slot).

// A leaseKind is one kind's part of an attempt, for one acquireCall.
type leaseKind interface {
	// op begins the attempt's errors: `acquire "x"`.
	Op() string
	// ready makes what the kind needs before its first write (the
	// Client's first use, the kind's own proof) and readies a new
	// attempt; its error is the attempt's.
	ready(ctx context.Context) error
	// claim deletes the leases earlier acquires of the kind's names may
	// have left under tokens nobody holds (held.go).
	claim(ctx context.Context)
	// send sends the kind's statement once, as fault.Send does: unknown of
	// its sends had an unknown outcome.
	send(ctx context.Context) (res sql.Result, unknown int, err error)
	// heldBy returns the refusal err means for the kind (its rows stayed
	// locked by another transaction, say), or nil.
	heldBy(ctx context.Context, err error) error
	// read reads the answer of a statement first sent at sent and last
	// sent before last: the Lock taken, the kind's refusal, or again when
	// the kind sends another statement (a semaphore's wider visit). It
	// cleans up, or retires the token, as the answer asks.
	read(ctx context.Context, res sql.Result, sent, last time.Time, unknown int) (l *Lock, again bool, err error)
	// cleanup deletes what the attempt may have written, sends of which
	// may have committed, the last sent before last (acquireCall.cleanup).
	cleanup(ctx context.Context, last time.Time, sends int)
}

// run makes one attempt of a's call, of kind k.
func (a *acquireCall) run(ctx context.Context, k leaseKind) (*Lock, error) {
	c := a.c
	if c.isClosed() {
		return nil, ErrClosed
	}
	if a.tokenErr != nil {
		return nil, a.tokenErr
	}
	if err := k.ready(ctx); err != nil {
		return nil, err
	}
	// What the first use left to prove for want of a spare connection
	// (internal/engine/pool.go); with nothing left, this costs an atomic load.
	if c.eng.PoolProofPending() {
		if err := c.eng.ProvePending(ctx); err != nil {
			return nil, errorf("%s: %w", k.Op(), err)
		}
	}
	// Leases earlier acquires may have left under tokens nobody holds go
	// first; without any, this costs two atomic loads.
	if !c.orphans.Empty() || !c.semOrphans.Empty() {
		k.claim(ctx)
	}
	for {
		sent := time.Now()
		a.attempts++
		res, unknown, err := k.send(ctx)
		last := time.Now() // no send of the statement is later
		if err != nil {
			if unknown > 0 {
				// The lease may be ours under a token nobody will ever
				// use again; give it back rather than block it for ttl.
				k.cleanup(ctx, last, unknown)
			}
			return nil, a.failed(ctx, k, err)
		}
		l, again, err := k.read(ctx, res, sent, last, unknown)
		if again {
			continue
		}
		if err != nil {
			return nil, err
		}
		if unknown > 0 {
			l.sentTwice(last) // rule 3 of acquireCall
		}
		l.holdStarted()
		if !c.held.add(l) {
			// Close is releasing this Client's leases and has missed this
			// one.
			k.cleanup(ctx, last, unknown+1)
			l.holdEnded(observe.HoldClosed, ErrClosed)
			return nil, ErrClosed
		}
		return l, nil
	}
}

// failed returns the error of an attempt of kind k whose statement failed
// with err: the kind's refusal, the context's end (which wraps
// ErrNotAcquired), or what the server's error means.
func (a *acquireCall) failed(ctx context.Context, k leaseKind, err error) error {
	if held := k.heldBy(ctx, err); held != nil {
		return held
	}
	if cerr := ctxErr(ctx); cerr != nil {
		if errors.Is(err, cerr) {
			return errorf("%s: %w: %w%s", k.Op(), ErrNotAcquired, err, a.c.poolFull())
		}
		return errorf("%s: %w: %w (last error: %w)%s", k.Op(), ErrNotAcquired, cerr, err, a.c.poolFull())
	}
	return a.c.serverError(k.Op(), err)
}

// acquireDone reports the acquire call a, begun at start, that returned l
// and err.
func (r *reporter) acquireDone(ctx context.Context, a *acquireCall, start time.Time, l *Lock, err error) {
	if r.obs.AcquireDone == nil {
		return
	}
	ev := observe.AcquireEvent{Ctx: ctx, Name: a.name, Outcome: acquireOutcome(err), Start: start,
		Wait: time.Since(start), Attempts: a.attempts, Err: err}
	if l != nil {
		ev.Fence = l.fence
	}
	observed(r, r.obs.AcquireDone, ev)
}
