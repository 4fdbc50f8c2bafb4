// Command cron is one of several gocron schedulers, one a host, that share
// a nightly job: each night the job runs on one of them, and a scheduler
// that stalled past its lease cannot write the report after another took
// the job over. Run it on every host with the same SQLLOCK_DSN.
package main

import (
	"context"
	"database/sql"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/go-co-op/gocron/v2"
	_ "github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock"
	gocronlock "github.com/sqllock/sqllock/gocron"
)

func main() {
	db, err := sql.Open("mysql", os.Getenv("SQLLOCK_DSN")) // e.g. app:secret@tcp(db:3306)/app
	if err != nil {
		log.Fatal(err)
	}
	locks, err := sqllock.New(db)
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := locks.CreateTable(ctx); err != nil {
		log.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, createReports); err != nil {
		log.Fatal(err)
	}
	s, err := newScheduler(ctx, locks, gocron.CronJob("0 3 * * *", false), func(ctx context.Context, l *sqllock.Lock) error {
		return nightlyReport(ctx, db, l)
	})
	if err != nil {
		log.Fatal(err)
	}
	s.Start()
	<-ctx.Done()
	if err := s.Shutdown(); err != nil {
		log.Print(err)
	}
}

const createReports = `CREATE TABLE IF NOT EXISTS reports (
	id BIGINT AUTO_INCREMENT PRIMARY KEY,
	fence BIGINT UNSIGNED NOT NULL,
	made_at DATETIME(6) NOT NULL
)`

// newScheduler returns a scheduler that runs job at the times def gives,
// each time on one of the schedulers that share locks' table.
func newScheduler(ctx context.Context, locks *sqllock.Client, def gocron.JobDefinition, job func(ctx context.Context, l *sqllock.Lock) error) (gocron.Scheduler, error) {
	locker, err := gocronlock.NewLocker(ctx, locks) // fails if the table is missing
	if err != nil {
		return nil, err
	}
	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
	if err != nil {
		return nil, err
	}
	// The job's name is its lock's (gocron:nightly-report): name every job
	// made with Task. A run still under way at the next time skips it.
	_, err = s.NewJob(def, gocron.NewTask(locker.Task(job)),
		gocron.WithName("nightly-report"), gocron.WithSingletonMode(gocron.LimitModeReschedule))
	if err != nil {
		return nil, err
	}
	return s, nil
}

// nightlyReport writes the report in a transaction that commits only while
// the run's lease is this scheduler's.
func nightlyReport(ctx context.Context, db *sql.DB, l *sqllock.Lock) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() // after Commit, it does nothing
	if err := l.Check(ctx, tx); err != nil {
		return err // wraps sqllock.ErrNotHeld: another scheduler may run the job now
	}
	// ... the report's work and writes, in tx ...
	if _, err := tx.ExecContext(ctx, "INSERT INTO reports (fence, made_at) VALUES (?, NOW(6))", l.Fence()); err != nil {
		return err
	}
	return tx.Commit()
}
