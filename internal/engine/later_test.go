package engine

import (
	"context"
	"testing"
	"time"
)

// A later proof's cleanup runs under the caller's context while it lasts,
// past Config.CleanupTimeout (a loaded server took over a second for the DELETE of
// the proof name's rows, and a proof whose steps had passed failed), and
// under Config.CleanupTimeout of its own once the caller's context has ended.
func TestServer_cleanupContext(t *testing.T) {
	type key struct{}
	srv := newTestServer(t, nil, "sqllock")
	t.Run("caller's context alive", func(t *testing.T) {
		ctx, cancelCaller := context.WithCancel(context.WithValue(context.Background(), key{}, "v"))
		cctx, cancel := srv.cleanupContext(ctx)
		defer cancel()
		if cctx.Value(key{}) != "v" {
			t.Errorf("the cleanup's context lost the caller's values")
		}
		select {
		case <-cctx.Done():
			t.Fatal("the cleanup's context ended while the caller's lasted")
		case <-time.After(srv.cfg.CleanupTimeout + 200*time.Millisecond):
		}
		cancelCaller()
		select {
		case <-cctx.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("the cleanup's context outlived the caller's past srv.cfg.CleanupTimeout")
		}
	})
	t.Run("caller's context ended", func(t *testing.T) {
		ctx, cancelCaller := context.WithCancel(context.Background())
		cancelCaller()
		start := time.Now()
		cctx, cancel := srv.cleanupContext(ctx)
		defer cancel()
		if cctx.Err() != nil {
			t.Fatal("the cleanup's context ended at once: it must get srv.cfg.CleanupTimeout of its own")
		}
		<-cctx.Done()
		if took := time.Since(start); took < srv.cfg.CleanupTimeout {
			t.Fatalf("the cleanup's context ended after %v, before srv.cfg.CleanupTimeout (%v)", took, srv.cfg.CleanupTimeout)
		}
	})
	t.Run("cancel", func(t *testing.T) {
		cctx, cancel := srv.cleanupContext(context.Background())
		cancel()
		if cctx.Err() == nil {
			t.Fatal("cancel left the cleanup's context live")
		}
	})
}
