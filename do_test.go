package sqllock

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"runtime"
	"runtime/pprof"
	"strings"
	"testing"
	"time"
)

// lockDo runs fn under the Lock an acquire returned, as [Lock.Do] does,
// or returns the acquire's error: lockDo(c.TryAcquire(ctx, name, ttl))(ctx,
// fn) is what TryDo was.
func lockDo(l *Lock, err error) func(ctx context.Context, fn func(context.Context, *Lock) error, opts ...DoOption) error {
	return func(ctx context.Context, fn func(context.Context, *Lock) error, opts ...DoOption) error {
		if err != nil {
			return err
		}
		return l.Do(ctx, fn, opts...)
	}
}

// Do, Lock.Do, Once and Elect give fn the Lock it runs under: its fence is
// the name's, as the server reads it.
func TestClient_Do_givesTheLock(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		a, b := e.twoClients(t)
		ctx := testCtx(t)
		check := func(what string, l *Lock, name string) {
			t.Helper()
			info, err := b.Inspect(ctx, name)
			if err != nil || l == nil || l.Name() != name || l.Fence() == 0 || l.Fence() != info.Fence || !info.Held {
				t.Errorf("%s: got Lock %v, server %+v, %v; want the held Lock on %s with the server's fence", what, l, info, err, name)
			}
		}
		err := a.Do(ctx, "do", time.Minute, func(ctx context.Context, l *Lock) error {
			check("Do", l, "do")
			return nil
		})
		if err != nil {
			t.Fatalf("Do: %v", err)
		}
		l := mustAcquire(t, a, "lock-do", time.Minute)
		if err := l.Do(ctx, func(ctx context.Context, got *Lock) error {
			if got != l {
				t.Errorf("Lock.Do: fn got %p, want the Lock %p", got, l)
			}
			check("Lock.Do", got, "lock-do")
			return nil
		}); err != nil {
			t.Fatalf("Lock.Do: %v", err)
		}
		// Lock.Do released it: b takes it at once.
		mustAcquire(t, b, "lock-do", time.Minute)
		if _, err := a.Once(ctx, "once", func(ctx context.Context, l *Lock) error {
			check("Once", l, "once")
			return nil
		}); err != nil {
			t.Fatalf("Once: %v", err)
		}
	})
}

// Lock.Do owns the Lock: a released Lock runs nothing and says so; bad
// input releases the Lock, leaving no lease behind.
func TestLock_Do_releasedOrBadInput(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		a, b := e.twoClients(t)
		ctx := testCtx(t)
		l := mustAcquire(t, a, "job", time.Minute)
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		ran := false
		err := l.Do(ctx, func(context.Context, *Lock) error { ran = true; return nil })
		wantErrIs(t, err, ErrNotHeld)
		if ran {
			t.Error("Lock.Do ran fn under a released Lock")
		}
		for _, bad := range []struct {
			fn  func(context.Context, *Lock) error
			opt DoOption
		}{
			{nil, WithMinHold(0)},
			{func(context.Context, *Lock) error { ran = true; return nil }, WithSafetyMargin(time.Hour)},
		} {
			l := mustAcquire(t, a, "job", time.Minute)
			if err := l.Do(ctx, bad.fn, bad.opt); err == nil {
				t.Fatal("Lock.Do with bad input: got nil, want an error")
			}
			if ran {
				t.Fatal("Lock.Do ran fn with bad input")
			}
			mustAcquire(t, b, "job", time.Minute).Release(ctx) // free again at once
		}
	})
}

// Elect's leading callback gets the lead's Lock; an error it returns while
// leading ends the lead, releases the lease and ends Elect with it.
func TestClient_Elect_callbackErrorEndsElect(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		a, b := e.twoClients(t)
		ctx := testCtx(t)
		boom := errors.New("cannot lead")
		stopped := false
		err := a.Elect(ctx, "leader", time.Minute, Callbacks{
			OnStartedLeading: func(ctx context.Context, l *Lock) error {
				info, err := b.Inspect(ctx, "leader")
				if err != nil || !info.Held || l.Fence() != info.Fence || l.Name() != "leader" {
					t.Errorf("leader's Lock: got %v fence %d, server %+v, %v", l, l.Fence(), info, err)
				}
				return boom
			},
			OnStoppedLeading: func() { stopped = true },
		})
		wantErrIs(t, err, boom)
		if !stopped {
			t.Error("OnStoppedLeading did not run")
		}
		mustAcquire(t, b, "leader", time.Minute) // released, not left to expire
	})
}

