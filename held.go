package sqllock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/sqllock/sqllock/internal/engine"
	"github.com/sqllock/sqllock/internal/fault"
	"github.com/sqllock/sqllock/internal/settle"
	"github.com/sqllock/sqllock/observe"
)

// closeTimeout bounds Close: the releases it sends, all of them together,
// and then the closing of its statements.
const closeTimeout = 5 * time.Second

// closeParallel is how many releases Close sends at once, so that one
// stuck on a dead connection does not hold up the others.
const closeParallel = 8

// held is a Client's registry of the Locks it acquired and has not released,
// for Held and Close. A Lock leaves it when it is released or lost; a Lock
// whose lease lapsed without a Release is swept out as the registry grows,
// so a caller that lets leases expire on purpose does not make it grow.
type held struct {
	mu      sync.Mutex
	locks   map[*Lock]struct{}
	closing bool // Close has taken the Locks; no more may join
	sweepAt int  // sweep when the registry reaches this size
}

// add registers l; it returns false when the Client is closing.
func (h *held) add(l *Lock) bool {
	h.mu.Lock()
	if h.closing {
		h.mu.Unlock()
		return false
	}
	if h.locks == nil {
		h.locks = make(map[*Lock]struct{})
	}
	h.locks[l] = struct{}{}
	var lapsed []*Lock // for the Observer, told after h.mu
	if len(h.locks) >= h.sweepAt {
		now := time.Now()
		for o := range h.locks {
			if !o.knownLive(now) {
				delete(h.locks, o)
				if o.c.obs.HoldEnd != nil {
					lapsed = append(lapsed, o)
				}
			}
		}
		h.sweepAt = max(2*len(h.locks), 64)
	}
	h.mu.Unlock()
	for _, o := range lapsed {
		o.holdEnded(observe.HoldLapsed, nil) // unless its release or loss was told
	}
	return true
}

// readd registers l again after a Refresh made its lease live again: a
// sweep may have dropped it while its ValidUntil had passed, though nobody
// had taken the name. It does nothing for a released Lock, or once Close has
// taken the Locks (the lease then expires by itself).
func (h *held) readd(l *Lock) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closing || h.locks == nil {
		return
	}
	if _, ok := h.locks[l]; ok {
		return
	}
	l.mu.Lock()
	released := l.released
	l.mu.Unlock()
	if !released {
		h.locks[l] = struct{}{}
	}
}

func (h *held) remove(l *Lock) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.locks, l)
}

// knownLive reports whether l is neither released nor lost and its lease
// cannot have expired by now.
func (l *Lock) knownLive(now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	lost := l.ka != nil && errors.Is(l.ka.cause, ErrLockLost)
	return !l.released && !lost && now.Before(l.validUntil)
}

