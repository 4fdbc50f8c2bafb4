package sqllock

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Issue 21, point 1. `defer lock.Release(ctx)` runs after the work's context
// has ended: Release must free the name all the same, on every server.
func TestLock_Release_afterContextEnded(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		c := e.client(t, e.db, table)
		witness := e.client(t, e.openDB(t), table)
		t.Run("canceled", func(t *testing.T) {
			ctx, cancel := context.WithCancel(testCtx(t))
			l := mustAcquire(t, c, "canceled", time.Minute)
			cancel()
			if err := l.Release(ctx); err != nil {
				t.Fatalf("Release after the context was canceled: got %v, want nil (the name freed)", err)
			}
			if info := inspect(t, witness, "canceled"); info.Held {
				t.Fatalf("after Release: %+v, want the name free", info)
			}
		})
		t.Run("deadline mid-statement", func(t *testing.T) {
			pc, p := e.proxiedClient(t, table)
			l := mustAcquire(t, pc, "deadline", time.Minute)
			p.Latency(300 * time.Millisecond)
			ctx, cancel := context.WithTimeout(testCtx(t), 100*time.Millisecond)
			defer cancel()
			if err := l.Release(ctx); err != nil {
				t.Fatalf("Release whose deadline ends mid-statement: got %v, want nil (the name freed)", err)
			}
			p.Latency(0)
			if info := inspect(t, witness, "deadline"); info.Held {
				t.Fatalf("after Release: %+v, want the name free", info)
			}
		})
		t.Run("server unreachable", func(t *testing.T) {
			pc, p := e.proxiedClient(t, table)
			l := mustAcquire(t, pc, "unreachable", time.Minute)
			p.Stall(true)
			t.Cleanup(func() { p.Stall(false) })
			ctx, cancel := context.WithCancel(testCtx(t))
			cancel()
			began := time.Now()
			err := l.Release(ctx)
			if took := time.Since(began); took > ReleaseTimeout+2*time.Second {
				t.Errorf("Release against a server that does not answer took %v, want at most ReleaseTimeout (%v) and a little", took, ReleaseTimeout)
			}
			if err == nil || !errors.Is(err, context.Canceled) {
				t.Errorf("Release against a server that does not answer, ctx canceled: got %v, want an error wrapping context.Canceled", err)
			}
		})
	})
}
