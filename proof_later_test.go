package sqllock

import (
	"context"
	"errors"
	"testing"
	"time"
)

// The set, semaphore and Once statements are proven at their kind's first
// use, once per Client, not at the Client's first write, and leave no row
// behind.
func TestClient_laterProofs_atFirstUseOnce(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		c := e.client(t, e.db, table)
		ctx := testCtx(t)
		done := func(kind int) bool {
			c.later[kind].mu.Lock()
			defer c.later[kind].mu.Unlock()
			return c.eng.Forms().Later[kind]
		}
		if err := mustAcquire(t, c, "single", time.Minute).Release(ctx); err != nil {
			t.Fatal(err)
		}
		for kind := range numLaterProofs {
			if done(kind) {
				t.Errorf("after a single name: the %s proof made, want it left to its first use", laterProofNames[kind])
			}
		}
		uses := []struct {
			kind int
			use  func() error
		}{
			{proofSets, func() error {
				l, err := c.TryAcquireSet(ctx, []string{"a", "b"}, time.Minute)
				if err == nil {
					err = l.Release(ctx)
				}
				return err
			}},
			{proofSlots, func() error {
				l, err := c.Semaphore("jobs", 2).TryAcquire(ctx, time.Minute)
				if err == nil {
					err = l.Release(ctx)
				}
				return err
			}},
			{proofOnce, func() error {
				_, err := c.Once(ctx, "once", func(_ context.Context, _ *Lock) error { return nil })
				return err
			}},
		}
		for _, u := range uses {
			err := u.use()
			if errors.Is(err, ErrUnsupportedServer) && e.oneRow() && u.kind != proofOnce {
				continue // sets through Vitess, semaphores on TiDB and through Vitess
			}
			if err != nil {
				t.Fatalf("first %s: %v", laterProofNames[u.kind], err)
			}
			if !done(u.kind) {
				t.Errorf("after the first %s: its proof not made", laterProofNames[u.kind])
			}
			if n := e.proofRows(t, table); n != 0 {
				t.Errorf("after the first %s: %d proof rows, want 0", laterProofNames[u.kind], n)
			}
		}
	})
}

// A later proof's cleanup runs under the caller's context while it lasts,
// past cleanupTimeout (a loaded server took over a second for the DELETE of
// the proof name's rows, and a proof whose steps had passed failed), and
// under cleanupTimeout of its own once the caller's context has ended.
func TestCleanupContext(t *testing.T) {
	type key struct{}
	t.Run("caller's context alive", func(t *testing.T) {
		ctx, cancelCaller := context.WithCancel(context.WithValue(context.Background(), key{}, "v"))
		cctx, cancel := cleanupContext(ctx)
		defer cancel()
		if cctx.Value(key{}) != "v" {
			t.Errorf("the cleanup's context lost the caller's values")
		}
		select {
		case <-cctx.Done():
			t.Fatal("the cleanup's context ended while the caller's lasted")
		case <-time.After(cleanupTimeout + 200*time.Millisecond):
		}
		cancelCaller()
		select {
		case <-cctx.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("the cleanup's context outlived the caller's past cleanupTimeout")
		}
	})
	t.Run("caller's context ended", func(t *testing.T) {
		ctx, cancelCaller := context.WithCancel(context.Background())
		cancelCaller()
		start := time.Now()
		cctx, cancel := cleanupContext(ctx)
		defer cancel()
		if cctx.Err() != nil {
			t.Fatal("the cleanup's context ended at once: it must get cleanupTimeout of its own")
		}
		<-cctx.Done()
		if took := time.Since(start); took < cleanupTimeout {
			t.Fatalf("the cleanup's context ended after %v, before cleanupTimeout (%v)", took, cleanupTimeout)
		}
	})
	t.Run("cancel", func(t *testing.T) {
		cctx, cancel := cleanupContext(context.Background())
		cancel()
		if cctx.Err() == nil {
			t.Fatal("cancel left the cleanup's context live")
		}
	})
}
