package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/testdsn"
)

// readProm parses the textfile at path; nil while there is none.
func readProm(t *testing.T, path string) map[string]float64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return parseText(t, string(b))
}

// Under cron a lost lease stays visible after the run: --metrics-textfile
// writes the lease held while the command runs, the lease lost at 0 from
// the start, and after a real loss (an operator's force release) the loss
// and the exit status 124, in a file the run leaves behind.
func TestRun_metricsTextfileLost(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		e := newEnv(t, s.DSN)
		prom := e.path("job.prom")
		_, wait := e.start("run", "--metrics-textfile", prom, "--ttl", "3s", "--kill-grace", "100ms", "job", "--",
			"sh", "-c", "touch "+e.path("started")+"; sleep 30")
		name := `{sqllock_lock_name="job"}`
		waitFor(t, 10*time.Second, "the textfile to show the lease held", func() bool {
			return readProm(t, prom)["sqllock_lease_held"+name] == 1
		})
		got := readProm(t, prom)
		if v, ok := got["sqllock_lease_lost_total"+name]; !ok || v != 0 {
			t.Errorf("lost while running: got %v (present %v), want 0", v, ok)
		}
		if _, ok := got["sqllock_run_exit_status"+name]; ok {
			t.Error("an exit status before the run ended")
		}
		if _, err := e.client().ForceRelease(context.Background(), "job"); err != nil {
			t.Fatal(err)
		}
		if r := wait(); r.status != exitLost {
			t.Fatalf("status %d, want %d", r.status, exitLost)
		}
		got = readProm(t, prom)
		for k, want := range map[string]float64{
			"sqllock_lease_lost_total" + name: 1,
			"sqllock_lease_held" + name:       0,
			"sqllock_run_exit_status" + name:  exitLost,
		} {
			if v, ok := got[k]; !ok || v != want {
				t.Errorf("%s after the run: got %v (present %v), want %v", k, v, ok, want)
			}
		}
		if end, start := got["sqllock_run_end_time_seconds"+name], got["sqllock_run_start_time_seconds"+name]; start <= 0 || end < start {
			t.Errorf("start %v, end %v: want 0 < start <= end", start, end)
		}
		// The temporary files were renamed, not left beside it.
		entries, _ := os.ReadDir(e.dir)
		for _, ent := range entries {
			if strings.Contains(ent.Name(), ".tmp") {
				t.Errorf("a temporary file left behind: %s", ent.Name())
			}
		}
	})
}

// A run that finds the name held writes its status 75, -q or not; a path
// it cannot write fails the run before it takes the name.
func TestRun_metricsTextfileHeldAndBadPath(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		e := newEnv(t, s.DSN)
		if _, err := e.client().TryAcquire(context.Background(), "job", time.Minute); err != nil {
			t.Fatal(err)
		}
		prom := e.path("job.prom")
		if r := e.run("run", "-q", "--metrics-textfile", prom, "job", "--", "true"); r.status != exitConflict || r.stderr != "" {
			t.Fatalf("held: got status %d, stderr %q; want %d and nothing", r.status, r.stderr, exitConflict)
		}
		if v := readProm(t, prom)[`sqllock_run_exit_status{sqllock_lock_name="job"}`]; v != exitConflict {
			t.Errorf("exit status in the textfile: got %v, want %d", v, exitConflict)
		}
		r := e.run("run", "--metrics-textfile", e.path("no/such/dir/x.prom"), "free", "--", "true")
		if r.status != exitUsage || !strings.Contains(r.stderr, "--metrics-textfile") {
			t.Errorf("bad path: got status %d, %q; want %d naming --metrics-textfile", r.status, r.stderr, exitUsage)
		}
		if e.inspect("free").Fence != 0 {
			t.Error("the name was taken")
		}
	})
}
