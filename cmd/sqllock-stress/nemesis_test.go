package main

import (
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/sqllock/sqllock/internal/testdsn"
)

// A holder whose ValidUntil reached into the next holder's section is a
// violation; one whose belief ended before, or whose section ended first,
// is not.
func TestCheck_beliefs(t *testing.T) {
	sec := func(p int, fence uint64, start, end, expiry, belief int64) record {
		return record{Proc: p, Name: "n", Fence: fence, Start: start, End: end, Expiry: expiry, Belief: belief}
	}
	tests := []struct {
		name    string
		records []record
		want    int
	}{
		{"belief ends before the next start", []record{sec(1, 1, 10, 50, 100, 90), sec(2, 2, 100, 120, 200, 190)}, 0},
		{"section ends before the next start", []record{sec(1, 1, 10, 20, 100, 150), sec(2, 2, 100, 120, 200, 190)}, 0},
		{"unknown belief", []record{sec(1, 1, 10, 0, 100, 0), sec(2, 2, 100, 120, 200, 190)}, 0},
		{"believed past the next start", []record{sec(1, 1, 10, 0, 100, 130), sec(2, 2, 100, 120, 200, 190)}, 1},
		{"believed past it, section ended later", []record{sec(1, 1, 10, 140, 100, 130), sec(2, 2, 100, 150, 200, 190)}, 1},
		{"cut short, released before the next start", []record{released(sec(1, 1, 10, 0, 130, 130), 90), sec(2, 2, 100, 150, 200, 190)}, 0},
		{"cut short, released after the next start", []record{released(sec(1, 1, 10, 0, 130, 130), 110), sec(2, 2, 100, 150, 200, 190)}, 1},
		{"cut short, not released", []record{sec(1, 1, 10, 0, 130, 130), sec(2, 2, 100, 150, 200, 190)}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := check(tt.records)
			if got := len(f.Overlaps); strings.HasPrefix(tt.name, "cut short") && got != tt.want {
				t.Errorf("overlaps: got %d (%q), want %d", got, f.Overlaps, tt.want)
			}
			if got := len(f.Beliefs); got != tt.want {
				t.Errorf("beliefs violated: got %d (%q), want %d", got, f.Beliefs, tt.want)
			}
			if got := f.violations(); got < len(f.Beliefs) {
				t.Errorf("violations: got %d, want at least the %d beliefs", got, len(f.Beliefs))
			}
		})
	}
}

// released is r with the time its holder released it after an error.
func released(r record, at int64) record {
	r.Released = at
	return r
}

// Recovery is measured from the heal to each name's first section after
// it; the sections of faulty processes under way at the fault are caught.
func TestRecovery(t *testing.T) {
	cfg := config{fault: "pause", faulty: 1}
	o := faultOutcome{at: 1000, healedAt: 2000}
	records := []record{
		{Proc: 0, Name: "a", Acquired: 890, Start: 900, End: 2500},  // caught
		{Proc: 0, Name: "b", Acquired: 890, Start: 2100, End: 2500}, // caught before it read the clock
		{Proc: 0, Name: "b", Acquired: 890, Start: 900, End: 950},   // ended before
		{Proc: 1, Name: "b", Acquired: 890, Start: 900, End: 2500},  // not a faulty process
		{Proc: 1, Name: "a", Start: 2300, End: 2400},                // a: 300 after the heal
		{Proc: 1, Name: "a", Start: 2100, End: 2200},                // a: 100 after the heal
		{Proc: 2, Name: "b", Start: 2700, End: 2800},                // b: 700 after the heal
	}
	names, longest, caught := recovery(cfg, o, records)
	if names != 2 || longest != 100 || len(caught) != 2 {
		t.Errorf("recovery: got %d names, longest %dµs, %d caught; want 2, 100µs, 2", names, longest, len(caught))
	}
	// b went from the fault's start (1000) to 2100 without a new holder.
	if got := degraded(o, records); got != 1100 {
		t.Errorf("degraded: got %dµs, want 1100µs", got)
	}
	records = append(records, record{Proc: 2, Name: "b", Start: 1500, End: 1600})
	if got := degraded(o, records); got != 1100 {
		t.Errorf("degraded with b acquired during the fault: got %dµs, want 1200µs", got)
	}
}

func TestStress_badFaultFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-dsn", "x", "-fault", "meteor"},
		{"-dsn", "x", "-fault", "pause", "-procs", "2", "-faulty", "2"},
		{"-dsn", "x", "-fault", "pause", "-faulty", "0"},
		{"-dsn", "x", "-fault", "pause", "-duration", "2s", "-fault-after", "1s", "-fault-for", "1s"},
		{"-dsn", "x", "-fault", "crash", "-kill-pid", "p"},
		{"-dsn", "x", "-fault", "crash", "-restart-cmd", "true"},
		{"-dsn", "x", "-fault", "pause", "-kill-pid", "p"},
		{"-dsn", "x", "-restart-cmd", "true"},
		{"-dsn", "x", "-fault", "pause", "-max-recovery", "-1s"},
	} {
		if _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("parseFlags(%q): got no error", args)
		}
	}
}