// Held returns, sorted, the names on which this Client holds a lease it
// knows to be live: acquired, neither released nor lost, and before its
// [Lock.ValidUntil]. It sends nothing to the server.
func (c *Client) Held() []string {
	c.held.mu.Lock()
	locks := make([]*Lock, 0, len(c.held.locks))
	for l := range c.held.locks {
		locks = append(locks, l)
	}
	c.held.mu.Unlock()
	now := time.Now()
	var names []string
	for _, l := range locks {
		if l.knownLive(now) {
			names = append(names, l.Names()...)
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// releaseHeld takes every registered Lock, so that no more can register,
// and releases each within ctx, its keep-alive's contexts ending with
// [ErrClosed].
func (c *Client) releaseHeld(ctx context.Context) error {
	c.held.mu.Lock()
	c.held.closing = true
	locks := c.held.locks
	c.held.locks = nil
	c.held.mu.Unlock()
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
		sem  = make(chan struct{}, closeParallel)
	)
	for l := range locks {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			cause := fmt.Errorf("%w: the lease on %s was released by Close", ErrClosed, l.label())
			err := l.release(ctx, 0, cause)
			l.logClosed(err)
			if err != nil && !errors.Is(err, ErrNotHeld) {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return joinErrors(errs...)
}

// The tokens whose leases may be left on the server (an acquire whose
// outcome stays unknown, a Lock whose acquire was sent more than once) are
// remembered in one of the Client's two orphan lists, names' (by name) or
// semaphores' (by semaphore: the token may hold any of its slots), and
// settled by internal/settle's one rule; this file sends their DELETEs.
// Every later acquire first deletes the leases its tokens may hold
// (claimOrphans), and Close deletes them all (releaseOrphans). The
// package's comment gives the rule and its bound.

// An orphan is a token an orphan list remembers.
type orphan = settle.Token

// An orphanList is the orphan list of one kind of lease: a settle.Book, and
// the DELETE of what a token may hold under one of its keys.
type orphanList interface {
	book() *settle.Book
	deleteByToken(ctx context.Context, c *Client, key, token string) (int64, error)
}

// nameOrphans is the orphan list of names' leases, keyed by name.
type nameOrphans struct{ settle.Book }

// semOrphans is the orphan list of semaphores' slots, keyed by the
// semaphore's name (semaphore.go deletes them).
type semOrphans struct{ settle.Book }

func (o *nameOrphans) book() *settle.Book { return &o.Book }
func (o *semOrphans) book() *settle.Book  { return &o.Book }

// newOrphan returns token, of an acquire for ttl whose last send was at
// last at the latest; once says that only one of its sends may have
// committed.
func newOrphan(token string, ttl time.Duration, last time.Time, once bool) orphan {
	return settle.NewToken(token, ttl, last, once)
}

// orphanWait bounds how long after it was sent a cut acquire may still
// commit on the server (settle.Wait).
const orphanWait = settle.Wait

// deleteOrphan deletes what x may hold under key of list, and reports
// whether that settles it (settle.Delete).
func (c *Client) deleteOrphan(ctx context.Context, list orphanList, key string, x orphan) bool {
	if !settle.Delete(ctx, x, func(ctx context.Context, token string) (int64, error) { return list.deleteByToken(ctx, c, key, token) }) {
		return false
	}
	c.unknown(key, true)
	return true
}

// deleteByToken deletes the lease token holds on name and returns how many
// rows went.
func (*nameOrphans) deleteByToken(ctx context.Context, c *Client, name, token string) (int64, error) {
	res, _, err := c.eng.Exec(ctx, engine.Send{Stmt: qRelease, Args: []any{name, token}})
	if errors.Is(err, ErrClosed) {
		// Close has closed the statements, or this Client never
		// prepared the release; the *sql.DB is still open: send it
		// unprepared.
		err = fault.Transient(ctx, func() (err error) {
			res, err = c.db.ExecContext(ctx, c.eng.Forms().SQL[qRelease], name, token)
			return err
		})
	}
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// claimOrphans deletes the leases that acquires with an unknown outcome
// may have left under key of list, before this Client acquires it again;
// the tokens that stay unsettled are remembered again. It sends nothing
// when there are none.
func (c *Client) claimOrphans(ctx context.Context, list orphanList, key string) {
	list.book().Claim(key, func(x orphan) bool { return c.deleteOrphan(ctx, list, key, x) })
}

// releaseOrphans deletes the leases of every remembered token, for Close,
// until ctx ends. Whatever fails expires by itself.
func (c *Client) releaseOrphans(ctx context.Context) {
	now := time.Now()
	for _, list := range []orphanList{&c.orphans, &c.semOrphans} {
		for key, xs := range list.book().TakeAll() {
			for _, x := range xs {
				if now.Before(x.Expires) {
					c.deleteOrphan(ctx, list, key, x)
				}
			}
		}
	}
}

// releaseOrphansOf deletes the leases of the tokens remembered under key
// of list, with a context of its own, for a token remembered once Close
// has started: Close's pass over the lists may have run already. Whatever
// fails expires by itself.
func (c *Client) releaseOrphansOf(list orphanList, key string) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	for _, x := range list.book().Take(key, time.Now()) {
		c.deleteOrphan(ctx, list, key, x)
	}
}
