package sqllock

// The keep-alive's context is exact: once its deadline has passed it
// reports done, whether or not the keep-alive's timer has fired. These
// tests pass the deadline without letting the timer run, by moving the
// Lock's ValidUntil into the past behind the renewer's back, as a pause
// (SIGSTOP) longer than the lease does to a process's clock; pause_test.go
// stops a real process.

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// pausedLease returns a Lock of e's Client whose keep-alive (margin 100ms)
// runs, with its context kctx, a derived context derived, and a function
// that makes the keep-alive's deadline a second past, as a pause would,
// without telling the renewer: its timer stays a minute away.
func pausedLease(t *testing.T, e *mockEnv) (l *Lock, kctx, derived context.Context, pause func()) {
	t.Helper()
	l = newLock(e.c, "n", strings.Repeat("a", 32), 1, time.Minute, time.Now().Add(time.Minute))
	kctx = l.keepAlive(context.WithValue(context.Background(), ctxKey{}, "v"), 100*time.Millisecond)
	derived, cancel := context.WithTimeout(kctx, time.Hour)
	t.Cleanup(cancel)
	t.Cleanup(func() { l.stopKeepAlive(l.ka) })
	pause = func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.validUntil = time.Now().Add(-time.Second)
		l.ka.setDeadline(l.validUntil)
	}
	return l, kctx, derived, pause
}

type ctxKey struct{}

// wantLostAtOnce fails t unless kctx and derived have ended with a cause
// wrapping ErrLockLost that says the lease may have expired, and the
// renewer has exited.
func wantLostAtOnce(t *testing.T, l *Lock, kctx, derived context.Context) {
	t.Helper()
	select {
	case <-kctx.Done():
	default:
		t.Fatal("Done: not closed, want closed once the deadline has passed")
	}
	if err := kctx.Err(); !errors.Is(err, context.Canceled) {
		t.Errorf("Err: got %v, want context.Canceled", err)
	}
	cause := context.Cause(kctx)
	if !errors.Is(cause, ErrLockLost) || !strings.Contains(cause.Error(), "may have expired 1") {
		t.Errorf("Cause: got %v, want ErrLockLost saying the lease may have expired 1s ago", cause)
	}
	// derived is a child of kctx's cancel context, which the check ended.
	if err := context.Cause(derived); err != cause {
		t.Errorf("derived context's cause: got %v, want %v", err, cause)
	}
	if got := kctx.Value(ctxKey{}); got != "v" {
		t.Errorf("Value: got %v, want the parent's value", got)
	}
	select {
	case <-l.ka.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the renewer did not exit after the context ended")
	}
}

// A probeCtx records whether its Done was called while its Lock's mutex
// was held.
type probeCtx struct {
	context.Context
	l          *Lock
	underMutex atomic.Bool
}

func (c *probeCtx) Done() <-chan struct{} {
	if c.l.mu.TryLock() {
		c.l.mu.Unlock()
	} else {
		c.underMutex.Store(true)
	}
	return c.Context.Done()
}
