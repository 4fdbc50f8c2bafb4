package main

import (
	"bufio"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

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
			// Sets kept alive, attached to their Client's session where
			// the server keeps one.
			{"setsKeptAlive", []string{"-names", "4", "-set", "2", "-keepalive"}, []string{"acquire ok", "write ok", "release ok", "read ok"}},
			{"slots", []string{"-slots", "2"}, []string{"acquire ok", "acquire refused", "release ok"}},
		} {
			// At a load average of 20, 300 ms leases made runs that proved
			// too little (no refresh in time, no refusal), or a checked
			// write whose holder starved inside Lock.Check past its lease
			// had its connection ended by the next acquirer, as designed.
			// Such a run, with nothing else wrong, is made again with the
			// ttl doubled, up to 1.2 s; any other failure fails at once.
			for ttl := 300 * time.Millisecond; ; ttl *= 2 {
				last := ttl >= 1200*time.Millisecond
				path := t.TempDir() + "/history.jsonl"
				args := append([]string{"-procs", "3", "-goroutines", "3", "-names", "2", "-duration", "3s", "-ttl", ttl.String(),
					"-stall-fraction", "0.3", "-history", path}, mode.args...)
				status, out := stress(t, s.DSN, args...)
				if status != 0 && (!brokenByLoad(out) || last) {
					t.Fatalf("%s: exit status %d, want 0", mode.name, status)
				}
				if status == 0 && !strings.Contains(out, " operations in "+path) {
					t.Errorf("%s: the summary does not name the history", mode.name)
				}
				if status == 0 && (historyHas(t, mode.name, path, mode.kinds, last) || last) {
					break
				}
				t.Logf("%s: a run with %v leases broken by the load; made again with longer ones", mode.name, ttl)
			}
		}
	})
}

// historyHas checks the history at path of a run in mode, and reports
// whether it has every kind of operation in kinds: a run on a loaded
// machine may lack some. With last, it fails the test for one missing.
func historyHas(t *testing.T, name, path string, kinds []string, last bool) bool {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var op histOp
		if err := json.Unmarshal(sc.Bytes(), &op); err != nil {
			t.Fatalf("%s: %v in %q", name, err, sc.Text())
		}
		if op.Return < op.Call || op.Call == 0 {
			t.Errorf("%s: call %d, return %d in %q", name, op.Call, op.Return, sc.Text())
		}
		if op.Result == "ok" && op.Kind != "read" && op.Fence == 0 {
			t.Errorf("%s: no fence in %q", name, sc.Text())
		}
		if sets := name == "sets" || name == "setsKeptAlive"; sets && op.Kind != "read" && op.Set != 2 {
			t.Errorf("%s: set %d in %q, want 2", name, op.Set, sc.Text())
		}
		if name == "slots" && op.Result == "ok" && (op.Slot < 1 || op.Slot > 2 || op.Slots != 2) {
			t.Errorf("%s: slot %d of %d in %q, want 1 or 2 of 2", name, op.Slot, op.Slots, sc.Text())
		}
		seen[op.Kind+" "+op.Result]++
	}
	f.Close()
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	// One read per name; the semaphore mode writes no register.
	reads, ok := map[string]int{"sets": 4, "setsKeptAlive": 4, "slots": 0}[name]
	if !ok {
		reads = 2
	}
	if seen["read ok"] != reads {
		t.Errorf("%s: %d reads, want %d", name, seen["read ok"], reads)
	}
	for _, k := range kinds {
		if seen[k] == 0 {
			if last {
				t.Errorf("%s: no %q in the history (%v)", name, k, seen)
			} else {
				t.Logf("%s: no %q in the history (%v)", name, k, seen)
			}
			return false
		}
	}
	return true
}

// brokenByLoad reports whether a run's summary, out, says it failed only
// for checked writes whose connection broke: what a holder frozen inside
// Lock.Check past its lease gets from the next acquirer (docs/guarantees.md),
// no violation, lost or stale write, or other error beside.
func brokenByLoad(out string) bool {
	for _, zero := range []string{"violations:               0\n", "lost acknowledged writes: 0\n",
		"stale writes committed:   0 (", "unexpected errors:        0\n", "resource mismatches:      0\n"} {
		if !strings.Contains(out, zero) {
			return false
		}
	}
	_, rest, ok := strings.Cut(out, "operation errors:         ")
	if !ok {
		return false
	}
	lines := strings.Split(rest, "\n")
	n := 0
	for _, l := range lines[1:] {
		if !strings.HasPrefix(l, "  ") {
			break
		}
		class, _, _ := strings.Cut(strings.TrimSpace(l), ":  ")
		switch class {
		case "write: invalid connection", "write: unexpected EOF", "write: bad connection", "write: EOF":
			n++
		default:
			return false
		}
	}
	return n > 0
}

// brokenByLoad takes a run whose only failure is a checked write's broken
// connection (this summary is from a run at a load average of 20), and
// nothing beside.
func TestBrokenByLoad(t *testing.T) {
	const broken = `violations:               0
  overlapping live leases: 0
lost acknowledged writes: 0
stale writes committed:   0 (writes that took the register back)
operation errors:         1
  write: invalid connection:               1
unexpected errors:        0
resource mismatches:      0
`
	if !brokenByLoad(broken) {
		t.Errorf("a run failed only by a checked write's broken connection: got false, want true")
	}
	for _, c := range []struct{ old, new string }{
		{"violations:               0", "violations:               1"},
		{"lost acknowledged writes: 0", "lost acknowledged writes: 2"},
		{"stale writes committed:   0", "stale writes committed:   1"},
		{"  write: invalid connection:               1", "  acquire: invalid connection:               1"},
		{"  write: invalid connection:               1\n", "  write: invalid connection:               1\n  refresh: Error 1146:   1\n"},
		{"operation errors:         1\n  write: invalid connection:               1\n", "operation errors:         0\n"},
		{"unexpected errors:        0", "unexpected errors:        1"},
	} {
		if out := strings.Replace(broken, c.old, c.new, 1); brokenByLoad(out) {
			t.Errorf("with %q: got true, want false", c.new)
		}
	}
}
