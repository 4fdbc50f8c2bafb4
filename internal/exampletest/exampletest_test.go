package exampletest

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/testdsn"
)

func TestMain(m *testing.M) { Main(m) }

const createRuns = "CREATE TABLE IF NOT EXISTS runs (id INT AUTO_INCREMENT PRIMARY KEY, fence BIGINT UNSIGNED NOT NULL)"

// Two replicas share the lock table and the schema: the stalled one's lease
// expires, the other takes the name over with a greater fence, and Fences
// reads back what each wrote, in order.
func TestReplica_staleTakeover(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		dsn, db := testdsn.Database(t, s)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		pausedDB, paused := Replica(t, dsn, "paused", createRuns)
		_, next := Replica(t, dsn, "next", createRuns)

		start := time.Now()
		stale, live := Stale(t, ctx, paused, next, "job")
		if took := time.Since(start); took < 500*time.Millisecond {
			t.Errorf("the take-over came %v after the stalled acquire, want after its one-second lease", took)
		}
		if stale.Name() != "job" || live.Name() != "job" {
			t.Errorf("names: got %q and %q, want job", stale.Name(), live.Name())
		}
		if live.Fence() <= stale.Fence() {
			t.Errorf("fences: got %d after %d, want greater", live.Fence(), stale.Fence())
		}
		for _, f := range []uint64{stale.Fence(), live.Fence()} {
			if _, err := pausedDB.ExecContext(ctx, "INSERT INTO runs (fence) VALUES (?)", f); err != nil {
				t.Fatal(err)
			}
		}
		want := []uint64{stale.Fence(), live.Fence()}
		if got := Fences(t, db, "SELECT fence FROM runs ORDER BY id"); !slices.Equal(got, want) {
			t.Errorf("Fences: got %v, want %v", got, want)
		}
		if got := Fences(t, db, "SELECT fence FROM runs WHERE fence = 0"); len(got) != 0 {
			t.Errorf("Fences of no rows: got %v, want none", got)
		}
	})
}
