package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/exampletest"
	"github.com/sqllock/sqllock/internal/testdsn"
)

func TestMain(m *testing.M) { exampletest.Main(m) }

func reports(t *testing.T, db *sql.DB) (fences []uint64) {
	t.Helper()
	return exampletest.Fences(t, db, "SELECT fence FROM reports ORDER BY id")
}

// Three schedulers run the job every second, each run lasting 100 ms: the
// runs never overlap, and every one writes its report.
func TestNewScheduler_eachRunOnOneScheduler(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		dsn, db := testdsn.Database(t, s)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		var (
			mu              sync.Mutex
			now, most, runs int
		)
		job := func(ctx context.Context, l *sqllock.Lock) error {
			mu.Lock()
			now++
			most = max(most, now)
			mu.Unlock()
			defer func() { mu.Lock(); now--; mu.Unlock() }()
			time.Sleep(100 * time.Millisecond) // the job's work, so that runs on two schedulers would overlap
			err := nightlyReport(ctx, db, l)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				runs++
			case ctx.Err() == nil: // not cut short by the scheduler's shutdown
				t.Errorf("run under fence %d: %v", l.Fence(), err)
			}
			return err
		}
		var schedulers []gocron.Scheduler
		for i := range 3 {
			_, locks := exampletest.Replica(t, dsn, fmt.Sprintf("scheduler-%d", i), createReports)
			sch, err := newScheduler(ctx, locks, gocron.DurationJob(time.Second), job)
			if err != nil {
				t.Fatal(err)
			}
			schedulers = append(schedulers, sch)
		}
		for _, sch := range schedulers {
			sch.Start()
		}
		for len(reports(t, db)) < 4 && ctx.Err() == nil {
			time.Sleep(50 * time.Millisecond)
		}
		for _, sch := range schedulers {
			if err := sch.Shutdown(); err != nil {
				t.Error(err)
			}
		}
		fences := reports(t, db)
		mu.Lock()
		defer mu.Unlock()
		if len(fences) < 4 {
			t.Fatalf("got %d reports before the test's deadline, want 4", len(fences))
		}
		if most != 1 {
			t.Errorf("runs at once: got %d, want 1", most)
		}
		if len(fences) != runs {
			t.Errorf("got %d reports, want one for each of the %d runs that succeeded", len(fences), runs)
		}
		for i := 1; i < len(fences); i++ {
			if fences[i] < fences[i-1] {
				t.Errorf("report %d has fence %d after %d, want them in order", i+1, fences[i], fences[i-1])
			}
		}
	})
}

// A run whose lease expired, and which another scheduler took over, is
// refused: its report is not written, the other's is.
func TestNightlyReport_staleRunRefused(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		dsn, db := testdsn.Database(t, s)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, stalled := exampletest.Replica(t, dsn, "stalled", createReports)
		_, other := exampletest.Replica(t, dsn, "other", createReports)
		stale, run := exampletest.Stale(t, ctx, stalled, other, "gocron:nightly-report")
		if err := nightlyReport(ctx, db, stale); !errors.Is(err, sqllock.ErrNotHeld) {
			t.Errorf("the stalled run's report: got %v, want ErrNotHeld", err)
		}
		if err := nightlyReport(ctx, db, run); err != nil {
			t.Errorf("the run's report: got %v, want nil", err)
		}
		if got := reports(t, db); len(got) != 1 || got[0] != run.Fence() {
			t.Errorf("reports: got fences %v, want only the run's, %d", got, run.Fence())
		}
	})
}
