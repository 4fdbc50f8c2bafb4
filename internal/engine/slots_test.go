package engine

import (
	"strings"
	"testing"
)

// A semaphore's rows sort between its fence row and the end Q, and no
// other semaphore's does; slot_acquire takes 13 arguments and 8 a slot row
// visited, as many as its text has placeholders.
func TestSlots_rowsAndArgs(t *testing.T) {
	p, q := SlotRows("jobs"), SlotRowsEnd("jobs")
	for _, in := range []string{SlotName("jobs", 1), SlotName("jobs", 64)} {
		if !(p < in && in < q) {
			t.Errorf("%q not between %q and %q", in, p, q)
		}
	}
	if other := SlotName("jobs2", 1); p < other && other < q {
		t.Errorf("another semaphore's row %q sorts among jobs's", other)
	}
	for _, v := range []int{1, 3} {
		args := SlotArgs("jobs", 3, v, "tok", testHolder, 1000)
		text := testQueries.Slot("`sqllock`", false, v)
		if got, want := len(args), strings.Count(text, "?"); got != want || got != 13+8*v {
			t.Errorf("v=%d: %d arguments, the text has %d placeholders", v, got, want)
		}
	}
}
