package main

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/exampletest"
	"github.com/sqllock/sqllock/internal/testdsn"
)

// The test binary is also the job: with asJobEnv set it runs main, as
// sqllock run would start it.
const asJobEnv = "NIGHTLY_TEST_AS_JOB"

func TestMain(m *testing.M) {
	if os.Getenv(asJobEnv) == "1" {
		main()
		os.Exit(0)
	}
	exampletest.Main(m)
}

// command builds cmd/sqllock, as a user would, and returns its path.
func command(t *testing.T) string {
	t.Helper()
	sqllock := filepath.Join(t.TempDir(), "sqllock")
	out, err := exec.Command("go", "build", "-o", sqllock, "github.com/sqllock/sqllock/cmd/sqllock").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return sqllock
}

func report(t *testing.T, db *sql.DB) (fence uint64, runs int) {
	t.Helper()
	if err := db.QueryRow("SELECT fence, runs FROM nightly_report WHERE id = 1").Scan(&fence, &runs); err != nil {
		t.Fatal(err)
	}
	return fence, runs
}

// Three hosts' cron fire the crontab line of main's comment at once: the
// job runs on one, with the lease's fence, and the others exit 75 in
// silence.
func TestSqllockRun_oneHostRuns(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		dsn, db := testdsn.Database(t, s)
		exampletest.Replica(t, dsn, "setup") // the lock table, as sqllock create-table would make it
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		var (
			wg     sync.WaitGroup
			mu     sync.Mutex
			status = map[int]int{}
		)
		sqllock := command(t)
		for range 3 {
			cmd := exec.CommandContext(ctx, sqllock, "run", "-q", "--min-hold", "10m", "nightly-report", "--", os.Args[0])
			cmd.Env = append(os.Environ(), "SQLLOCK_DSN="+dsn, asJobEnv+"=1")
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := cmd.Run()
				var exit *exec.ExitError
				if err != nil && !errors.As(err, &exit) {
					t.Error(err)
					return
				}
				mu.Lock()
				defer mu.Unlock()
				status[cmd.ProcessState.ExitCode()]++
				if stderr.Len() > 0 {
					t.Logf("exit %d, stderr: %s", cmd.ProcessState.ExitCode(), &stderr)
				}
			}()
		}
		wg.Wait()
		if status[0] != 1 || status[75] != 2 {
			t.Errorf("exit statuses: got %v, want one 0 and two 75", status)
		}
		if fence, runs := report(t, db); runs != 1 || fence == 0 {
			t.Errorf("report: got %d runs, fence %d; want one run, with its lease's fence", runs, fence)
		}
	})
}

// A run with a lower fence than the report's, as one whose host paused
// past its lease while a later run wrote, is refused and changes nothing.
func TestWriteReport_staleRunRefused(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		_, db := testdsn.Database(t, s)
		ctx := context.Background()
		if err := writeReport(ctx, db, 100); err != nil {
			t.Fatal(err)
		}
		if err := writeReport(ctx, db, 99); !errors.Is(err, errStale) {
			t.Errorf("the stale run: got %v, want errStale", err)
		}
		if err := writeReport(ctx, db, 100); err != nil {
			t.Errorf("the same run again: got %v, want nil", err)
		}
		if fence, runs := report(t, db); fence != 100 || runs != 2 {
			t.Errorf("report: got fence %d, %d runs; want fence 100, 2 runs", fence, runs)
		}
	})
}
