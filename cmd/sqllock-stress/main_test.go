package main

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/testdsn"
)

// The test binary stands in for the command: the parent re-executes
// os.Executable() with -child=N, which here is this binary, so TestMain runs
// the child instead of the tests. The processes are real, as a user's are.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && strings.HasPrefix(os.Args[1], "-child=") {
		os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
	}
	testdsn.QuietDriver() // not the children's, which keep the command's own log
	// One test at a time, each on every server at once: each runs three
	// processes or more against one table, whose first uses wait for each
	// other's gap locks; side by side with more, a wait passed a second
	// and met the session guard's clock check (1690).
	testdsn.Serial = true
	testdsn.Parallel()
	os.Exit(m.Run())
}

func stress(t *testing.T, dsn string, args ...string) (status int, out string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	status = run(ctx, append([]string{"-dsn", dsn}, args...), &stdout, &stderr)
	t.Logf("stdout:\n%s", stdout.String())
	if stderr.Len() > 0 {
		t.Logf("stderr:\n%s", stderr.String())
	}
	return status, stdout.String()
}

// A short run of the checker, as users run it: three processes contend on
// two names, a fifth of the holders stall past their lease.
func TestStress_short(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		record := t.TempDir() + "/run.txt"
		status, out := stress(t, s.DSN, "-procs", "3", "-goroutines", "4", "-names", "2",
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
	})
}

// The checker is only worth its PASS if it fails a broken lock: children
// that work on names they were refused must be caught.
func TestStress_catchesBrokenLock(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		status, out := stress(t, s.DSN, "-procs", "2", "-goroutines", "3", "-names", "1",
			"-duration", "1s", "-ttl", "100ms", "-selftest-broken")
		if status != 1 {
			t.Fatalf("exit status %d, want 1", status)
		}
		if strings.Contains(out, "violations:               0\n") || !strings.Contains(out, "FAIL\n") {
			t.Errorf("summary does not report the violations")
		}
	})
}

// With wake-up channels, and their connections killed while held and
// waited on, the checker still finds nothing wrong: the channel only wakes.
func TestStress_wakeupsCut(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		status, out := stress(t, s.DSN, "-procs", "3", "-goroutines", "2", "-names", "1",
			"-duration", "3s", "-ttl", "100ms", "-wakeups", "-cut-channels", "200ms")
		if status != 0 {
			t.Fatalf("exit status %d, want 0", status)
		}
		if !strings.Contains(out, "PASS\n") || strings.Contains(out, "wake-up channels killed:  0 ") || !strings.Contains(out, "wake-up channels killed:") {
			t.Errorf("summary: want PASS with channels killed")
		}
	})
}

func TestStress_badFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-dsn", ""},
		{"-dsn", "x", "-procs", "0"},
		{"-dsn", "x", "-ttl", "0s"},
		{"-dsn", "x", "-stall-fraction", "2"},
		{"-dsn", "x", "-kill-pid", "p", "-kill-cmd", "true"},
		{"-dsn", "x", "-duration", "1s", "-kill-pid", "p", "-kill-after", "2s"},
		{"-dsns", "x,,", "-dsn", ""},
		{"-dsn", "x", "-cut-channels", "1s"},
		{"-nope"},
	} {
		var stderr bytes.Buffer
		if got := run(context.Background(), args, &bytes.Buffer{}, &stderr); got != 2 {
			t.Errorf("run(%q): got status %d, want 2 (stderr %q)", args, got, stderr.String())
		}
	}
}