// Do's error is one line that says the lease's cause once, when fn returns
// that cause (as work stopped by its context does), and when fn returns
// its context's error beside it.
func TestLock_Do_errorOnOneLine(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		a, b := e.twoClients(t)
		ctx := testCtx(t)
		for _, ret := range []struct {
			what string
			err  func(ctx context.Context) error
		}{
			{"its cause", context.Cause},
			{"its error", func(ctx context.Context) error { return ctx.Err() }},
		} {
			err := a.Do(ctx, "job", 3*time.Second, func(ctx context.Context, l *Lock) error {
				if _, err := b.ForceRelease(ctx, "job"); err != nil {
					return err
				}
				// Renew now rather than wait for the keep-alive.
				if err := l.Refresh(ctx, 3*time.Second); !errors.Is(err, ErrNotHeld) {
					return fmt.Errorf("Refresh after the forced release: got %v, want ErrNotHeld", err)
				}
				<-ctx.Done()
				return ret.err(ctx)
			})
			wantErrIs(t, err, ErrLockLost)
			msg := err.Error()
			if strings.Contains(msg, "\n") || strings.Count(msg, "lock lost") != 1 || strings.Contains(msg, "<nil>") {
				t.Errorf("fn returning %s: got %q, want one line saying the loss once", ret.what, msg)
			}
			// Free again, after a lock-delay if the forced release left one.
			l, err := b.Acquire(ctx, "job", time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			l.Release(ctx)
		}
	})
}

// A keep-alive whose renewal is sent but never answered gives the lease up
// before it could expire with a cause that does not speak of a last error
// it never had.
func TestLock_Do_stalledRenewal_noNilLastError(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		c, p := e.proxiedClient(t, e.newTable(t))
		ctx := testCtx(t)
		const ttl = 1500 * time.Millisecond
		err := c.Do(ctx, "stall", ttl, func(ctx context.Context, _ *Lock) error {
			p.Stall(true)
			<-ctx.Done()
			p.Stall(false)
			return context.Cause(ctx)
		})
		wantErrIs(t, err, ErrLockLost)
		if msg := err.Error(); strings.Contains(msg, "<nil>") || strings.Contains(msg, "\n") {
			t.Errorf("Do after a stalled renewal: got %q, want one line with no <nil>", msg)
		}
	})
}

// (a) With renewals blocked, fn's context is cancelled before another
// Client, polling the server directly, can take the name.
func TestClient_Do_stalledRenewals_cancelBeforeTakeover(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		a, p := e.proxiedClient(t, table, WithHolder("a"))
		b := e.client(t, e.openDB(t), table, WithHolder("b"))
		// Renewals every second, each with 750 ms: at a load average of
		// 11 a 1.5 s lease saw no renewal pass in 5 s.
		const ttl = 3 * time.Second
		ctx := testCtx(t)

		started := make(chan struct{})
		told := make(chan time.Time, 1)
		var cause error
		done := make(chan error, 1)
		go func() {
			done <- a.Do(ctx, "job", ttl, func(ctx context.Context, _ *Lock) error {
				close(started)
				<-ctx.Done()
				told <- time.Now()
				cause = context.Cause(ctx)
				return ctx.Err()
			})
		}()
		<-started
		// One renewal goes through, then the network stops.
		l := heldLock(t, a, "job")
		acquired := l.ValidUntil()
		waitFor(t, 10*time.Second, "a renewal", func() bool { return l.ValidUntil().After(acquired) })
		p.Stall(true)
		stalled := time.Now()

		_, sent := pollAcquire(t, b, "job", 10*time.Second)
		var toldAt time.Time
		select {
		case toldAt = <-told:
		default:
			t.Fatalf("b took the name over %v after the stall and fn's context is still live", sent.Sub(stalled))
		}
		if !toldAt.Before(sent) {
			t.Fatalf("fn was told at %v, after b's winning attempt was sent at %v", toldAt, sent)
		}
		t.Logf("fn was told %v after the stall began, %v before b's winning attempt was sent", toldAt.Sub(stalled), sent.Sub(toldAt))

		p.Stall(false)
		err := <-done
		wantErrIs(t, err, ErrLockLost)
		wantErrIs(t, err, context.Canceled)
		wantErrIs(t, cause, ErrLockLost)
		if got := a.Held(); len(got) != 0 {
			t.Fatalf("Held after loss: got %v, want none", got)
		}
	})
}

