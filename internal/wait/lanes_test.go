package wait

import (
	"fmt"
	"testing"

	"github.com/sqllock/sqllock/internal/testdsn"
)

// A semaphore of one slot, or a Client without channels, has no lanes; a
// semaphore of n slots has up to n, within Config.MaxLanes and the
// Client's channels. A call that nobody waits beside takes lane 1, and a
// waiting call joins the lane with the fewest callers of this Client.
func TestEngine_Lane(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		e := newEngine(t, s, fmt.Sprintf("lanes_%s", t.Name()), nil)
		e.maxLanes = 3
		key := func(j int) string { return fmt.Sprintf("sem/%d", j) }
		if got := e.Lane(1, key); got != 0 {
			t.Errorf("one slot: got lane %d, want 0 (no lanes)", got)
		}
		if got := e.lanes(8); got != 3 {
			t.Errorf("8 slots, MaxLanes 3: got %d lanes, want 3", got)
		}
		if got := e.Lane(3, key); got != 1 {
			t.Errorf("nobody waiting: got lane %d, want 1", got)
		}
		// Two callers wait on lane 1 and one on lane 3: the next joins
		// lane 2, the emptiest.
		for _, j := range []int{1, 1, 3} {
			tk := e.queues.join(key(j))
			t.Cleanup(tk.leave)
		}
		for range 10 { // ties are broken at random; here there is none
			if got := e.Lane(3, key); got != 2 {
				t.Fatalf("callers waiting on lanes 1, 1 and 3: got lane %d, want 2", got)
			}
		}
		off := newEngine(t, s, fmt.Sprintf("lanes_off_%s", t.Name()), nil)
		off.maxLanes = 3
		off.Refuse() // the server's channels are off (TiDB, Vitess)
		if got := off.Lane(3, key); got != 0 {
			t.Errorf("channels off: got lane %d, want 0 (no lanes)", got)
		}
	})
}
