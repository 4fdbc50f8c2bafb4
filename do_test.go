package sqllock

import (
	"context"
	"errors"
	"fmt"
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
