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
			"-duration", "3s", "-ttl", "100ms", "-selftest-broken")
		if status != 1 || strings.Contains(out, "violations:               0\n") {
			t.Fatalf("self-test: got status %d, want 1 with violations found", status)
		}
	})
}

// The checker's rules on hand-made sections.
func TestCheckSlots(t *testing.T) {
	at := func(ms int) time.Time { return time.Unix(0, int64(ms)*int64(time.Millisecond)) }
	// sec is a section of slot whose acquire was called 1ms before it began.
	sec := func(slot int, fence uint64, start, end int) slotSection {
		return slotSection{"s", slot, fence, at(start - 1), at(start), at(end)}
	}
	ok := []slotSection{
		sec(1, 10, 0, 10), sec(2, 11, 5, 15), sec(1, 12, 10, 20),
		// Committed first (fence 13, called at 20), its reply slower than
		// fence 14's whole section on another slot.
		{"s", 2, 13, at(20), at(40), at(50)}, sec(1, 14, 25, 30),
	}
	if v := checkSlots(ok, 2); len(v) != 0 {
		t.Errorf("a good run: got %v", v)
	}
	for name, bad := range map[string][]slotSection{
		"three at once":           {sec(1, 10, 0, 10), sec(2, 11, 1, 10), sec(3, 12, 2, 10)},
		"one slot twice":          {sec(1, 10, 0, 10), sec(1, 11, 5, 15)},
		"fence twice":             {sec(1, 10, 0, 10), sec(2, 10, 20, 30)},
		"fence back":              {sec(1, 10, 0, 10), sec(2, 9, 20, 30)},
		"fence back, overlapping": {sec(1, 10, 0, 10), sec(2, 9, 5, 30)},
	} {
		if v := checkSlots(bad, 2); len(v) == 0 {
			t.Errorf("%s: got no violation", name)
		}
	}
}
