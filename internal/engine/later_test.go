package engine

import (
	"context"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/testdsn"
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

// The set, semaphore, Once and session statements are proven at their own
// first use, once, and leave no row behind.
func TestServer_laterProofs(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		db, table, srv := usedServer(t, s)
		ctx := testCtx(t)
		if f := srv.Forms(); f.Later != [NumLater]bool{} {
			t.Fatalf("after the first use: later proofs %v, want none made", f.Later)
		}
		for kind, prove := range [NumLater]func(context.Context) error{
			LaterSets: srv.ProveSets, LaterSlots: srv.ProveSlots, LaterOnce: srv.ProveOnceRecords, LaterSessions: srv.ProveSessions,
		} {
			if f := srv.Forms(); kind == LaterSets && f.RefusesSets() || kind == LaterSlots && f.SlotsRefusal() != "" ||
				kind == LaterSessions && !srv.Sessions() {
				continue // the Client refuses the kind there before its proof, or keeps no session
			}
			if err := prove(ctx); err != nil {
				t.Fatalf("the %s proof: %v", LaterNames[kind], err)
			}
			if !srv.Forms().Later[kind] {
				t.Errorf("the %s proof passed, not marked", LaterNames[kind])
			}
			var n int
			if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+table+"`").Scan(&n); err != nil || n != 0 {
				t.Errorf("after the %s proof: %d rows (%v), want 0", LaterNames[kind], n, err)
			}
		}
	})
}

// provenOnce makes proof kind with prove on each server, unless skip names
// a reason: the proof passes and is marked, leaves no row, and a second
// call sends nothing (here, on a pool closed in between, it would fail if
// it sent).
func provenOnce(t *testing.T, kind int, skip func(*Server) string, prove func(*Server, context.Context) error) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		db, table, srv := usedServer(t, s)
		ctx := testCtx(t)
		if why := skip(srv); why != "" {
			t.Skip(why)
		}
		if err := prove(srv, ctx); err != nil {
			t.Fatal(err)
		}
		if !srv.Forms().Later[kind] {
			t.Fatalf("the %s proof passed, not marked", LaterNames[kind])
		}
		var n int
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+table+"`").Scan(&n); err != nil || n != 0 {
			t.Errorf("after the %s proof: %d rows (%v), want 0", LaterNames[kind], n, err)
		}
		srv.Close(ctx)
		db.Close()
		if err := prove(srv, ctx); err != nil {
			t.Errorf("the second %s proof, on a closed pool: %v, want nothing sent", LaterNames[kind], err)
		}
	})
}
