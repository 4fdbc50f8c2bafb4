package wait

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Calls of one Client that wait for the same key share one poller, so that
// a process sends the same statements per second whether one goroutine
// waits for a key or a thousand do. The callers form a queue in arrival
// order. Only its head sends statements, as the strategy paces them; the
// others sleep on a channel. There is no background goroutine: when the
// head leaves (it acquired, its context ended, its strategy gave up, or it
// met an error) the next caller becomes the head and keeps the same
// schedule. A release, or a lease found lost, of the key in the same Client
// (Kick) makes the head try at once instead of waiting for its next poll.
//
// Attempts are counted per caller, as they were when each caller polled on
// its own: every refused statement the head sends counts as an attempt of
// every caller in the queue when its answer comes, and each caller asks the
// strategy with its own count whether to go on and, when it is the head,
// how long to wait. So a strategy that gives up after n refusals still ends
// a call after n, and a lone caller waits exactly as it would alone. An
// acquisition by another caller of the same Client is not a refusal:
// nothing was sent on the follower's behalf.

// A queueSet holds a Client's queues, one per key that callers wait for
// (Engine.Init readies it).
type queueSet struct {
	closing <-chan struct{} // closed when the Client's Close starts
	closed  error           // what a wait ended by Close returns

	// queued counts the queues, so that Kick, which every release calls,
	// skips the mutex while nobody waits.
	queued atomic.Int64

	mu     sync.Mutex
	queues map[string]*queue
}

// A queue is the callers waiting for one key.
type queue struct {
	waiters []*ticket // in arrival order; waiters[0] is the head
	next    time.Time // when the head tries next
	// kicked is set when the key was released or found lost in this
	// Client after the head's statement was sent: its answer is stale, so
	// the head tries again at once.
	kicked bool
	// refusal is the last error that may pass (a read-only server, a
	// failover) that the queue's attempts met since the last answer: what
	// every caller of the queue, not only the head that met it, reports
	// when its wait ends without the lease.
	refusal error
	// held is the answer of the last attempt that found the key held: what
	// a caller whose strategy gave up returns.
	held error
}

// A ticket is one caller's place in a key's queue, used by one goroutine.
type ticket struct {
	qs       *queueSet
	key      string
	q        *queue
	wake     chan struct{} // buffered: something changed; look again
	attempts int           // refused attempts counted for this call
	gaveUp   bool          // its strategy gave up; it has left the queue
}

// join puts a new caller at the end of the queue for key, making a queue
// (whose head tries at once) if there is none.
func (qs *queueSet) join(key string) *ticket {
	t := &ticket{qs: qs, key: key, wake: make(chan struct{}, 1)}
	qs.mu.Lock()
	defer qs.mu.Unlock()
	q := qs.queues[key]
	if q == nil {
		if qs.queues == nil {
			qs.queues = make(map[string]*queue)
		}
		q = &queue{next: time.Now()}
		qs.queues[key] = q
		qs.queued.Add(1)
	}
	q.waiters = append(q.waiters, t)
	t.q = q
	return t
}

// keys returns how many keys callers of this Client wait for.
func (qs *queueSet) keys() int64 { return qs.queued.Load() }

// remove takes t out of its queue and drops the queue when it is empty.
// When t was the head, the next caller is woken to take its place. qs.mu
// must be held.
func (qs *queueSet) remove(t *ticket) {
	q := t.q
	for i, x := range q.waiters {
		if x == t {
			copy(q.waiters[i:], q.waiters[i+1:])
			q.waiters[len(q.waiters)-1] = nil // let t be collected
			q.waiters = q.waiters[:len(q.waiters)-1]
			if i == 0 && len(q.waiters) > 0 {
				q.waiters[0].notify()
			}
			break
		}
	}
	if len(q.waiters) == 0 && qs.queues[t.key] == q {
		delete(qs.queues, t.key)
		qs.queued.Add(-1)
	}
}

func (t *ticket) notify() {
	select {
	case t.wake <- struct{}{}:
	default: // a wake is already pending; one is enough
	}
}

// turn reports where t stands: whether its strategy gave up (it has left
// the queue), whether it is the head, and how long until the head tries.
func (t *ticket) turn() (gaveUp, head bool, wait time.Duration) {
	t.qs.mu.Lock()
	defer t.qs.mu.Unlock()
	if t.gaveUp {
		return true, false, 0
	}
	return false, t.q.waiters[0] == t, time.Until(t.q.next)
}

