package sqllockotel

import (
	"testing"
	"time"

	"github.com/sqllock/sqllock/observe"
)

// The age of each label value is its oldest lease held now's; a value
// seen whose leases all ended reads 0, and so does "" from the start.
func TestHolds_oldest(t *testing.T) {
	h := newHolds()
	t0 := time.Now()
	label := func(n string) string { return map[string]string{"a": "x", "b": "x", "c": "y"}[n] }
	h.see("x")
	h.see("y")
	h.start(observe.HoldEvent{Name: "a", Fence: 1}, t0)
	h.start(observe.HoldEvent{Name: "b", Fence: 7}, t0.Add(time.Second))
	h.start(observe.HoldEvent{Name: "c", Fence: 2}, t0.Add(2*time.Second))
	now := t0.Add(10 * time.Second)
	want := func(got map[string]time.Duration, want map[string]time.Duration) {
		t.Helper()
		for k, w := range want {
			if got[k] != w {
				t.Errorf("age of %q: got %v, want %v", k, got[k], w)
			}
		}
		if len(got) != len(want) {
			t.Errorf("got %v, want %v", got, want)
		}
	}
	want(h.oldest(now, label), map[string]time.Duration{"": 0, "x": 10 * time.Second, "y": 8 * time.Second})
	h.end(observe.HoldEvent{Name: "a", Fence: 1})
	h.end(observe.HoldEvent{Name: "c", Fence: 2})
	h.end(observe.HoldEvent{Name: "c", Fence: 2}) // told twice: no harm
	want(h.oldest(now, label), map[string]time.Duration{"": 0, "x": 9 * time.Second, "y": 0})
}
