package sqllock

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// The acquire path: TryAcquire, Acquire (whose queue is in waiters.go) and
// Elect's campaign each make one acquireCall, which draws the call's owner
// token, sends its attempts, and owns what an attempt whose outcome stays
// unknown leaves behind: it deletes that lease at once, and when the DELETE
// does not settle it, hands the token to the Client's orphan list when the
// call ends. Read from TryAcquire down; the orphan list is at the end.

// checkName returns an error naming what is wrong with a lock name.
func checkName(name string) error {
	switch {
	case name == "":
		return errors.New("sqllock: empty lock name")
	case len(name) > MaxNameLen:
		return fmt.Errorf("sqllock: lock name is %d bytes, longer than the %d the table holds", len(name), MaxNameLen)
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

// maxTiDBFence is where fences end on TiDB: its LAST_INSERT_ID(expr) takes
// a signed 64-bit value, and a refresh sets the fence plus one. Fences start
// at the clock in microseconds (about 2^51) and grow by one per acquire.
const maxTiDBFence = math.MaxInt64 - 1

// TryAcquire makes one attempt to take the lease on name for ttl, measured by
// the server's clock. It succeeds when the name is free, when its lease has
// expired (whoever held it), and returns an error wrapping [ErrNotAcquired]
// when another owner's lease is live. Each call draws a fresh random owner
// token. The attempt is one statement. When the server rolls it back (a
// deadlock, a cluster certification conflict) it is sent again with the same
// token, with jittered pauses, until ctx's deadline (at most 5s on); a broken
// connection is retried a few times. A server that refuses it (read-only, no
// server listening) applied nothing, and its error comes back at once.
//
// When the outcome stays unknown (the connection broke after the statement
// was sent, or ctx ended while it ran), the acquire deletes the lease it may
// have taken; if that fails too, the Client remembers the token, and its next
// acquire of name, or Close, deletes that lease first, so that the name is
// not blocked for ttl by a lease nobody holds.
func (c *Client) TryAcquire(ctx context.Context, name string, ttl time.Duration) (*Lock, error) {
	a, err := c.newAcquireCall(name, ttl)
	if err != nil {
		return nil, err
	}
	return a.attempt(ctx)
}

// Acquire takes the lease on name for ttl like [Client.TryAcquire], waiting
// between attempts as the Client's [RetryStrategy] says, until it succeeds,
// the strategy gives up, or ctx ends. When ctx ends first, the error
// satisfies both errors.Is(err, ErrNotAcquired) and errors.Is(err, ctx.Err()).
// One token serves the attempts of one call until one's outcome is unknown;
// the next then draws another (see acquireCall).
//
// Calls of one Client waiting for the same name queue up and share one
// poller: only the first in line sends statements, so a thousand waiting
// goroutines load the server like one. Each statement it sends counts as an
// attempt of every call in the queue when the answer comes, for the
// strategy's count. An error that may pass (a failover's read-only server,
// a restart, too many connections) counts as a refused attempt too; when the
// strategy gives up, or ctx ends, the error wraps the last such error. Other
// errors (a missing table, a refused login) end the call at once. A
// [Lock.Release] of the name in the same Client, or a
// [Lock.Refresh] that finds its lease lost, makes the first in line try at
// once, without waiting for its next poll. Callers in other Clients (other
// processes) learn of a release only when they poll: within the strategy's
// longest wait; with [WithWakeups], the release wakes the process that has
// waited longest at once, and a waiting process does not poll.
func (c *Client) Acquire(ctx context.Context, name string, ttl time.Duration) (*Lock, error) {
	a, err := c.newAcquireCall(name, ttl)
	if err != nil {
		return nil, err
	}
	if _, ok := c.retry.Backoff(1); !ok {
		// A strategy that never retries makes Acquire a TryAcquire; a
		// queue would only delay its one answer.
		return a.attempt(ctx)
	}
	return c.acquireQueued(ctx, &a)
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
//     the call's later attempts answer, unless a DELETE by it, sent after
//     the token's last statement could still commit, settled it. The list
//     deletes its lease before the Client's next acquire of the name, and
//     at Close.
//  3. An attempt whose statement was sent again (exec retries a broken
//     connection with the same token) and then took the lease returns a Lock
//     under that token: its earlier send may run late. While the Lock holds
//     the name, that send finds the lease already ours and sets an expiry
//     from its own start, no earlier than the Lock's ValidUntil, which counts
//     from the first send. After the Lock's release it could take the name
//     under a token nobody holds: so the Lock's release hands the token to
//     the orphan list until such a send can no longer commit (lateUntil).
type acquireCall struct {
	c        *Client
	name     string
	ttl      time.Duration
	token    string
	tokenErr error // renew could not draw a token
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
	token, err := newToken()
	if err != nil {
		return acquireCall{}, fmt.Errorf("sqllock: token: %w", err)
	}
	return acquireCall{c: c, name: name, ttl: ttl, token: token}, nil
}

// attempt sends one acquire statement, and cleans up after it when its
// outcome stays unknown.
func (a *acquireCall) attempt(ctx context.Context) (*Lock, error) {
	c, name, ttl, token := a.c, a.name, a.ttl, a.token
	if c.isClosed() {
		return nil, ErrClosed
	}
	if a.tokenErr != nil {
		return nil, a.tokenErr
	}
	// Leases earlier acquires of name may have left under tokens nobody
	// holds go first; without any, this costs an atomic load.
	c.claimOrphans(ctx, name)
	// Each argument is boxed once (a string or an int64 converted to any
	// allocates), and the Lock, made first, keeps name and token boxed for
	// Refresh and Release: the statements use them several times.
	l := newLock(c, name, token, 0, ttl, time.Time{})
	nameArg, tokenArg := l.keyArgs()
	us := any(ttl.Microseconds())
	sent := time.Now()
	res, maybeApplied, err := c.exec(ctx, qAcquire,
		nameArg, tokenArg, c.holderArg, us, nameArg,
		tokenArg, c.holderArg, tokenArg, us)
	if err != nil {
		if maybeApplied {
			// The lease may be ours under a token nobody will ever use
			// again; give the name back rather than block it for ttl.
			a.cleanup(ctx, sent)
		}
		if n, ok := serverErrno(err); ok && n == erLockWaitTimeout {
			// Another transaction kept the lease row locked past the
			// acquire's bound (queries.sql, lock_wait_mariadb; on MySQL,
			// innodb_lock_wait_timeout): a holder's Lock.Check, most
			// likely. The name is held; say so now.
			return nil, fmt.Errorf("%w: %q is held: its lease row stayed locked by another transaction (a holder's Lock.Check?): %w", ErrNotAcquired, name, err)
		}
		if cerr := ctxErr(ctx); cerr != nil {
			if errors.Is(err, cerr) {
				return nil, errorf("acquire %q: %w: %w", name, ErrNotAcquired, err)
			}
			return nil, errorf("acquire %q: %w: %w (last error: %w)", name, ErrNotAcquired, cerr, err)
		}
		return nil, c.serverError(fmt.Sprintf("acquire %q", name), err)
	}
	id, err := res.LastInsertId()
	if err != nil {
		if maybeApplied {
			a.retire(sent) // rule 2: nothing settled it
		}
		return nil, fmt.Errorf("sqllock: acquire %q: %w", name, err)
	}
	// The OK packet carries the insert id unsigned; the driver hands it
	// over as an int64, negative from 2^63 on.
	fence := uint64(id)
	switch {
	case fence == 0:
		if maybeApplied {
			// An earlier send of this attempt may commit later, once the
			// other owner's lease ends (rule 2).
			a.retire(sent)
		}
		return nil, fmt.Errorf("%w: %q is held by another owner", ErrNotAcquired, name)
	case fence <= 2:
		// The lease row's mark came through: the fence row was missing
		// while the lease was ours, which only a hand-made change can do.
		// The lease is ours, under a token nobody will use: give it back.
		a.cleanup(ctx, sent)
		return nil, fmt.Errorf("sqllock: acquire %q: the fence row is missing (mark %d); the table was changed by hand", name, fence)
	case fence > maxTiDBFence && c.tidb.Load():
		// TiDB's LAST_INSERT_ID(expr) takes a signed value: past it, the
		// acquire fails (1690), or under a lenient sql_mode reports the
		// largest signed value, which may be below the fence it wrote.
		a.cleanup(ctx, sent)
		return nil, fmt.Errorf("sqllock: acquire %q: the fence reached TiDB's largest, %d", name, uint64(maxTiDBFence))
	}
	l.fence, l.validUntil = fence, sent.Add(ttl)
	if maybeApplied {
		l.lateUntil = sent.Add(orphanWait) // rule 3
	}
	if !c.held.add(l) {
		// Close is releasing this Client's leases and has missed this one.
		a.cleanup(ctx, sent)
		return nil, ErrClosed
	}
	return l, nil
}

// cleanup deletes the row the attempt sent at sent may have written (its
// outcome is unknown, or it lost the race with Close), with a context of its
// own: the caller's may have ended. Then it retires the token (rule 1), and
// hands it to the orphan list unless the DELETE settled it (rule 2).
func (a *acquireCall) cleanup(ctx context.Context, sent time.Time) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if a.c.deleteOrphan(ctx, a.name, orphan{token: a.token, settled: sent.Add(orphanWait)}) {
		a.renew()
		return
	}
	a.retire(sent)
}

// retire hands the call's token, whose last statement was sent at sent, to
// the Client's orphan list (rule 2), and draws a fresh one for the call's
// next attempt (rule 1).
func (a *acquireCall) retire(sent time.Time) {
	a.c.log.Warn("sqllock: an acquire's outcome stays unknown; its lease, if any, is deleted before this Client's next acquire of the name", "name", a.name)
	a.c.orphans.remember(a.name, a.token, a.ttl, sent)
	if a.c.isClosed() {
		// Close's pass over the orphan list may have run already.
		a.c.releaseOrphansOf(a.name)
	}
	a.renew()
}

// renew draws a fresh token for the call's next attempt (rule 1). Should
// the system's random source fail, the call has no token, and its next
// attempt fails before anything is sent.
func (a *acquireCall) renew() {
	token, err := newToken()
	if err != nil {
		a.token, a.tokenErr = "", fmt.Errorf("sqllock: token: %w", err)
		return
	}
	a.token = token
}

// ---------------------------------------------------------------------------
// The orphan list

// An acquire whose outcome is unknown (the connection broke after the
// statement was sent, or the caller's context cut it) may have taken the
// lease under a token nobody holds. The acquire deletes that row at once
// (cleanup), but the DELETE proves the lease gone only when it deletes it:
// when it fails (the server is away: a restart, a failover) or finds no row
// (the acquire may still be waiting for a row lock on the server, and commit
// later), the Client remembers the token, which the call has retired (see
// acquireCall), and every later acquire of the name in this
// Client first deletes the lease that token may hold, so the name does not
// stay blocked for the whole ttl. Close does the same for every remembered
// token. A token is forgotten once such a DELETE removes its lease, or once
// it can no longer hold one: its statement can have committed no later than
// orphanWait after it was sent, and its lease lasted ttl from then. Until
// then, each acquire of the name costs one DELETE more.
//
// The bound assumes the server's lock wait timeout is at most its default:
// with a longer one, a cut acquire that waits longer still and then commits
// leaves a lease that only expires.

// orphanWait bounds how long after it was sent a cut acquire may still
// commit on the server: longer than InnoDB's default lock wait timeout
// (innodb_lock_wait_timeout, 50 s), after which a waiting statement gives up.
const orphanWait = time.Minute

// maxOrphans bounds how many tokens a Client remembers; past it, the one that
// would be forgotten first goes, and its lease, if any, expires by itself.
const maxOrphans = 1024

// orphans is a Client's memory of the tokens of acquires whose outcome stays
// unknown. The zero value is ready to use.
type orphans struct {
	// n counts the tokens, so that an acquire skips the mutex while there
	// are none: the common case costs one atomic load.
	n atomic.Int64

	mu     sync.Mutex
	byName map[string][]orphan
}

// An orphan is the token of one acquire whose outcome stays unknown.
type orphan struct {
	token string
	// settled is when the acquire can no longer commit: from then on a
	// DELETE that finds no row proves that no lease is left.
	settled time.Time
	// expires is when a lease the acquire took has expired for sure.
	expires time.Time
}

// remember records token, of an acquire of name for ttl sent at sent. The
// attempts of one Acquire share a token, so it is remembered once, with the
// latest times.
func (o *orphans) remember(name, token string, ttl time.Duration, sent time.Time) {
	settled := sent.Add(orphanWait)
	o.putBack(name, []orphan{{token: token, settled: settled, expires: settled.Add(ttl)}})
}

// evictLocked forgets the token whose lease expires first. o.mu must be held.
func (o *orphans) evictLocked() {
	var (
		first string
		at    int
		when  time.Time
	)
	for name, xs := range o.byName {
		for i, x := range xs {
			if when.IsZero() || x.expires.Before(when) {
				first, at, when = name, i, x.expires
			}
		}
	}
	if !when.IsZero() {
		o.dropLocked(first, at)
	}
}

// dropLocked forgets the i-th token of name. o.mu must be held.
func (o *orphans) dropLocked(name string, i int) {
	xs := o.byName[name]
	xs = append(xs[:i:i], xs[i+1:]...)
	if len(xs) == 0 {
		delete(o.byName, name)
	} else {
		o.byName[name] = xs
	}
	o.n.Add(-1)
}

// take removes and returns the tokens remembered for name, dropping those
// whose lease has expired for sure.
func (o *orphans) take(name string, now time.Time) []orphan {
	if o.n.Load() == 0 {
		return nil
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	xs := o.byName[name]
	if len(xs) == 0 {
		return nil
	}
	delete(o.byName, name)
	o.n.Add(-int64(len(xs)))
	live := xs[:0]
	for _, x := range xs {
		if now.Before(x.expires) {
			live = append(live, x)
		}
	}
	return live
}

// takeAll removes and returns every token remembered, by name.
func (o *orphans) takeAll() map[string][]orphan {
	o.mu.Lock()
	defer o.mu.Unlock()
	all := o.byName
	o.byName = nil
	o.n.Store(0)
	return all
}

// putBack remembers tokens of name: again, when they were taken with take.
func (o *orphans) putBack(name string, xs []orphan) {
	if len(xs) == 0 {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.byName == nil {
		o.byName = make(map[string][]orphan)
	}
next:
	for _, x := range xs {
		for i, y := range o.byName[name] {
			if y.token == x.token {
				y.settled = maxTime(y.settled, x.settled)
				y.expires = maxTime(y.expires, x.expires)
				o.byName[name][i] = y
				continue next
			}
		}
		if o.n.Load() >= maxOrphans {
			o.evictLocked()
		}
		o.byName[name] = append(o.byName[name], x)
		o.n.Add(1)
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// remembered returns how many tokens are remembered for name; for tests.
func (o *orphans) remembered(name string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.byName[name])
}

// deleteOrphan deletes the lease token may hold on name and reports whether
// that settles it: the DELETE removed the lease, or found none after the
// acquire could still commit.
func (c *Client) deleteOrphan(ctx context.Context, name string, x orphan) bool {
	// Judged by when the DELETE was sent, not when its reply came: sent
	// after the acquire could commit, finding no row proves none is left.
	sent := time.Now()
	res, _, err := c.exec(ctx, qRelease, name, x.token)
	if errors.Is(err, ErrClosed) {
		// Close has closed the statements, or this Client never prepared
		// the release; the *sql.DB is still open: send it unprepared.
		err = retryTransient(ctx, func() (err error) {
			res, err = c.db.ExecContext(ctx, c.sql[qRelease], name, x.token)
			return err
		})
	}
	if err != nil {
		return false
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false
	}
	return n == 1 || sent.After(x.settled)
}

// claimOrphans deletes the leases that acquires of name with an unknown
// outcome may have left, before this Client acquires name again; the tokens
// that stay unsettled are remembered again. It sends nothing when there are
// none.
func (c *Client) claimOrphans(ctx context.Context, name string) {
	xs := c.orphans.take(name, time.Now())
	if len(xs) == 0 {
		return
	}
	var keep []orphan
	for _, x := range xs {
		if !c.deleteOrphan(ctx, name, x) {
			keep = append(keep, x)
		}
	}
	c.orphans.putBack(name, keep)
}

// releaseOrphans deletes the leases of every remembered token, for Close,
// until ctx ends. Whatever fails expires by itself.
func (c *Client) releaseOrphans(ctx context.Context) {
	now := time.Now()
	for name, xs := range c.orphans.takeAll() {
		for _, x := range xs {
			if now.Before(x.expires) {
				c.deleteOrphan(ctx, name, x)
			}
		}
	}
}

// releaseOrphansOf deletes the leases of the tokens remembered for name,
// with a context of its own, for a token remembered once Close has started:
// Close's pass over the list may have run already. Whatever fails expires
// by itself.
func (c *Client) releaseOrphansOf(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	for _, x := range c.orphans.take(name, time.Now()) {
		c.deleteOrphan(ctx, name, x)
	}
}
