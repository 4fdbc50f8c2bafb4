package sqllock

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// These tests run against a real server, through the counting proxy: what
// they prove is how many statements the waiters of one Client send.

// headAttempts returns how many refused attempts the first caller waiting
// for name has counted, or -1 when nobody waits.
func headAttempts(c *Client, name string) int {
	c.waiters.mu.Lock()
	defer c.waiters.mu.Unlock()
	if q := c.waiters.queues[name]; q != nil {
		return q.waiters[0].attempts
	}
	return -1
}

// 64 goroutines waiting for one name send no more statements per second than
// one does: only the first in line polls.
func TestClient_Acquire_sharedPoller(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		mustAcquire(t, e.client(t, e.db, table), "busy", time.Minute)
		const window = time.Second
		sent := func(waiters int) int {
			c, p := e.proxiedClient(t, table, WithRetry(LinearBackoff(10*time.Millisecond)))
			ctx, cancel := context.WithCancel(testCtx(t))
			defer cancel()
			var wg sync.WaitGroup
			for range waiters {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, err := c.Acquire(ctx, "busy", time.Second)
					if !errors.Is(err, ErrNotAcquired) || !errors.Is(err, context.Canceled) {
						t.Errorf("Acquire: got %v, want ErrNotAcquired and context.Canceled", err)
					}
				}()
			}
			waitFor(t, time.Minute, "every caller waits", func() bool {
				return c.waiters.waiting("busy") == waiters && headAttempts(c, "busy") > 0
			})
			p.ResetCounts()
			time.Sleep(window)
			n := p.CommandCount()
			cancel()
			wg.Wait()
			if got := c.waiters.waiting("busy"); got != 0 {
				t.Errorf("got %d callers still queued after they returned, want 0", got)
			}
			return n
		}
		one := sent(1)
		many := sent(64)
		t.Logf("statements in %v: 1 waiter %d, 64 waiters %d", window, one, many)
		if one < 5 {
			t.Fatalf("1 waiter sent %d statements in %v polling every 10ms; the test cannot compare", one, window)
		}
		if many*2 > one*3 {
			t.Fatalf("64 waiters sent %d statements, 1 waiter %d: want at most 1.5 times as many", many, one)
		}
	})
}

// A Release in the same Client hands the name to the next waiter at once:
// with a strategy that polls every 10 s, each handoff costs exactly the
// release and the next waiter's one acquire.
func TestClient_Acquire_localReleaseWakesWaiter(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		const waiters = 4
		// The queue of one Client, without wake-up channels, whose
		// statements would count.
		c, p := e.proxiedClient(t, e.newTable(t), WithRetry(LinearBackoff(10*time.Second)), WithWakeups(0))
		ctx, cancel := context.WithTimeout(testCtx(t), 5*time.Second) // half a poll
		defer cancel()
		if err := mustAcquire(t, c, "warm", time.Second).Release(ctx); err != nil {
			t.Fatal(err) // prepares the release statement before counting
		}
		holder := mustAcquire(t, c, "x", time.Minute)

		var wg sync.WaitGroup
		fences := make(chan uint64, waiters)
		acquire := func() {
			wg.Add(1)
			go func() {
				defer wg.Done()
				l, err := c.Acquire(ctx, "x", time.Minute)
				if err != nil {
					t.Errorf("Acquire: got %v, want the lock before the next poll", err)
					return
				}
				fences <- l.Fence()
				if err := l.Release(ctx); err != nil {
					t.Errorf("Release: %v", err)
				}
			}()
		}
		// The first caller tries and is refused; the others queue behind it
		// without trying.
		acquire()
		waitFor(t, time.Minute, "the first waiter was refused", func() bool { return headAttempts(c, "x") == 1 })
		for range waiters - 1 {
			acquire()
		}
		waitFor(t, time.Minute, "every caller waits", func() bool { return c.waiters.waiting("x") == waiters })
		p.ResetCounts()
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		close(fences)
		last := holder.Fence()
		for f := range fences {
			if f <= last {
				t.Errorf("got fence %d after %d, want fences increasing", f, last)
			}
			last = f
		}
		if got, want := p.Commands()[proxyComStmtExecute], 1+2*waiters; got != want || p.CommandCount() != want {
			t.Errorf("sent %v for %d handoffs, want exactly %d statements: each handoff a release and one acquire", p.Commands(), waiters, want)
		}
	})
}

// When the first in line leaves (here its context ends), the next caller
// takes over, and a later Release still wakes it at once.
func TestClient_Acquire_headLeaves(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		c := e.newClient(t, WithRetry(LinearBackoff(10*time.Second)), WithWakeups(0))
		ctx, cancel := context.WithTimeout(testCtx(t), 5*time.Second)
		defer cancel()
		holder := mustAcquire(t, c, "x", time.Minute)

		headCtx, headCancel := context.WithCancel(ctx)
		headErr := make(chan error, 1)
		go func() {
			_, err := c.Acquire(headCtx, "x", time.Minute)
			headErr <- err
		}()
		waitFor(t, time.Minute, "the first waiter was refused", func() bool { return headAttempts(c, "x") == 1 })
		next := make(chan error, 1)
		go func() {
			l, err := c.Acquire(ctx, "x", time.Minute)
			if err == nil {
				err = l.Release(ctx)
			}
			next <- err
		}()
		waitFor(t, time.Minute, "the second caller waits", func() bool { return c.waiters.waiting("x") == 2 })
		headCancel()
		err := <-headErr
		wantErrIs(t, err, ErrNotAcquired)
		wantErrIs(t, err, context.Canceled)
		waitFor(t, time.Minute, "the first caller left", func() bool { return c.waiters.waiting("x") == 1 })
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-next; err != nil {
			t.Fatalf("the caller that took over: got %v, want the lock before the next poll", err)
		}
	})
}

// Every refused statement counts as an attempt of each caller waiting for
// its answer, so LimitRetry ends queued callers as it ends a lone one, and
// they do not multiply the statements sent.
func TestClient_Acquire_queuedCallersCountAttempts(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		const callers, limit = 16, 3
		table := e.newTable(t)
		mustAcquire(t, e.client(t, e.db, table), "busy", time.Minute)
		c, p := e.proxiedClient(t, table, WithRetry(LimitRetry(LinearBackoff(20*time.Millisecond), limit)))
		mustAcquire(t, c, "warm", time.Second) // prepare before counting
		p.ResetCounts()
		ctx := testCtx(t)
		var wg sync.WaitGroup
		for range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := c.Acquire(ctx, "busy", time.Second)
				if !errors.Is(err, ErrNotAcquired) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("Acquire: got %v, want a plain ErrNotAcquired from a strategy that gave up", err)
				}
			}()
		}
		wg.Wait()
		n := p.CommandCount()
		t.Logf("%d callers limited to %d attempts each sent %d statements", callers, limit, n)
		// Callers that join after the first answer need up to limit more;
		// without the queue they would send callers*limit.
		if n < limit || n > callers*limit/4 {
			t.Fatalf("sent %d statements, want between %d and %d", n, limit, callers*limit/4)
		}
	})
}
