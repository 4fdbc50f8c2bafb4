package main

import (
	"bufio"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/sqllock/sqllock/internal/testdsn"
)

// -history writes every operation of the run, each once, with a return no
// earlier than its call: acquires (taken and refused), refreshes, writes
// and releases from every process, and the parent's read of each name's
// register. The linearize module's tests check such histories. The
// leases last 300 ms: under CI's load (2 cores, load average 14) leases of
// 100 ms all ran out before the holder's refresh, so no "refresh ok" came.
func TestStress_history(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		for _, mode := range []struct {
			name  string
			args  []string
			kinds []string
		}{
			{"fenced", nil, []string{"acquire ok", "acquire refused", "refresh ok", "write ok", "write rejected", "release ok", "release notheld", "read ok"}},
			{"checked", []string{"-check"}, []string{"acquire ok", "cwrite ok", "cwrite refused", "release ok", "read ok"}},
			{"sets", []string{"-names", "4", "-set", "2"}, []string{"acquire ok", "write ok", "refresh ok", "release ok", "read ok"}},
			{"slots", []string{"-slots", "2"}, []string{"acquire ok", "acquire refused", "release ok"}},
		} {
			path := t.TempDir() + "/history.jsonl"
			args := append([]string{"-procs", "3", "-goroutines", "3", "-names", "2", "-duration", "3s", "-ttl", "300ms",
				"-stall-fraction", "0.3", "-history", path}, mode.args...)
			if status, out := stress(t, s.DSN, args...); status != 0 {
				t.Fatalf("%s: exit status %d, want 0", mode.name, status)
			} else if !strings.Contains(out, " operations in "+path) {
				t.Errorf("%s: the summary does not name the history", mode.name)
			}
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			seen := map[string]int{}
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				var op histOp
				if err := json.Unmarshal(sc.Bytes(), &op); err != nil {
					t.Fatalf("%s: %v in %q", mode.name, err, sc.Text())
				}
				if op.Return < op.Call || op.Call == 0 {
					t.Errorf("%s: call %d, return %d in %q", mode.name, op.Call, op.Return, sc.Text())
				}
				if op.Result == "ok" && op.Kind != "read" && op.Fence == 0 {
					t.Errorf("%s: no fence in %q", mode.name, sc.Text())
				}
				if mode.name == "sets" && op.Kind != "read" && op.Set != 2 {
					t.Errorf("%s: set %d in %q, want 2", mode.name, op.Set, sc.Text())
				}
				if mode.name == "slots" && op.Result == "ok" && (op.Slot < 1 || op.Slot > 2 || op.Slots != 2) {
					t.Errorf("%s: slot %d of %d in %q, want 1 or 2 of 2", mode.name, op.Slot, op.Slots, sc.Text())
				}
				seen[op.Kind+" "+op.Result]++
			}
			f.Close()
			if err := sc.Err(); err != nil {
				t.Fatal(err)
			}
			for _, k := range mode.kinds {
				if seen[k] == 0 {
					t.Errorf("%s: no %q in the history (%v)", mode.name, k, seen)
				}
			}
			// One read per name; the semaphore mode writes no register.
			reads := map[string]int{"sets": 4, "slots": 0}[mode.name]
			if mode.name != "sets" && mode.name != "slots" {
				reads = 2
			}
			if seen["read ok"] != reads {
				t.Errorf("%s: %d reads, want %d", mode.name, seen["read ok"], reads)
			}
		}
	})
}
