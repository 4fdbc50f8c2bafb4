package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func linearize(t *testing.T, args ...string) (status int, out string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	status = run(args, &stdout, &stderr)
	t.Logf("linearize %s: status %d\n%s%s", strings.Join(args, " "), status, stdout.String(), stderr.String())
	return status, stdout.String()
}

func writeHistory(t *testing.T, ops []op) string {
	t.Helper()
	var b bytes.Buffer
	for _, o := range ops {
		line, err := json.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(append(line, '\n'))
	}
	path := filepath.Join(t.TempDir(), "history.jsonl")
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// Two holders at once, as a broken lock would let in: the command fails
// with status 1, names the name, and writes the visualization.
func TestRun_twoHolders_fails(t *testing.T) {
	path := writeHistory(t, []op{
		{Kind: "acquire", Name: "x", Proc: 0, Fence: 1, Result: "ok", Call: 0, Return: 2 * ms, TTL: 100 * ms},
		{Kind: "acquire", Name: "x", Proc: 1, Fence: 2, Result: "ok", Call: 10 * ms, Return: 12 * ms, TTL: 100 * ms},
		{Kind: "write", Name: "x", Proc: 1, Fence: 2, Result: "ok", Call: 13 * ms, Return: 14 * ms},
		{Kind: "write", Name: "x", Proc: 0, Fence: 1, Result: "ok", Call: 13 * ms, Return: 15 * ms},
	})
	status, out := linearize(t, path)
	if status != exitIllegal || !strings.Contains(out, `NOT LINEARIZABLE`) || !strings.Contains(out, `["x"]`) {
		t.Errorf("got status %d, output %q; want %d, NOT LINEARIZABLE naming x", status, out, exitIllegal)
	}
	if fi, err := os.Stat(path + ".html"); err != nil || fi.Size() == 0 {
		t.Errorf("visualization: %v", err)
	}
}

func TestRun_oneHolderAtATime_passes(t *testing.T) {
	path := writeHistory(t, []op{
		{Kind: "acquire", Name: "x", Proc: 0, Fence: 1, Result: "ok", Call: 0, Return: 2 * ms, TTL: 100 * ms},
		{Kind: "write", Name: "x", Proc: 0, Fence: 1, Result: "ok", Call: 3 * ms, Return: 4 * ms},
		{Kind: "acquire", Name: "x", Proc: 1, Fence: 2, Result: "ok", Call: 10 * ms, Return: 102 * ms, TTL: 100 * ms},
		{Kind: "write", Name: "x", Proc: 1, Fence: 2, Result: "ok", Call: 103 * ms, Return: 104 * ms},
		{Kind: "write", Name: "x", Proc: 0, Fence: 1, Result: "rejected", Call: 105 * ms, Return: 106 * ms},
		{Kind: "read", Name: "x", Proc: -1, Fence: 2, Writes: 2, Result: "ok", Call: 200 * ms, Return: 201 * ms},
	})
	if status, out := linearize(t, path); status != 0 || !strings.Contains(out, "linearizable") {
		t.Errorf("got status %d, want 0", status)
	}
	if _, err := os.Stat(path + ".html"); !os.IsNotExist(err) {
		t.Errorf("a visualization was written for a linearizable history: %v", err)
	}
}

// A history the check cannot decide within -timeout fails with status 3:
// 30 writes of unknown outcome at once, then a read that none of their
// 2^30 subsets explains, which the search can only find out by trying
// them all.
func TestRun_timeout_unknownFails(t *testing.T) {
	ops := []op{{Kind: "acquire", Name: "x", Proc: 0, Fence: 30, Result: "ok", Call: 0, Return: ms, TTL: 100 * ms}}
	for i := range 30 {
		ops = append(ops, op{Kind: "write", Name: "x", Proc: 1, Goroutine: i, Fence: uint64(i + 1), Result: "unknown", Call: 2 * ms, Return: 3 * ms})
	}
	ops = append(ops, op{Kind: "read", Name: "x", Proc: -1, Fence: 30, Writes: 31, Result: "ok", Call: 4 * ms, Return: 5 * ms})
	path := writeHistory(t, ops)
	status, out := linearize(t, "-timeout", "200ms", path)
	if status != exitUnknown || !strings.Contains(out, "UNKNOWN") {
		t.Errorf("got status %d, want %d and UNKNOWN", status, exitUnknown)
	}
	if _, err := os.Stat(path + ".html"); err != nil {
		t.Errorf("visualization: %v", err)
	}
}

func TestRun_badInput(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.jsonl")
	os.WriteFile(bad, []byte(`{"k":"steal","n":"x","r":"ok"}`+"\n"), 0o644)
	empty := filepath.Join(dir, "empty.jsonl")
	os.WriteFile(empty, nil, 0o644)
	for _, args := range [][]string{{}, {filepath.Join(dir, "missing")}, {bad}, {empty}, {"-timeout", "0", bad}} {
		if status, _ := linearize(t, args...); status != exitUsage {
			t.Errorf("linearize %q: got status %d, want %d", args, status, exitUsage)
		}
	}
}

// A real run: sqllock-stress on each server of SQLLOCK_TEST_DSN writes a
// history, which the model accepts: single names with fenced writes, with
// writes after Lock.Check, sets, and semaphores. The first history with one
// acknowledged write dropped from the register, or one fence issued twice,
// it rejects.
func TestRun_stressHistory(t *testing.T) {
	bin := buildStress(t)
	for label, dsn := range testDSNs(t) {
		t.Run(label, func(t *testing.T) {
			for _, mode := range []struct {
				name string
				args []string
			}{
				{"fenced", nil},
				{"checked", []string{"-check"}},
				{"sets", []string{"-names", "4", "-set", "2"}},
				{"slots", []string{"-slots", "3", "-procs", "4"}},
			} {
				path := filepath.Join(t.TempDir(), "history.jsonl")
				args := append([]string{"-dsn", dsn, "-procs", "3", "-goroutines", "4", "-names", "2",
					"-duration", "2s", "-ttl", "100ms", "-stall-fraction", "0.2", "-table", "sqllock_linearize",
					"-history", path}, mode.args...)
				if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
					t.Fatalf("%s: sqllock-stress: %v\n%s", mode.name, err, out)
				}
				if status, out := linearize(t, path); status != 0 || !strings.Contains(out, "linearizable") {
					t.Fatalf("%s: the run's history: got status %d, want 0", mode.name, status)
				}
				if mode.name == "fenced" {
					mutate(t, path)
				}
			}
		})
	}
}

