package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"
)

// The test binary stands in for the command: the parent re-executes
// os.Executable() with -child=N, which here is this binary, so TestMain runs
// the child instead of the tests. The processes are real, as a user's are.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && strings.HasPrefix(os.Args[1], "-child=") {
		os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

func testDSN(t *testing.T) string {
	t.Helper()
	dsn := os.Getenv("SQLLOCK_TEST_DSN")
	if dsn == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("CI is set but SQLLOCK_TEST_DSN is not")
		}
		t.Skip("set SQLLOCK_TEST_DSN (for example root@tcp(127.0.0.1:3306)/test) to run the stress check")
	}
	return dsn
}

func stress(t *testing.T, args ...string) (status int, out string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	status = run(ctx, append([]string{"-dsn", testDSN(t)}, args...), &stdout, &stderr)
	t.Logf("stdout:\n%s", stdout.String())
	if stderr.Len() > 0 {
		t.Logf("stderr:\n%s", stderr.String())
	}
	return status, stdout.String()
}

// A short run of the checker, as users run it: three processes contend on
// two names, a fifth of the holders stall past their lease.
func TestStress_short(t *testing.T) {
	record := t.TempDir() + "/run.txt"
	status, out := stress(t, "-procs", "3", "-goroutines", "4", "-names", "2",
		"-duration", "3s", "-ttl", "100ms", "-stall-fraction", "0.2", "-record", record)
	if status != 0 {
		t.Fatalf("exit status %d, want 0", status)
	}
	for _, want := range []string{"violations:               0\n", "duplicate fences:        0\n", "PASS\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q", want)
		}
	}
	if strings.Contains(out, "acquisitions:             0\n") {
		t.Errorf("no acquisitions: the run proved nothing")
	}
	if got, err := os.ReadFile(record); err != nil || string(got) != out {
		t.Errorf("-record file: got %q, %v, want the summary", got, err)
	}
}

// The checker is only worth its PASS if it fails a broken lock: children
// that work on names they were refused must be caught.
func TestStress_catchesBrokenLock(t *testing.T) {
	status, out := stress(t, "-procs", "2", "-goroutines", "3", "-names", "1",
		"-duration", "1s", "-ttl", "100ms", "-selftest-broken")
	if status != 1 {
		t.Fatalf("exit status %d, want 1", status)
	}
	if strings.Contains(out, "violations:               0\n") || !strings.Contains(out, "FAIL\n") {
		t.Errorf("summary does not report the violations")
	}
}

func TestStress_badFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-dsn", ""},
		{"-dsn", "x", "-procs", "0"},
		{"-dsn", "x", "-ttl", "0s"},
		{"-dsn", "x", "-stall-fraction", "2"},
		{"-nope"},
	} {
		var stderr bytes.Buffer
		if got := run(context.Background(), args, &bytes.Buffer{}, &stderr); got != 2 {
			t.Errorf("run(%q): got status %d, want 2 (stderr %q)", args, got, stderr.String())
		}
	}
}

func TestCheck(t *testing.T) {
	// live section of holder g on "n" from s to e with lease expiry x.
	rec := func(g int, fence uint64, s, e, x int64) record {
		return record{Goroutine: g, Name: "n", Fence: fence, Start: s, End: e, Expiry: x}
	}
	tests := []struct {
		name                       string
		records                    []record
		overlaps, dups, out, pairs int
	}{
		{"one after another", []record{rec(1, 10, 0, 5, 100), rec(2, 11, 5, 9, 100), rec(3, 12, 10, 20, 100)}, 0, 0, 0, 2},
		{"stalled past expiry, then taken over", []record{rec(1, 10, 0, 50, 10), rec(2, 11, 11, 20, 100)}, 0, 0, 0, 1},
		{"overlap while both live", []record{rec(1, 10, 0, 50, 100), rec(2, 11, 20, 30, 100)}, 1, 0, 0, 0},
		{"overlap with an earlier, longer section", []record{rec(1, 10, 0, 50, 100), rec(2, 11, 5, 6, 100), rec(3, 12, 40, 60, 100)}, 2, 0, 0, 0},
		{"fence twice", []record{rec(1, 10, 0, 5, 100), rec(2, 10, 6, 9, 100)}, 0, 1, 1, 1},
		{"fences out of order", []record{rec(1, 11, 0, 5, 100), rec(2, 10, 6, 9, 100)}, 0, 0, 1, 1},
		{"a section whose lease was gone at its start is not ordered", []record{rec(1, 11, 0, 5, 100), rec(2, 10, 6, 9, 3)}, 0, 0, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := check(tt.records)
			if len(f.Overlaps) != tt.overlaps || len(f.Duplicates) != tt.dups || len(f.OutOfOrder) != tt.out || f.OrderedPairs != tt.pairs {
				t.Errorf("got %d overlaps, %d duplicates, %d out of order, %d pairs (%q %q %q), want %d, %d, %d, %d",
					len(f.Overlaps), len(f.Duplicates), len(f.OutOfOrder), f.OrderedPairs, f.Overlaps, f.Duplicates, f.OutOfOrder,
					tt.overlaps, tt.dups, tt.out, tt.pairs)
			}
		})
	}
}