// takeKick reports whether a release or a loss of the key in this Client
// woke the head since its last attempt, and clears it: the attempt about to
// be sent sees every release so far.
func (t *ticket) takeKick() bool {
	t.qs.mu.Lock()
	defer t.qs.mu.Unlock()
	kicked := t.q.kicked
	t.q.kicked = false
	return kicked
}

// kickPending reports whether a release or a loss of the key in this
// Client woke the head since its last attempt, leaving it to takeKick.
func (t *ticket) kickPending() bool {
	t.qs.mu.Lock()
	defer t.qs.mu.Unlock()
	return t.q.kicked
}

// leave takes t out of its queue: its call returns without the lease.
func (t *ticket) leave() {
	t.qs.mu.Lock()
	defer t.qs.mu.Unlock()
	t.qs.remove(t)
}

// acquired takes the head t out of its queue after it took the lease. The
// next head waits one step of its strategy before trying: the key is held
// in this Client, whose release will wake it sooner; unless the key is
// shared (a semaphore's other slots may be free), when it tries at once.
func (t *ticket) acquired(s strategy, shared bool) {
	t.qs.mu.Lock()
	defer t.qs.mu.Unlock()
	t.qs.remove(t)
	q := t.q
	if shared {
		q.next = time.Now()
	} else if len(q.waiters) > 0 && !q.kicked {
		d, _ := s.Backoff(max(q.waiters[0].attempts, 1))
		q.next = time.Now().Add(d)
	}
}

// refused counts a refused attempt of the head t for every caller in its
// queue, removes (and wakes) those whose strategy gives up, and sets when
// the head tries next. It reports whether t itself goes on waiting.
func (t *ticket) refused(s strategy) bool {
	t.qs.mu.Lock()
	defer t.qs.mu.Unlock()
	q := t.q
	var headWait time.Duration
	for i := 0; i < len(q.waiters); {
		x := q.waiters[i]
		x.attempts++
		d, ok := s.Backoff(x.attempts)
		if !ok {
			x.gaveUp = true
			t.qs.remove(x)
			if x != t {
				x.notify()
			}
			continue
		}
		if i == 0 {
			headWait = d // the head after removals, t or its successor
		}
		i++
	}
	if !q.kicked {
		q.next = time.Now().Add(headWait)
	}
	return !t.gaveUp
}

// setRefusal records err as the last refusal of the queue's attempts.
func (t *ticket) setRefusal(err error) {
	t.qs.mu.Lock()
	t.q.refusal = err
	t.qs.mu.Unlock()
}

// setHeld records the answer of the queue's last attempt, which found the
// key held, and clears the last refusal.
func (t *ticket) setHeld(held error) {
	t.qs.mu.Lock()
	t.q.refusal, t.q.held = nil, held
	t.qs.mu.Unlock()
}

// refusal returns the last refusal any attempt of the queue met since the
// last answer (the caller's own, when it was the head, or another head's),
// or nil; and the last answer that found the key held, or nil.
func (t *ticket) refusal() (refusal, held error) {
	t.qs.mu.Lock()
	defer t.qs.mu.Unlock()
	return t.q.refusal, t.q.held
}

// kick tells the callers waiting for key in this Client that its lease was
// released or lost here: the head tries at once.
func (qs *queueSet) kick(key string) {
	if qs.queued.Load() == 0 {
		return
	}
	qs.mu.Lock()
	defer qs.mu.Unlock()
	q := qs.queues[key]
	if q == nil {
		return
	}
	q.kicked = true
	q.next = time.Now()
	q.waiters[0].notify()
}

// waiting returns how many callers wait for key.
func (qs *queueSet) waiting(key string) int {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	if q := qs.queues[key]; q != nil {
		return len(q.waiters)
	}
	return 0
}

// headAttempts returns the refused attempts counted for the head of key's
// queue, or -1 when nobody waits; for tests.
func (qs *queueSet) headAttempts(key string) int {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	if q := qs.queues[key]; q != nil {
		return q.waiters[0].attempts
	}
	return -1
}

// sleep blocks until t is woken, or, for the head, until wait has passed;
// it returns ctx's error when ctx ends first, and the Client's closed error
// when Close starts.
func (t *ticket) sleep(ctx context.Context, head bool, wait time.Duration) error {
	var timeout <-chan time.Time
	if head {
		tm := time.NewTimer(wait)
		defer tm.Stop()
		timeout = tm.C
	}
	select {
	case <-t.wake:
	case <-timeout:
	case <-ctx.Done():
		return ctx.Err()
	case <-t.qs.closing:
		return t.qs.closed
	}
	return nil
}
