package sqllock

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// Acquire calls of one Client that wait for the same name share one poller,
// so that a process sends the same statements per second whether one
// goroutine waits for a name or a thousand do. The callers form a queue in
// arrival order. Only its head sends statements, as the RetryStrategy paces
// them; the others sleep on a channel. There is no background goroutine:
// when the head leaves (it acquired, its context ended, its strategy gave
// up, or it met an error) the next caller becomes the head and keeps the
// same schedule. A Release, or a lease found lost, of that name in the same
// Client makes the head try at once instead of waiting for its next poll.
//
// Attempts are counted per caller, as they were when each caller polled on
// its own: every refused statement the head sends counts as an attempt of
// every caller in the queue when its answer comes, and each caller asks the
// strategy with its own count whether to go on and, when it is the head,
// how long to wait. So LimitRetry(s, n) still ends a call after n refusals,
// and a lone caller waits exactly as it did before. An acquisition by
// another caller of the same Client is not a refusal: nothing was sent on
// the follower's behalf.

// waiters holds a Client's queues, one per name that callers wait for. The
// zero value is ready to use.
type waiters struct {
	// queued counts the queues, so that Release and Refresh, which look
	// for a queue to wake, skip the mutex while nobody waits.
	queued atomic.Int64

	mu     sync.Mutex
	queues map[string]*waitQueue
}

// A waitQueue is the callers waiting for one name.
type waitQueue struct {
	waiters []*waiter // in arrival order; waiters[0] is the head
	next    time.Time // when the head tries next
	// kicked is set when the name was released or found lost in this
	// Client after the head's statement was sent: its answer is stale, so
	// the head tries again at once.
	kicked bool
}

// A waiter is one Acquire call in a queue.
type waiter struct {
	wake     chan struct{} // buffered: something changed; look again
	attempts int           // refused attempts counted for this call
	gaveUp   bool          // its strategy gave up; it has left the queue
}

// join puts w at the end of the queue for name, making a queue (whose head
// tries at once) if there is none.
func (ws *waiters) join(name string, w *waiter) *waitQueue {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	q := ws.queues[name]
	if q == nil {
		if ws.queues == nil {
			ws.queues = make(map[string]*waitQueue)
		}
		q = &waitQueue{next: time.Now()}
		ws.queues[name] = q
		ws.queued.Add(1)
	}
	q.waiters = append(q.waiters, w)
	return q
}

// remove takes w out of q and drops q when it is empty. When w was the
// head, the next caller is woken to take its place. ws.mu must be held.
func (ws *waiters) remove(name string, q *waitQueue, w *waiter) {
	for i, x := range q.waiters {
		if x == w {
			copy(q.waiters[i:], q.waiters[i+1:])
			q.waiters[len(q.waiters)-1] = nil // let w be collected
			q.waiters = q.waiters[:len(q.waiters)-1]
			if i == 0 && len(q.waiters) > 0 {
				q.waiters[0].notify()
			}
			break
		}
	}
	if len(q.waiters) == 0 && ws.queues[name] == q {
		delete(ws.queues, name)
		ws.queued.Add(-1)
	}
}

func (w *waiter) notify() {
	select {
	case w.wake <- struct{}{}:
	default: // a wake is already pending; one is enough
	}
}

// leave takes w out of q: its call returns without the lock.
func (ws *waiters) leave(name string, q *waitQueue, w *waiter) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.remove(name, q, w)
}

// acquired takes the head w out of q after it took the lock. The next head
// waits one step of its strategy before trying: the name is held in this
// Client, whose Release will wake it sooner.
func (ws *waiters) acquired(name string, q *waitQueue, w *waiter, s RetryStrategy) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.remove(name, q, w)
	if len(q.waiters) > 0 && !q.kicked {
		d, _ := s.Backoff(max(q.waiters[0].attempts, 1))
		q.next = time.Now().Add(d)
	}
}

// refused counts a refused attempt of the head w for every caller in q,
// removes (and wakes) those whose strategy gives up, and sets when the head
// tries next. It reports whether w itself goes on waiting.
func (ws *waiters) refused(name string, q *waitQueue, w *waiter, s RetryStrategy) bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	var headWait time.Duration
	for i := 0; i < len(q.waiters); {
		x := q.waiters[i]
		x.attempts++
		d, ok := s.Backoff(x.attempts)
		if !ok {
			x.gaveUp = true
			ws.remove(name, q, x)
			if x != w {
				x.notify()
			}
			continue
		}
		if i == 0 {
			headWait = d // the head after removals, w or its successor
		}
		i++
	}
	if !q.kicked {
		q.next = time.Now().Add(headWait)
	}
	return !w.gaveUp
}

// kick tells the callers waiting for name in this Client that its lease was
// released or lost here: the head tries at once.
func (ws *waiters) kick(name string) {
	if ws.queued.Load() == 0 {
		return
	}
	ws.mu.Lock()
	defer ws.mu.Unlock()
	q := ws.queues[name]
	if q == nil {
		return
	}
	q.kicked = true
	q.next = time.Now()
	q.waiters[0].notify()
}

// waiting returns how many callers wait for name; for tests.
func (ws *waiters) waiting(name string) int {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if q := ws.queues[name]; q != nil {
		return len(q.waiters)
	}
	return 0
}