// faultRun runs the checker with a fault on a real server, and checks that
// it passed with the fault injected, healed and recovered from. The fault
// is healed 2 s into the run, or up to a second later when no faulty
// process held a name yet; the 4 s after are for every name to be taken
// again (2 s were too few at a load average of 25).
func faultRun(t *testing.T, dsn string, args ...string) string {
	t.Helper()
	status, out := stress(t, dsn, append([]string{"-procs", "3", "-goroutines", "3", "-names", "2",
		"-duration", "6s", "-ttl", "200ms", "-stall-fraction", "0.1", "-fault-after", "1s", "-fault-for", "1s"}, args...)...)
	if status != 0 {
		t.Fatalf("exit status %d, want 0", status)
	}
	for _, want := range []string{"violations:               0\n", "lost acknowledged writes: 0\n",
		"stale writes committed:   0", "recovery:                 2 of 2 names", "PASS\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q", want)
		}
	}
	if strings.Contains(out, "fault:                    "+args[1]+" failed") {
		t.Errorf("the fault was not injected")
	}
	return out
}

// A process cut off from the server for five leases, each way and both,
// holds nothing past its ValidUntil and commits no stale write, fenced or
// through Lock.Check; the others take its names over.
func TestStress_partitions(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, srv testdsn.Server) {
		for _, fault := range []string{"partition-both", "partition-to-server", "partition-to-client"} {
			t.Run(fault, func(t *testing.T) { faultRun(t, srv.DSN, "-fault", fault) })
			t.Run(fault+"-check", func(t *testing.T) { faultRun(t, srv.DSN, "-fault", fault, "-check") })
		}
	})
}

// A process stopped for five leases, then continued, writes nothing stale.
func TestStress_pause(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, srv testdsn.Server) {
		out := faultRun(t, srv.DSN, "-fault", "pause", "-check", "-stall-fraction", "0")
		if strings.Contains(out, "holders caught by it:     0 ") {
			t.Logf("no holder was under way when the process stopped: the run proved less")
		}
	})
}

// Holders that keep their lease with KeepAlive, stopped past it: each
// keep-alive reports the loss before its holder reads the clock again, and
// no write of theirs goes in stale.
func TestStress_pauseKeepAlive(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, srv testdsn.Server) {
		out := faultRun(t, srv.DSN, "-fault", "pause", "-keepalive", "-check", "-stall-fraction", "0")
		if !strings.Contains(out, "keep-alives that reported a lost lease: ") {
			t.Errorf("summary lacks the keep-alives' losses")
		}
	})
}

// The crash mode kills the process of the pid file and runs -restart-cmd;
// here the server is not the victim, so every name is acquired again.
func TestStress_crashMode(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, srv testdsn.Server) {
		victim := exec.Command("sleep", "300")
		if err := victim.Start(); err != nil {
			t.Fatal(err)
		}
		go victim.Wait() //nolint:errcheck // killed by the run
		t.Cleanup(func() { victim.Process.Kill() })
		dir := t.TempDir()
		pidFile := dir + "/victim.pid"
		if err := os.WriteFile(pidFile, []byte(strconv.Itoa(victim.Process.Pid)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		out := faultRun(t, srv.DSN, "-fault", "crash", "-kill-pid", pidFile, "-restart-cmd", "touch "+dir+"/restarted")
		if _, err := os.Stat(dir + "/restarted"); err != nil {
			t.Errorf("-restart-cmd did not run: %v", err)
		}
		if !strings.Contains(out, "result: fault=crash ") {
			t.Errorf("summary lacks the result line")
		}
	})
}

// -check is only worth its PASS if it fails writes made without Lock.Check:
// holders that stall past their lease then write an older fence over a
// newer one.
func TestStress_catchesUncheckedWrites(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, srv testdsn.Server) {
		status, out := stress(t, srv.DSN, "-procs", "2", "-goroutines", "3", "-names", "1",
			"-duration", "2s", "-ttl", "100ms", "-stall-fraction", "0.5", "-check", "-selftest-skip-check")
		if status != 1 {
			t.Fatalf("exit status %d, want 1", status)
		}
		if strings.Contains(out, "stale writes committed:   0 ") || !strings.Contains(out, "FAIL\n") {
			t.Errorf("summary does not report the stale writes")
		}
	})
}
