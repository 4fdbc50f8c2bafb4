package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/exampletest"
	"github.com/sqllock/sqllock/internal/testdsn"
)

func TestMain(m *testing.M) { exampletest.Main(m) }

// ledger reads the fences of the ledger's entries in the order they were
// appended.
func ledger(t *testing.T, db *sql.DB) []uint64 {
	t.Helper()
	return exampletest.Fences(t, db, "SELECT fence FROM ledger ORDER BY id")
}

// Three replicas campaign; once the first leader has written, it stops,
// and another takes over. Every entry was written by the leader of its
// time: in the ledger's order, the fences never go down.
func TestCampaign_oneLeaderWritesAtATime(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		dsn, db := testdsn.Database(t, s)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		var (
			locks *sqllock.Client
			stops = map[string]context.CancelFunc{}
			wg    sync.WaitGroup
			errs  = make(chan error, 3)
		)
		for i := range 3 {
			holder := fmt.Sprintf("replica-%d", i)
			rdb, rlocks := exampletest.Replica(t, dsn, holder, createLedger)
			locks = rlocks
			rctx, stop := context.WithCancel(ctx)
			stops[holder] = stop
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := campaign(rctx, rlocks, rdb, 2*time.Second, 10*time.Millisecond); err != nil && rctx.Err() == nil {
					errs <- err
				}
			}()
		}
		stopAll := func() {
			for _, stop := range stops {
				stop()
			}
			wg.Wait()
		}
		defer stopAll()
		waitFor := func(what string, ok func(fences []uint64) bool) {
			t.Helper()
			for !ok(ledger(t, db)) {
				select {
				case err := <-errs:
					t.Fatalf("campaign: %v", err)
				case <-ctx.Done():
					t.Fatalf("%s: got %v, want it before the test's deadline", what, ledger(t, db))
				case <-time.After(20 * time.Millisecond):
				}
			}
		}
		waitFor("five entries", func(f []uint64) bool { return len(f) >= 5 })
		info, err := locks.Inspect(ctx, "ledger-writer")
		if err != nil {
			t.Fatal(err)
		}
		stop, ok := stops[info.Holder]
		if !ok {
			t.Fatalf("got leader %q, want one of the replicas", info.Holder)
		}
		stop() // the leader steps down
		first := ledger(t, db)[0]
		waitFor("five entries of a second leader", func(f []uint64) bool {
			n := 0
			for _, fence := range f {
				if fence != first {
					n++
				}
			}
			return n >= 5
		})
		stopAll()
		fences := ledger(t, db)
		for i := 1; i < len(fences); i++ {
			if fences[i] < fences[i-1] {
				t.Fatalf("entry %d has fence %d after %d: two leaders wrote at once (ledger %v)", i+1, fences[i], fences[i-1], fences)
			}
		}
	})
}

// A leader whose lease expired, and whose name another replica took, is
// refused: its entry is not written, the new leader's is.
func TestAppendEntry_staleLeaderRefused(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		dsn, db := testdsn.Database(t, s)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, old := exampletest.Replica(t, dsn, "old", createLedger)
		_, next := exampletest.Replica(t, dsn, "next", createLedger)
		stale, lead := exampletest.Stale(t, ctx, old, next, "ledger-writer")
		if err := appendEntry(ctx, db, stale, "stale"); !errors.Is(err, sqllock.ErrNotHeld) {
			t.Errorf("the stale leader's append: got %v, want ErrNotHeld", err)
		}
		if err := appendEntry(ctx, db, lead, "next"); err != nil {
			t.Errorf("the leader's append: got %v, want nil", err)
		}
		if got := ledger(t, db); len(got) != 1 || got[0] != lead.Fence() {
			t.Errorf("ledger: got fences %v, want only the leader's, %d", got, lead.Fence())
		}
	})
}