// acquireQueued is Acquire for a strategy that may retry: the call joins
// the name's queue and waits there, trying only while it is the head. With
// wake-up channels on (wake.go), the head of a name this Client waited for
// waits on the channel instead of sleeping between attempts.
func (c *Client) acquireQueued(ctx context.Context, a *acquireCall) (*Lock, error) {
	name, ttl := a.name, a.ttl
	var lock *Lock // set when the call returns one
	ws := &c.waiters
	w := &waiter{wake: make(chan struct{}, 1)}
	q := ws.join(name, w)
	useWake := c.wake.on && c.wake.contended(name)
	waited := false        // refused, or queued behind another process
	refusedBefore := false // an attempt of this call was refused
	defer func() {
		if lock == nil {
			if c.wake.on && ws.waiting(name) == 0 {
				// Nobody here waits for the name any more: the next
				// process may have the channel this queue holds.
				c.letGo(ctx, name, nil)
			}
		}
	}()
	var lastErr error // the last passable error, while no answer came since
	for {
		ws.mu.Lock()
		if w.gaveUp {
			ws.mu.Unlock()
			return nil, heldError(name)
		}
		head := q.waiters[0] == w
		wait := time.Until(q.next)
		ws.mu.Unlock()

		if head && !useWake && c.wake.on {
			// A release of this Client that had waited for the name
			// makes the queue wait behind the other processes.
			useWake = c.wake.contended(name)
		}
		granted := false // the channel woke this head: the name was let go of
		if head && useWake {
			began := c.obsNow(c.obs.Wakeup != nil)
			st, queued, err := c.waitWake(ctx, name, ttl)
			c.waitWoke(name, st, err, began)
			if err != nil {
				ws.leave(name, q, w)
				return nil, c.waitEnded(name, err, lastErr)
			}
			waited = waited || queued
			granted = st == wakeGranted
			if st == wakeGranted || st == wakeTimedOut {
				wait = 0 // the channel was the wait
			}
		}
		kicked := false // a Release of this Client woke this head
		if head && wait <= 0 {
			ws.mu.Lock()
			kicked = q.kicked
			q.kicked = false // this attempt sees every release so far
			ws.mu.Unlock()
		}

		if !head || wait > 0 {
			if err := c.sleepQueued(ctx, w, head, wait); err != nil {
				ws.leave(name, q, w)
				return nil, c.waitEnded(name, err, lastErr)
			}
			continue
		}

		if refusedBefore && !granted && !kicked && ws.queued.Load() > lookAbove && !c.orphans.has(name) {
			// The name was held at the last answer, and this Client
			// waits for many: ask whether it is free, with the other
			// names due now, in one statement (poll.go), and send the
			// acquire only if it is.
			held, err := c.lookHeld(ctx, name)
			if err != nil && (errors.Is(err, ErrClosed) || ctxErr(ctx) != nil) {
				ws.leave(name, q, w)
				return nil, c.waitEnded(name, err, lastErr)
			}
			if err == nil && held {
				lastErr = nil
				if c.wake.on {
					c.wake.waited(name) // as a refused acquire does
				}
				if !ws.refused(name, q, w, c.retry) {
					return nil, heldError(name)
				}
				continue
			}
			// Free, or the look failed: the acquire decides.
		}
		if err := c.attemptSlot(ctx); err != nil {
			ws.leave(name, q, w)
			return nil, c.waitEnded(name, err, lastErr)
		}
		l, err := a.attempt(ctx)
		c.putAttemptSlot()
		if err == nil {
			if c.wake.on {
				// The channel the queue holds, if any, goes with the
				// lease: whichever head waited on it.
				c.wake.handTo(ctx, name, l)
				if waited {
					c.wake.waited(name)
				}
				l.mu.Lock()
				l.contended, l.probe = waited, !waited
				l.mu.Unlock()
			}
			ws.acquired(name, q, w, c.retry)
			lock = l
			return l, nil
		}
		// The context is read once: it may end at any moment, and a caller
		// whose context ended must see its error whatever the answer was.
		cerr := ctxErr(ctx)
		switch {
		case cerr == nil && errors.Is(err, ErrNotAcquired):
			lastErr = nil
			waited, refusedBefore = true, true
			if c.wake.on {
				useWake = true
				c.wake.waited(name) // the callers behind this one wait on the channel too
			}
		case cerr == nil && passable(err):
			// A failover, a restart, a full server: it may pass, so it
			// counts as a refused attempt; the last one says why the call
			// failed if it does not.
			lastErr = err
		default:
			ws.leave(name, q, w)
			if cerr != nil && !errors.Is(err, cerr) {
				if lastErr == nil && !errors.Is(err, ErrNotAcquired) {
					lastErr = err
				}
				if lastErr != nil {
					return nil, errorf("acquire %q: %w: %w (last error: %w)", name, ErrNotAcquired, cerr, lastErr)
				}
				return nil, errorf("acquire %q: %w: %w", name, ErrNotAcquired, cerr)
			}
			return nil, err
		}
		if !ws.refused(name, q, w, c.retry) {
			return nil, err
		}
	}
}

// waitEnded is the error of an Acquire of name whose wait ended with err
// (its context's, or ErrClosed); lastErr is the last passable error since
// the last answer, if any.
func (c *Client) waitEnded(name string, err, lastErr error) error {
	switch {
	case errors.Is(err, ErrClosed):
		return err
	case lastErr != nil:
		return errorf("acquire %q: %w: %w (last error: %w)", name, ErrNotAcquired, err, lastErr)
	}
	return errorf("acquire %q: %w: %w", name, ErrNotAcquired, err)
}

// sleepQueued blocks until w is woken, or, for the head, until wait has
// passed; it returns the context's error when ctx ends first and ErrClosed
// when the Client is closed.
func (c *Client) sleepQueued(ctx context.Context, w *waiter, head bool, wait time.Duration) error {
	var timeout <-chan time.Time
	if head {
		t := time.NewTimer(wait)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-w.wake:
	case <-timeout:
	case <-ctx.Done():
		return ctx.Err()
	case <-c.closing:
		return ErrClosed
	}
	return nil
}
