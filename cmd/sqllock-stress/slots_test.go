package main

import (
	"strings"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/testdsn"
)

// A short semaphore run: four Clients of three goroutines take slots of two
// semaphores of 3, a fifth of the holders stall past their lease. No more
// than 3 hold one at once, and fences grow; the self-test, whose goroutines
// work when refused, is caught.
func TestStress_slots(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		if s.TiDB || s.Vitess {
			t.Skip("no semaphores on TiDB and Vitess")
		}
		status, out := stress(t, s.DSN, "-slots", "3", "-procs", "4", "-goroutines", "3", "-names", "2",
			"-duration", "3s", "-ttl", "100ms", "-stall-fraction", "0.2")
		if status != 0 || !strings.Contains(out, "violations:               0\n") || !strings.Contains(out, "most holders at once:     3\n") {
			t.Fatalf("got status %d, want 0 with no violations and 3 holders at once at the most", status)
		}
		status, out = stress(t, s.DSN, "-slots", "2", "-procs", "3", "-goroutines", "3", "-names", "1",
			"-duration", "1s", "-ttl", "100ms", "-selftest-broken")
		if status != 1 || strings.Contains(out, "violations:               0\n") {
			t.Fatalf("self-test: got status %d, want 1 with violations found", status)
		}
	})
}

// The checker's rules on hand-made sections.
func TestCheckSlots(t *testing.T) {
	at := func(ms int) time.Time { return time.Unix(0, int64(ms)*int64(time.Millisecond)) }
	ok := []slotSection{
		{"s", 1, 10, at(0), at(10)}, {"s", 2, 11, at(5), at(15)}, {"s", 1, 12, at(10), at(20)},
	}
	if v := checkSlots(ok, 2); len(v) != 0 {
		t.Errorf("a good run: got %v", v)
	}
	for name, bad := range map[string][]slotSection{
		"three at once":  {{"s", 1, 10, at(0), at(10)}, {"s", 2, 11, at(1), at(10)}, {"s", 3, 12, at(2), at(10)}},
		"one slot twice": {{"s", 1, 10, at(0), at(10)}, {"s", 1, 11, at(5), at(15)}},
		"fence twice":    {{"s", 1, 10, at(0), at(10)}, {"s", 2, 10, at(20), at(30)}},
		"fence back":     {{"s", 1, 10, at(0), at(10)}, {"s", 2, 9, at(20), at(30)}},
	} {
		if v := checkSlots(bad, 2); len(v) == 0 {
			t.Errorf("%s: got no violation", name)
		}
	}
}
