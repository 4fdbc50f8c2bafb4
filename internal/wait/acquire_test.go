package wait

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// What a Config says of refusals in these tests.
var (
	errNotAcquired = errors.New("not acquired")
	errPassing     = errors.New("a failover")
)

// A fakeCall refuses its first attempts with the answers in refusals, then
// takes its lease (or, with always, refuses every attempt so); its
// strategy gives up after giveUp refusals.
type fakeCall struct {
	key      string
	refusals []error
	always   error
	giveUp   int

	mu       sync.Mutex
	attempts int
}

func (c *fakeCall) Key() string          { return c.key }
func (c *fakeCall) Label() string        { return c.key }
func (c *fakeCall) Op() string           { return "acquire " + c.key }
func (c *fakeCall) TTL() time.Duration   { return time.Second }
func (c *fakeCall) Look() string         { return "" }
func (c *fakeCall) Shared() bool         { return false }
func (c *fakeCall) Final(err error) bool { return false }
func (c *fakeCall) Backoff(n int) (time.Duration, bool) {
	return time.Millisecond, n < c.giveUp
}

func (c *fakeCall) Attempt(context.Context) (func() (time.Time, bool), error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.attempts++
	if c.always != nil {
		return nil, c.always
	}
	if c.attempts <= len(c.refusals) {
		return nil, c.refusals[c.attempts-1]
	}
	return func() (time.Time, bool) { return time.Now().Add(time.Minute), false }, nil
}

// Acquire tries until the lease is taken, counting refusals and passable
// errors as refused attempts; with the channels off it returns no Hold.
func TestEngine_Acquire_triesUntilTaken(t *testing.T) {
	e, _, _, _ := mockEngine(t)
	held := fmt.Errorf("%w: held", errNotAcquired)
	call := &fakeCall{key: "k", refusals: []error{held, errPassing, held}, giveUp: 10}
	h, err := e.Acquire(context.Background(), call)
	if err != nil || h != nil || call.attempts != 4 {
		t.Errorf("got %v, %v after %d attempts; want no Hold, no error, after 4", h, err, call.attempts)
	}
	if e.queues.keys() != 0 {
		t.Error("the queue is left behind")
	}
}

// A strategy that gives up returns the last refusal; a context that ends
// returns an error that wraps both the refusal and the context's, with the
// last passable error.
func TestEngine_Acquire_ends(t *testing.T) {
	e, _, closing, closed := mockEngine(t)
	held := fmt.Errorf("%w: held", errNotAcquired)
	call := &fakeCall{key: "k", refusals: []error{held, held, held}, giveUp: 2}
	if _, err := e.Acquire(context.Background(), call); err != held || call.attempts != 2 {
		t.Errorf("strategy gave up: got %v after %d attempts; want %v after 2", err, call.attempts, held)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := e.Acquire(ctx, &fakeCall{key: "k", always: errPassing, giveUp: 1 << 30})
	if !errors.Is(err, errNotAcquired) || !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, errPassing) {
		t.Errorf("context ended: got %v; want it to wrap the refusal, the context's error and the last error", err)
	}

	close(closing)
	if _, err := e.Acquire(context.Background(), &fakeCall{key: "k", always: held, giveUp: 1 << 30}); err != closed {
		t.Errorf("closed: got %v, want %v", err, closed)
	}
}

// Callers of one key take turns in arrival order: only the head attempts,
// and each attempt of the head counts for every caller behind it.
func TestEngine_Acquire_oneHeadAttempts(t *testing.T) {
	e, _, _, _ := mockEngine(t)
	held := fmt.Errorf("%w: held", errNotAcquired)
	first := &fakeCall{key: "k", always: held, giveUp: 1 << 30}
	second := &fakeCall{key: "k", giveUp: 1 << 30}
	done := make(chan error, 2)
	for i, call := range []*fakeCall{first, second} {
		go func() {
			_, err := e.Acquire(context.Background(), call)
			done <- err
		}()
		for deadline := time.Now().Add(5 * time.Second); e.queues.waiting("k") <= i; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("caller %d does not wait", i+1)
			}
		}
	}
	time.Sleep(20 * time.Millisecond) // several polls of the head
	first.mu.Lock()
	first.always = nil // the next attempt takes the lease
	first.mu.Unlock()
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if first.attempts < 2 || second.attempts != 1 {
		t.Errorf("attempts: first %d, second %d; want several and 1 (the second attempts once it is the head)", first.attempts, second.attempts)
	}
}

// A head behind a lease of its own Client waits for the kick, up to ttl,
// then polls once on its strategy and waits again; any other state, or a
// kick, leaves the strategy's wait alone.
func TestOwnLease_wait(t *testing.T) {
	const due, ttl = 10 * time.Millisecond, time.Hour
	var o ownLease
	if got := o.wait(stQueueHeld, due, ttl, false); got != due {
		t.Errorf("the queue holds the channel: got %v, want the strategy's %v", got, due)
	}
	if got := o.wait(stLockHeld, due, ttl, false); got < ttl-time.Minute {
		t.Errorf("behind its own lease: got %v, want about %v", got, ttl)
	}
	if got := o.wait(stLockHeld, due, ttl, true); got != due {
		t.Errorf("behind its own lease, kicked: got %v, want the strategy's %v", got, due)
	}
	if !o.until.IsZero() {
		t.Error("a kick: the wait behind the lease was kept, want it ended")
	}
	o.wait(stLockHeld, due, ttl, false)
	o.until = time.Now().Add(-time.Millisecond) // ttl passed without a kick
	if got := o.wait(stLockHeld, due, ttl, false); got != due {
		t.Errorf("ttl passed: got %v, want one poll after the strategy's %v", got, due)
	}
	if got := o.wait(stLockHeld, due, ttl, false); got < ttl-time.Minute {
		t.Errorf("after the poll: got %v, want about %v again", got, ttl)
	}
	if got := o.wait(stGranted, 0, ttl, false); got != 0 || !o.until.IsZero() {
		t.Errorf("granted: got %v (wait behind the lease kept: %v), want 0 and none", got, !o.until.IsZero())
	}
}