// (b) One renewal fails, the network recovers: fn runs on, the lease and its
// fence unchanged.
func TestClient_Do_renewalFailsOnce_leaseKept(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		a, p := e.proxiedClient(t, table, WithHolder("a"))
		// One connection, on which the renewal is prepared: the next renewal
		// is one command on it, not a dial or a prepare on another.
		a.db.SetMaxOpenConns(1)
		b := e.client(t, e.openDB(t), table, WithHolder("b"))
		ttl := 2 * time.Second
		if e.oneRow() {
			// Through vtgate or TiDB the new connection and its prepare
			// after the cut take a good part of a 2 s lease on a loaded
			// machine (a CI run lost it so, under -race).
			ttl = 4 * time.Second
		}
		ctx := testCtx(t)

		started := make(chan struct{})
		finish := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- a.Do(ctx, "job", ttl, func(ctx context.Context, _ *Lock) error {
				close(started)
				select {
				case <-ctx.Done():
					return context.Cause(ctx)
				case <-finish:
					return nil
				}
			})
		}()
		<-started
		fence := inspect(t, b, "job").Fence

		// After one renewal has come back, the next reaches the proxy and is
		// held there; then its connection is cut, so it fails, and the
		// network comes back.
		// Two renewals: the first round also opens the session and
		// attaches the lease to it (session.go), right after its renewal.
		l := heldLock(t, a, "job")
		for range 2 {
			last := l.ValidUntil()
			waitFor(t, 5*time.Second, "a renewal", func() bool { return l.ValidUntil().After(last) })
		}
		p.ResetCounts()
		p.Stall(true)
		waitFor(t, 5*time.Second, "a renewal held by the stall", func() bool { return p.CommandCount() > 0 })
		time.Sleep(50 * time.Millisecond)
		p.CutAll()
		p.Stall(false)

		// Long enough that the lease would have lapsed without renewals.
		time.Sleep(ttl + ttl/2)
		select {
		case err := <-done:
			t.Fatalf("Do returned while renewals could recover: %v", err)
		default:
		}
		if got := inspect(t, b, "job"); !got.Held || got.Holder != "a" || got.Fence != fence {
			t.Fatalf("after a failed renewal: got %+v, want a's lease with fence %d", got, fence)
		}
		close(finish)
		if err := <-done; err != nil {
			t.Fatalf("Do: got %v, want nil", err)
		}
	})
}

// (c) Do releases with a context of its own after the caller's ended.
func TestClient_Do_releasesAfterCallerCancel(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		a, b := e.twoClients(t)
		ctx, cancel := context.WithCancel(testCtx(t))
		started := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- a.Do(ctx, "job", time.Minute, func(ctx context.Context, _ *Lock) error {
				close(started)
				<-ctx.Done()
				return ctx.Err()
			})
		}()
		<-started
		cancel()
		wantErrIs(t, <-done, context.Canceled)
		if got := inspect(t, b, "job"); got.Held || got.Holder != "" {
			t.Fatalf("after Do: got %+v, want the lease released", got)
		}
		mustAcquire(t, b, "job", time.Second)
	})
}

// TryAcquire then Lock.Do does not wait and does not run fn when the name is held; Do waits.
func TestLock_Do_notAcquired(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		a, b := e.twoClients(t)
		ctx := testCtx(t)
		l := mustAcquire(t, a, "job", time.Minute)
		ran := false
		err := lockDo(b.TryAcquire(ctx, "job", time.Second))(ctx, func(_ context.Context, _ *Lock) error { ran = true; return nil })
		wantErrIs(t, err, ErrNotAcquired)
		if ran {
			t.Fatal("Lock.Do ran fn without the lease")
		}
		time.AfterFunc(100*time.Millisecond, func() { l.Release(context.Background()) })
		if err := b.Do(ctx, "job", time.Second, func(_ context.Context, _ *Lock) error { ran = true; return nil }); err != nil || !ran {
			t.Fatalf("Do after the release: got %v, ran %v; want nil, true", err, ran)
		}
	})
}

// A panic in fn releases the lease and goes on.
func TestClient_Do_panicReleases(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		a, b := e.twoClients(t)
		func() {
			defer func() {
				if r := recover(); r != "boom" {
					t.Fatalf("recovered %v, want the panic of fn", r)
				}
			}()
			a.Do(testCtx(t), "job", time.Minute, func(_ context.Context, _ *Lock) error { panic("boom") })
		}()
		if got := inspect(t, b, "job"); got.Held {
			t.Fatalf("after a panic in fn: got %+v, want the lease released", got)
		}
		if got := a.Held(); len(got) != 0 {
			t.Fatalf("Held: got %v, want none", got)
		}
	})
}

