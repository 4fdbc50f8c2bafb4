package sqllock

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// Acquire calls of one Client that wait for the same name share one poller
// (and so do AcquireAll calls for one set, and AcquireSlot calls for one
// semaphore: each kind's key names its queue, wait_kinds.go),
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
	// refusal is the last error that may pass (a read-only server, a
	// failover) that the queue's attempts met since the last answer: what
	// every caller of the queue, not only the head that met it, reports
	// when its wait ends without the lock.
	refusal error
	// held is the answer of the last attempt that found the key held (a
	// *HeldError for a set): what a caller whose strategy gave up returns.
	held error
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
// waits one step of its strategy before trying: the key is held in this
// Client, whose Release will wake it sooner; unless the key is shared (a
// semaphore's other slots may be free), when it tries at once.
func (ws *waiters) acquired(name string, q *waitQueue, w *waiter, s RetryStrategy, shared bool) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.remove(name, q, w)
	if shared {
		q.next = time.Now()
	} else if len(q.waiters) > 0 && !q.kicked {
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

// acquireQueued is the wait of every kind of acquire (wait_kinds.go) for
// a strategy that may retry: the call joins its key's queue and waits
// there, trying only while it is the head. With wake-up channels on
// (wake.go), the head of a key this Client waited for waits on the channel
// instead of sleeping between attempts.
func (c *Client) acquireQueued(ctx context.Context, call waitCall) (*Lock, error) {
	key, ttl := call.key(), call.leaseTTL()
	var lock *Lock // set when the call returns one
	ws := &c.waiters
	w := &waiter{wake: make(chan struct{}, 1)}
	q := ws.join(key, w)
	useWake := c.wake.on && c.wake.contended(key)
	waited := false        // refused, or queued behind another process
	refusedBefore := false // an attempt of this call was refused
	defer func() {
		if c.wake.on && (lock == nil || call.shared()) && ws.waiting(key) == 0 {
			// Nobody here waits for the key any more: the next process
			// may have the channel this queue holds.
			c.letGo(ctx, key, nil)
		}
	}()
	for {
		ws.mu.Lock()
		if w.gaveUp {
			refusal, held := q.refusal, q.held
			ws.mu.Unlock()
			if refusal != nil {
				return nil, errorf("%s: %w: the retry strategy gave up (last error: %w)", call.op(), ErrNotAcquired, refusal)
			}
			if held == nil {
				held = errorf("%s: %w: the retry strategy gave up", call.op(), ErrNotAcquired)
			}
			return nil, held
		}
		head := q.waiters[0] == w
		wait := time.Until(q.next)
		ws.mu.Unlock()

		if head && !useWake && c.wake.on {
			// A release of this Client that had waited for the key
			// makes the queue wait behind the other processes.
			useWake = c.wake.contended(key)
		}
		granted := false // the channel woke this head: the key was let go of
		if head && useWake {
			began := c.obsNow(c.obs.Wakeup != nil)
			st, queued, err := c.waitWake(ctx, key, ttl)
			c.waitWoke(call.label(), st, err, began)
			if err != nil {
				ws.leave(key, q, w)
				return nil, waitEnded(call, err, ws.refusalOf(q))
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
				ws.leave(key, q, w)
				return nil, waitEnded(call, err, ws.refusalOf(q))
			}
			continue
		}

		if name := call.lookName(); name != "" && refusedBefore && !granted && !kicked && ws.queued.Load() > lookAbove && !c.orphans.Has(name) {
			// The name was held at the last answer, and this Client
			// waits for many: ask whether it is free, with the other
			// names due now, in one statement (poll.go), and send the
			// acquire only if it is.
			held, err := c.lookHeld(ctx, name)
			if err != nil && (errors.Is(err, ErrClosed) || ctxErr(ctx) != nil) {
				ws.leave(key, q, w)
				return nil, waitEnded(call, err, ws.refusalOf(q))
			}
			if err == nil && held {
				ws.setRefused(q, nil, heldError(name))
				if c.wake.on {
					c.wake.waited(key) // as a refused acquire does
				}
				if !ws.refused(key, q, w, c.retry) {
					return nil, heldError(name)
				}
				continue
			}
			// Free, or the look failed: the acquire decides.
		}
		if err := c.attemptSlot(ctx); err != nil {
			ws.leave(key, q, w)
			return nil, waitEnded(call, err, ws.refusalOf(q))
		}
		l, err := call.attempt(ctx)
		c.putAttemptSlot()
		if err == nil {
			if c.wake.on {
				if !call.shared() {
					// The channel the queue holds, if any, goes with the
					// lease: whichever head waited on it. A semaphore's
					// other slots may be free: its queue keeps the
					// channel, and lets go of it when it empties.
					c.wake.handTo(ctx, key, l)
				}
				if waited {
					c.wake.waited(key)
				}
				l.mu.Lock()
				l.contended, l.probe = waited, !waited
				l.mu.Unlock()
			}
			ws.acquired(key, q, w, c.retry, call.shared())
			lock = l
			return l, nil
		}
		// The context is read once: it may end at any moment, and a caller
		// whose context ended must see its error whatever the answer was.
		cerr := ctxErr(ctx)
		switch {
		case cerr == nil && errors.Is(err, ErrNotAcquired) && !call.final(err):
			ws.setRefused(q, nil, err)
			waited, refusedBefore = true, true
			if c.wake.on {
				useWake = true
				c.wake.waited(key) // the callers behind this one wait on the channel too
			}
		case cerr == nil && passable(err):
			// A failover, a restart, a full server: it may pass, so it
			// counts as a refused attempt; the last one says why the call
			// failed if it does not, for every caller in the queue.
			ws.setRefusal(q, err)
		default:
			ws.leave(key, q, w)
			lastErr := ws.refusalOf(q)
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
		if !ws.refused(key, q, w, c.retry) {
			return nil, err
		}
	}
}

// setRefusal records err as the last refusal of q's attempts; nil clears it.
func (ws *waiters) setRefusal(q *waitQueue, err error) {
	ws.mu.Lock()
	q.refusal = err
	ws.mu.Unlock()
}

// setRefused records the answer of q's last attempt, held (wrapping
// ErrNotAcquired), and clears the last refusal.
func (ws *waiters) setRefused(q *waitQueue, refusal, held error) {
	ws.mu.Lock()
	q.refusal, q.held = refusal, held
	ws.mu.Unlock()
}

// refusalOf returns the last refusal any attempt of q met since the last
// answer (the caller's own, when it was the head, or another head's), or nil.
func (ws *waiters) refusalOf(q *waitQueue) error {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return q.refusal
}

// waitEnded is the error of call whose wait ended with err (its context's,
// or ErrClosed); lastErr is the last passable error since the last answer,
// if any.
func waitEnded(call waitCall, err, lastErr error) error {
	switch {
	case errors.Is(err, ErrClosed):
		return err
	case lastErr != nil:
		return errorf("%s: %w: %w (last error: %w)", call.op(), ErrNotAcquired, err, lastErr)
	}
	return errorf("%s: %w: %w", call.op(), ErrNotAcquired, err)
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