func TestCheck(t *testing.T) {
	// live section of holder g on "n" from s to e with lease expiry x
	// (times after an epoch of 1000: 0 means a time never read).
	const epoch = 1000
	rec := func(g int, fence uint64, s, e, x int64) record {
		return record{Goroutine: g, Name: "n", Fence: fence, Start: epoch + s, End: epoch + e, Expiry: epoch + x}
	}
	// cut is a section an error ended before it read the clock again.
	cut := func(g int, fence uint64, s, x int64) record {
		r := rec(g, fence, s, 0, x)
		r.End, r.Err = 0, "refresh: invalid connection"
		return r
	}
	// early is a section an error ended before it read the clock at all.
	early := func(g int, fence uint64) record {
		return record{Goroutine: g, Name: "n", Fence: fence, Err: "clock: connection refused"}
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
		{"a cut section is live until its lease expires", []record{cut(1, 10, 0, 50), rec(2, 11, 20, 30, 100)}, 1, 0, 0, 0},
		{"a cut section whose lease expired is not", []record{cut(1, 10, 0, 10), rec(2, 11, 20, 30, 100)}, 0, 0, 0, 1},
		{"a section cut before its start still has its fence checked", []record{early(1, 10), rec(2, 10, 20, 30, 100)}, 0, 1, 0, 0},
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

// A write whose outcome is unknown may or may not be in the resource: the
// check accepts either, and nothing else.
func TestCheckResource_unknownWrites(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, srv testdsn.Server) {
		db, err := sql.Open("mysql", srv.DSN)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		ctx := context.Background()
		cfg := config{table: "sqllock_stress_check_" + strconv.FormatInt(time.Now().UnixNano(), 36), names: 1}
		if err := createTables(ctx, db, cfg); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			for _, tb := range []string{cfg.table, resourceTable(cfg.table)} {
				db.Exec("DROP TABLE IF EXISTS `" + tb + "`")
			}
		})
		// The resource holds fence 7 after 3 writes.
		if _, err := db.Exec("UPDATE `"+resourceTable(cfg.table)+"` SET fence = 7, writes = 3 WHERE name = ?", nameOf(0)); err != nil {
			t.Fatal(err)
		}
		n := nameOf(0)
		tests := []struct {
			name    string
			records []record
			ok      bool
			lost    int64
		}{
			{"all known", []record{{Name: n, Fence: 5, Accepted: 2}, {Name: n, Fence: 7, Accepted: 1}}, true, 0},
			{"the last write's outcome unknown, applied", []record{{Name: n, Fence: 5, Accepted: 2}, {Name: n, Fence: 7, Maybe: 1}}, true, 0},
			{"an unknown write, not applied", []record{{Name: n, Fence: 5, Accepted: 2}, {Name: n, Fence: 7, Accepted: 1}, {Name: n, Fence: 9, Maybe: 1}}, true, 0},
			{"a write missing", []record{{Name: n, Fence: 5, Accepted: 2}}, false, 0},
			{"acknowledged writes lost", []record{{Name: n, Fence: 5, Accepted: 3}, {Name: n, Fence: 7, Accepted: 2}}, false, 2},
			{"a fence nobody wrote", []record{{Name: n, Fence: 5, Accepted: 2}, {Name: n, Fence: 6, Maybe: 1}}, false, 0},
			{"records claim a write the resource lacks", []record{{Name: n, Fence: 5, Accepted: 3}, {Name: n, Fence: 7, Accepted: 1}}, false, 1},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				bad, lost, _, err := checkResource(ctx, db, cfg, tt.records, nil)
				if err != nil {
					t.Fatal(err)
				}
				if got := len(bad) == 0; got != tt.ok {
					t.Errorf("got ok %v (%q), want %v", got, bad, tt.ok)
				}
				if lost != tt.lost {
					t.Errorf("lost writes: got %d, want %d", lost, tt.lost)
				}
			})
		}
	})
}

func TestErrClass(t *testing.T) {
	tests := []struct {
		err               error
		class             string
		conflict, movesOn bool
	}{
		{&mysql.MySQLError{Number: 1213, SQLState: [5]byte{'4', '0', '0', '0', '1'}, Message: "Deadlock found when trying to get lock; try restarting transaction"}, "Error 1213", true, false},
		{fmt.Errorf("sqllock: refresh %q: %w", "n", &mysql.MySQLError{Number: 3101, Message: "Plugin instructed the server to rollback the current transaction."}), "Error 3101", true, false},
		{&mysql.MySQLError{Number: 1180, Message: "Got error 149 - 'Lock deadlock; Retry transaction' during COMMIT"}, "Error 1180 (error 149 during COMMIT)", true, false},
		{&mysql.MySQLError{Number: 1180, Message: "Got error 28 \"No space left on device\" during COMMIT"}, "Error 1180 (error 28 during COMMIT)", false, false},
		{&mysql.MySQLError{Number: 1290, Message: "The MySQL server is running with the --super-read-only option so it cannot execute this statement"}, "Error 1290", false, true},
		{fmt.Errorf("acquire: %w", mysql.ErrInvalidConn), "invalid connection", false, true},
		{errors.New("dial tcp 127.0.0.1:3321: connect: connection refused"), "connection refused", false, true},
		{fmt.Errorf("refresh: %w", sqllock.ErrNotHeld), "not held", false, false},
	}
	for _, tt := range tests {
		if got := errClass(tt.err); got != tt.class {
			t.Errorf("errClass(%v): got %q, want %q", tt.err, got, tt.class)
		}
		if got := conflict(tt.err); got != tt.conflict {
			t.Errorf("conflict(%v): got %v, want %v", tt.err, got, tt.conflict)
		}
		if got := movesOn(tt.err); got != tt.movesOn {
			t.Errorf("movesOn(%v): got %v, want %v", tt.err, got, tt.movesOn)
		}
	}
}

// The failover mode kills the process of the pid file mid-run, and the
// workers go on over the DSNs given (here one server twice): every name is
// acquired again after the kill.
func TestStress_failoverMode(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, srv testdsn.Server) {
		victim := exec.Command("sleep", "300")
		if err := victim.Start(); err != nil {
			t.Fatal(err)
		}
		waited := make(chan error, 1)
		go func() { waited <- victim.Wait() }()
		t.Cleanup(func() { victim.Process.Kill() })
		pidFile := t.TempDir() + "/victim.pid"
		if err := os.WriteFile(pidFile, []byte(strconv.Itoa(victim.Process.Pid)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		status, out := stress(t, srv.DSN, "-dsn", srv.DSN, "-procs", "2", "-goroutines", "3", "-names", "2",
			"-duration", "3s", "-ttl", "100ms", "-kill-pid", pidFile, "-kill-after", "1s")
		if status != 0 {
			t.Fatalf("exit status %d, want 0", status)
		}
		for _, want := range []string{"2 DSN(s)", "names acquired after it: 2 of 2\n", "violations:               0\n", "PASS\n"} {
			if !strings.Contains(out, want) {
				t.Errorf("summary lacks %q", want)
			}
		}
		select {
		case err := <-waited:
			if err == nil || !strings.Contains(err.Error(), "killed") {
				t.Errorf("the process of the pid file ended with %v, want killed", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("the process of the pid file still runs")
		}
	})
}