// mutate checks that the model rejects the history in path once an
// acknowledged write is dropped from the register, or a fence is issued
// twice.
func mutate(t *testing.T, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	for _, mutation := range []struct {
		name string
		f    func(lines []string) bool
	}{
		{"an acknowledged write lost", func(lines []string) bool {
			for i, l := range lines {
				var o op
				json.Unmarshal([]byte(l), &o)
				if o.Kind == "read" && o.Writes > 0 {
					o.Writes--
					b, _ := json.Marshal(o)
					lines[i] = string(b)
					return true
				}
			}
			return false
		}},
		{"a fence issued twice", func(lines []string) bool {
			first := map[string]uint64{}
			for i, l := range lines {
				var o op
				json.Unmarshal([]byte(l), &o)
				if o.Kind != "acquire" || o.Result != "ok" {
					continue
				}
				if f, ok := first[o.Name]; ok {
					// Every later operation of this holder carries the fence too.
					for j := i; j < len(lines); j++ {
						var p op
						json.Unmarshal([]byte(lines[j]), &p)
						if p.Name == o.Name && p.Fence == o.Fence && p.Proc == o.Proc && p.Goroutine == o.Goroutine {
							p.Fence = f
							b, _ := json.Marshal(p)
							lines[j] = string(b)
						}
					}
					return true
				}
				first[o.Name] = o.Fence
			}
			return false
		}},
	} {
		mutated := append([]string(nil), lines...)
		if !mutation.f(mutated) {
			t.Fatalf("%s: the history has nothing to change", mutation.name)
		}
		bad := filepath.Join(t.TempDir(), "mutated.jsonl")
		if err := os.WriteFile(bad, []byte(strings.Join(mutated, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if status, _ := linearize(t, bad); status != exitIllegal {
			t.Errorf("%s: got status %d, want %d", mutation.name, status, exitIllegal)
		}
	}
}

// A real run whose holders write without Lock.Check (the stress command's
// self-test), so that holders who stalled past their lease commit writes
// after the takeover: the model rejects its history on its own.
func TestRun_stressHistory_uncheckedWritesRejected(t *testing.T) {
	bin := buildStress(t)
	for label, dsn := range testDSNs(t) {
		t.Run(label, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "history.jsonl")
			out, err := exec.Command(bin, "-dsn", dsn, "-procs", "2", "-goroutines", "3", "-names", "1",
				"-duration", "2s", "-ttl", "100ms", "-stall-fraction", "0.5", "-table", "sqllock_linearize",
				"-check", "-selftest-skip-check", "-history", path).CombinedOutput()
			if err == nil {
				t.Fatalf("sqllock-stress passed a run without Lock.Check:\n%s", out)
			}
			if status, _ := linearize(t, path); status != exitIllegal {
				t.Errorf("got status %d, want %d", status, exitIllegal)
			}
		})
	}
}

// buildStress builds the stress command of the root module.
func buildStress(t *testing.T) string {
	t.Helper()
	testDSNs(t) // skip before building when no server is named
	bin := filepath.Join(t.TempDir(), "sqllock-stress")
	build := exec.Command("go", "build", "-o", bin, "./cmd/sqllock-stress")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// testDSNs returns the servers of SQLLOCK_TEST_DSN by label (cut as the
// root package's tests cut it: at a comma followed by a label and "="),
// skipping the test when it is unset, failing it when CI is set. The fake
// server is left out: the stress command needs a real one.
func testDSNs(t *testing.T) map[string]string {
	t.Helper()
	v := os.Getenv("SQLLOCK_TEST_DSN")
	if v == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("SQLLOCK_TEST_DSN is not set (CI is set: a missing server is a failure)")
		}
		t.Skip("set SQLLOCK_TEST_DSN to run sqllock-stress against a server (eval \"$(scripts/testdb env)\")")
	}
	out := map[string]string{}
	label := regexp.MustCompile(`^([A-Za-z][A-Za-z0-9._-]*)=(.*)$`)
	// Cut at each comma that a label and "=" follow.
	rest := v
	cut := regexp.MustCompile(`,[A-Za-z][A-Za-z0-9._-]*=`)
	for rest != "" {
		one := rest
		rest = ""
		if loc := cut.FindStringIndex(one); loc != nil {
			one, rest = one[:loc[0]], one[loc[0]+1:]
		}
		name := "server"
		if m := label.FindStringSubmatch(one); m != nil {
			name, one = m[1], m[2]
		}
		if one == "sqllocktest" {
			continue
		}
		out[name] = one
	}
	if len(out) == 0 {
		t.Skip("SQLLOCK_TEST_DSN names only the fake server, and sqllock-stress needs a real one")
	}
	return out
}
