package sqllock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/engine"
)

// The set, semaphore and Once statements are proven at their kind's first
// use, once per Client, not at the Client's first write, and leave no row
// behind.
func TestClient_laterProofs_atFirstUseOnce(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		c := e.client(t, e.db, table)
		ctx := testCtx(t)
		done := func(kind int) bool { return c.eng.Forms().Later[kind] }
		if err := mustAcquire(t, c, "single", time.Minute).Release(ctx); err != nil {
			t.Fatal(err)
		}
		for kind := range engine.NumLater {
			if done(kind) {
				t.Errorf("after a single name: the %s proof made, want it left to its first use", engine.LaterNames[kind])
			}
		}
		uses := []struct {
			kind int
			use  func() error
		}{
			{engine.LaterSets, func() error {
				l, err := c.TryAcquireSet(ctx, []string{"a", "b"}, time.Minute)
				if err == nil {
					err = l.Release(ctx)
				}
				return err
			}},
			{engine.LaterSlots, func() error {
				l, err := c.Semaphore("jobs", 2).TryAcquire(ctx, time.Minute)
				if err == nil {
					err = l.Release(ctx)
				}
				return err
			}},
			{engine.LaterOnce, func() error {
				_, err := c.Once(ctx, "once", func(_ context.Context, _ *Lock) error { return nil })
				return err
			}},
		}
		for _, u := range uses {
			err := u.use()
			if errors.Is(err, ErrUnsupportedServer) && e.oneRow() && u.kind != engine.LaterOnce {
				continue // sets through Vitess, semaphores on TiDB and through Vitess
			}
			if err != nil {
				t.Fatalf("first %s: %v", engine.LaterNames[u.kind], err)
			}
			if !done(u.kind) {
				t.Errorf("after the first %s: its proof not made", engine.LaterNames[u.kind])
			}
			if n := e.proofRows(t, table); n != 0 {
				t.Errorf("after the first %s: %d proof rows, want 0", engine.LaterNames[u.kind], n)
			}
		}
	})
}
