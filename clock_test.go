package sqllock

import (
	"log/slog"
	"testing"
	"time"
)

// A lease written by a node whose clock runs ahead carries an acquired_at
// in the reading node's future: Inspect and List warn of it, at most once a
// minute per Client, and not of a lease whose acquired_at is its age. The
// lease is moved into the future by hand, as a node 2 s ahead would have
// written it (docs/faults-clusters.md measured the same signal on a
// Galera node under libfaketime).
func TestClient_warnsOfClockAhead(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		rec, logOpt := newRecorder()
		c := e.client(t, e.db, table, logOpt)
		ctx := testCtx(t)
		mustAcquire(t, c, "now", time.Minute)
		mustAcquire(t, c, "ahead", time.Minute)
		if _, err := c.Inspect(ctx, "now"); err != nil {
			t.Fatal(err)
		}
		if _, err := c.List(ctx); err != nil {
			t.Fatal(err)
		}
		warned := func(r *recorder) int {
			return len(r.find(slog.LevelWarn, "acquired ahead", "now")) + len(r.find(slog.LevelWarn, "acquired ahead", "ahead"))
		}
		if got := warned(rec); got != 0 {
			t.Fatalf("warnings for leases of this server's own clock: got %d, want 0", got)
		}

		if _, err := e.db.Exec("UPDATE `" + table + "` SET acquired_at = UTC_TIMESTAMP(6) + INTERVAL 2 SECOND WHERE name = 'ahead' AND kind = 'L'"); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Inspect(ctx, "ahead"); err != nil {
			t.Fatal(err)
		}
		got := rec.find(slog.LevelWarn, "acquired ahead", "ahead")
		if len(got) != 1 {
			t.Fatalf("warnings after Inspect of a lease 2 s ahead: got %d, want 1", len(got))
		}
		if d, err := time.ParseDuration(attr(got[0], "ahead")); err != nil || d < time.Second || d > 2*time.Second {
			t.Fatalf("the warning's ahead: got %q, want between 1s and 2s", attr(got[0], "ahead"))
		}
		if _, err := c.List(ctx); err != nil {
			t.Fatal(err)
		}
		if got := warned(rec); got != 1 {
			t.Fatalf("warnings after a List within the minute: got %d, want still 1", got)
		}

		// Another Client (another process) warns on its own, through List.
		rec2, logOpt2 := newRecorder()
		c2 := e.client(t, e.openDB(t), table, logOpt2)
		if _, err := c2.List(ctx); err != nil {
			t.Fatal(err)
		}
		if got := warned(rec2); got != 1 {
			t.Fatalf("warnings after List: got %d, want 1", got)
		}
	})
}
