package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqllock/sqllock/internal/fault"
)

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
// token. A token is forgotten once such a DELETE removes its lease, when
// only one send of it may have committed (a statement resent after a broken
// connection may have several in flight, and removing what one wrote proves
// nothing of the others), or once it can no longer hold one: its statements
// can have committed no later than orphanWait after the last was sent, and
// their lease lasted ttl from then. Until then, each acquire of the name
// costs one DELETE more. A lease a release with a minimum hold keeps under
// the token on purpose (WithMinHold) is left alone until the hold ends.
//
// The bound assumes the server's lock wait timeout is at most its default,
// and that no proxy or server queue holds a send back longer than the rest
// of orphanWait before the server starts it: otherwise a send that commits
// later still leaves a lease that only expires (docs/guarantees.md).

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
	// once: only one send of the token may have committed (the others
	// failed for sure), so a DELETE that removes its lease settles it. A
	// statement sent again after a broken connection may have several in
	// flight: removing what one wrote proves nothing of the others, which
	// are deleted again until settled.
	once bool
	// expires is when a lease the acquire took has expired for sure.
	expires time.Time
	// kept: a release with a minimum hold (WithMinHold) kept the lease
	// under the token on purpose until then at the latest; no DELETE by
	// the token is sent before, or the job would run again at once.
	kept time.Time
}

// newOrphan returns token, of an acquire for ttl whose last send was at
// last at the latest; once says that only one of its sends may have
// committed.
func newOrphan(token string, ttl time.Duration, last time.Time, once bool) orphan {
	settled := last.Add(orphanWait)
	return orphan{token: token, settled: settled, expires: settled.Add(ttl), once: once}
}

// remember records token, of an acquire of name for ttl whose last send was
// at last at the latest. The attempts of one Acquire share a token, so it
// is remembered once, with the latest times.
func (o *orphans) remember(name, token string, ttl time.Duration, last time.Time, once bool) {
	o.putBack(name, []orphan{newOrphan(token, ttl, last, once)})
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
				y.kept = maxTime(y.kept, x.kept)
				y.once = y.once && x.once
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

// has reports whether a token is remembered for name; without any, it
// costs an atomic load.
func (o *orphans) has(name string) bool {
	if o.n.Load() == 0 {
		return false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.byName[name]) > 0
}

// remembered returns how many tokens are remembered for name; for tests.
func (o *orphans) remembered(name string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.byName[name])
}

// settles reports whether a DELETE by an orphan's token, sent at sent,
// that removed n rows settles it: it removed what the acquire wrote, and
// only one send of it may have committed (once), or it was sent after the
// acquire could commit (settled), so finding no row proves none is left.
// Every kind of lease (a name, a set, a semaphore's slot) is settled by
// this one rule.
func (x orphan) settles(n int64, sent time.Time) bool {
	return n > 0 && x.once || sent.After(x.settled)
}

// deleteOrphan deletes the lease token may hold on name, or the slot it may
// hold in the semaphore whose fence row name is, and reports whether that
// settles it (settles).
func (c *Client) deleteOrphan(ctx context.Context, name string, x orphan) bool {
	if time.Now().Before(x.kept) {
		return false // the minimum hold still runs: its lease is no orphan
	}
	// Judged by when the DELETE was sent, not when its reply came: sent
	// after the acquire could commit, finding no row proves none is left.
	sent := time.Now()
	n, err := c.deleteByToken(ctx, name, x.token)
	if err != nil || !x.settles(n, sent) {
		return false
	}
	c.unknown(name, true)
	return true
}

// deleteByToken deletes the lease token holds on name, or any slot it holds
// in the semaphore whose fence row name is, and returns how many rows went.
func (c *Client) deleteByToken(ctx context.Context, name, token string) (int64, error) {
	var res sql.Result
	var err error
	if sem, ok := strings.CutSuffix(name, slotMark); ok {
		err = fault.Transient(ctx, func() (err error) {
			res, err = c.db.ExecContext(ctx, c.substitute(queries["slot_release"]), name, slotRowsEnd(sem), token)
			return err
		})
	} else {
		res, _, err = c.exec(ctx, qRelease, name, token)
		if errors.Is(err, ErrClosed) {
			// Close has closed the statements, or this Client never
			// prepared the release; the *sql.DB is still open: send it
			// unprepared.
			err = fault.Transient(ctx, func() (err error) {
				res, err = c.db.ExecContext(ctx, c.sql[qRelease], name, token)
				return err
			})
		}
	}
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// claimOrphans deletes the leases that acquires of name with an unknown
// outcome may have left, before this Client acquires name again; the tokens
// that stay unsettled are remembered again. It sends nothing when there are
// none.
func (c *Client) claimOrphans(ctx context.Context, name string) {
	if c.orphans.n.Load() == 0 {
		return // the common case: no clock read, no lock
	}
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