// (f) WithMinHold keeps another host out until acquired-at + d, then lets
// it in; a minimum that has passed releases at once.
func TestClient_Do_WithMinHold(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		a, b := e.twoClients(t)
		ctx := testCtx(t)
		const minHold = 700 * time.Millisecond

		start := time.Now()
		if err := a.Do(ctx, "tick", time.Minute, func(_ context.Context, _ *Lock) error { return nil }, WithMinHold(minHold)); err != nil {
			t.Fatalf("Do: %v", err)
		}
		if got := inspect(t, b, "tick"); !got.Held || got.TTL > minHold {
			t.Fatalf("after Do: got %+v, want a lease of at most %v left", got, minHold)
		}
		// acquired_at is after start: an attempt answered before start +
		// minHold ran before the minimum passed and must be refused.
		for {
			_, err := b.TryAcquire(ctx, "tick", time.Second)
			replied := time.Now()
			if err == nil {
				if replied.Sub(start) < minHold {
					t.Fatalf("b acquired %v after a's acquire began, within the minimum hold %v", replied.Sub(start), minHold)
				}
				if waited := replied.Sub(start); waited > minHold+5*time.Second {
					t.Fatalf("b acquired only %v after a's acquire began, want soon after %v", waited, minHold)
				}
				break
			}
			wantErrIs(t, err, ErrNotAcquired)
			time.Sleep(5 * time.Millisecond)
		}

		// The minimum has passed when fn returns: nobody is kept out.
		err := a.Do(ctx, "late", time.Minute, func(_ context.Context, _ *Lock) error {
			time.Sleep(50 * time.Millisecond)
			return nil
		}, WithMinHold(10*time.Millisecond))
		if err != nil {
			t.Fatalf("Do: %v", err)
		}
		if got := inspect(t, b, "late"); got.Held {
			t.Fatalf("after a passed minimum: got %+v, want no live lease", got)
		}
		mustAcquire(t, b, "late", time.Second)
	})
}

// Many Do calls leave no goroutine behind. The count is the process's:
// the servers one after another, and none of the parallel tests beside
// (they start after every test that is not, this one among them).
func TestClient_Do_noGoroutineLeak(t *testing.T) {
	eachServerInTurn(t, func(t *testing.T, e *testEnv) {
		c := e.newClient(t)
		ctx := testCtx(t)
		// A lease of a minute: a loaded machine that stalls past a
		// second's lease between the acquire and the release loses it,
		// rightly, and that is not this test's subject.
		run := func() {
			for range 20 {
				if err := c.Do(ctx, "g", time.Minute, func(_ context.Context, _ *Lock) error { return nil }); err != nil {
					t.Fatal(err)
				}
			}
		}
		// The shared renewal's goroutine of the minute's ttl (renewal.go)
		// ends at a round that finds no keep-alive left, up to 20 s after
		// the last: it is counted apart, one at most.
		goroutines := func() int { return runtime.NumGoroutine() - c.renewals.ticking() }
		run() // warm the pool and the statements
		before := goroutines()
		run()
		deadline := time.Now().Add(5 * time.Second)
		for after := goroutines(); after > before; after = goroutines() {
			if time.Now().After(deadline) {
				var stacks strings.Builder
				_ = pprof.Lookup("goroutine").WriteTo(&stacks, 1)
				t.Fatalf("goroutines: %d after, %d before (the shared renewal's apart); now:\n%s", after, before, stacks.String())
			}
			time.Sleep(2 * time.Millisecond)
		}
	})
}

func TestLock_Do_WithMinHold_args(t *testing.T) {
	eachMockTable(t, func(t *testing.T, e *mockEnv) {
		tok := &tokenArg{}
		e.expectExec("acquire", acquireArgs("job", mockHolder, 60_000_000, tok), okReply(42, 1))
		e.expectExec("release_at_least", []driver.Value{int64(90_000_250), "job", tok}, okReply(1, 1))
		if err := lockDo(e.c.TryAcquire(t.Context(), "job", time.Minute))(t.Context(), noop, WithMinHold(90*time.Second+250*time.Microsecond)); err != nil {
			t.Errorf("TryAcquire and Do: got %v, want nil", err)
		}
	})
}

func TestLock_Do_WithMinHold_result(t *testing.T) {
	for _, rows := range []int64{0, 1} {
		e := newMockEnv(t)
		tok := &tokenArg{}
		e.expectExec("acquire", acquireArgs("job", mockHolder, 60_000_000, tok), okReply(42, 1))
		// Insert id 0: the lease was not ours, whatever the rows say.
		e.expectExec("release_at_least", []driver.Value{int64(1_000_000), "job", tok}, okReply(0, rows))
		err := lockDo(e.c.TryAcquire(t.Context(), "job", time.Minute))(t.Context(), noop, WithMinHold(time.Second))
		assertErrIs(t, err, ErrLockLost, ErrNotHeld)
		e.done()
	}
}

// heldLock returns the Lock c holds on name, as Do keeps it to itself.
func heldLock(t *testing.T, c *Client, name string) *Lock {
	t.Helper()
	c.held.mu.Lock()
	defer c.held.mu.Unlock()
	for l := range c.held.locks {
		if l.name == name {
			return l
		}
	}
	t.Fatalf("%q is not held", name)
	return nil
}
