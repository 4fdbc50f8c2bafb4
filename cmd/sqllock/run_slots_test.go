package main

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/testdsn"
)

// run -n 2: of three copies started together, two run at once, each on a
// slot of its own, and the third exits with the conflict status naming the
// holders; with --wait it runs when a slot frees. Another -n while a copy
// runs is refused as run's own failure. The jobs hold their slots until the
// test lets them go (a file appears): a fixed sleep ran out on a loaded
// machine before the checks that need both slots held.
func TestRun_slots(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		if s.TiDB || s.Vitess {
			t.Skip("no semaphores on TiDB and Vitess")
		}
		e := newEnv(t, s.DSN)
		job := func(wait string) []string {
			return []string{"run", "-n", "2", "--wait", wait, "pool", "--", "sh", "-c",
				`echo "$SQLLOCK_SLOT:$SQLLOCK_FENCE" >> ` + e.path("slots") + `; while [ ! -e ` + e.path("go") + ` ]; do sleep 0.05; done`}
		}
		_, waitA := e.start(job("0s")...)
		_, waitB := e.start(job("0s")...)
		waitFor(t, 30*time.Second, "two copies to hold slots", func() bool { return len(e.lines("slots")) == 2 })
		if l := e.run("list"); l.status != 0 || !strings.Contains(l.stdout, "pool (slot 1)") || !strings.Contains(l.stdout, "pool (slot 2)") {
			t.Errorf("list while two copies run: got %d, %q, want both slots of pool", l.status, l.stdout)
		}
		c := e.run(job("0s")...)
		if c.status != exitConflict || !strings.Contains(c.stderr, "all 2 slots of pool are held (1 by") {
			t.Errorf("third copy: got %d, %q, want %d naming the holders", c.status, c.stderr, exitConflict)
		}
		other := e.run("run", "-n", "3", "pool", "--", "true")
		if other.status != exitOwn || !strings.Contains(other.stderr, "has 2 slots, not 3") {
			t.Errorf("-n 3 while -n 2 runs: got %d, %q, want %d saying so", other.status, other.stderr, exitOwn)
		}
		_, waitD := e.start(job("30s")...)
		time.Sleep(time.Second) // for the waiting copy to be waiting
		if n := len(e.lines("slots")); n != 2 {
			t.Errorf("with both slots held, a copy with --wait ran: %d runs, want 2", n)
		}
		if err := os.WriteFile(e.path("go"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if a, b, d := waitA(), waitB(), waitD(); a.status != 0 || b.status != 0 || d.status != 0 {
			t.Fatalf("statuses: got %d, %d, %d, want 0 (stderr %q)", a.status, b.status, d.status, d.stderr)
		}
		lines := e.lines("slots")
		var slots []string
		for _, l := range lines {
			slot, _, _ := strings.Cut(l, ":")
			slots = append(slots, slot)
		}
		if len(lines) != 3 || !slices.Contains(slots[:2], "1") || !slices.Contains(slots[:2], "2") {
			t.Fatalf("slots of the runs: got %q, want 1 and 2, then the waiting copy's", lines)
		}
		if bad := e.run("run", "-n", "65", "pool", "--", "true"); bad.status != exitUsage {
			t.Errorf("-n 65: got %d, want %d", bad.status, exitUsage)
		}
	})
}
