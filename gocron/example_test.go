package gocronlock_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"time"

	"github.com/go-co-op/gocron/v2"
	_ "github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock"
	gocronlock "github.com/sqllock/sqllock/gocron"
)

// Every scheduler process runs the same program; each run of a job runs on
// one of them. CreateTable creates the lock table if it is missing (or run
// schema.sql by hand), and NewLocker refuses to start without it.
func ExampleNewLocker() {
	ctx := context.Background()
	db, err := sql.Open("mysql", "app:secret@tcp(db:3306)/app")
	if err != nil {
		log.Fatal(err)
	}
	locks, err := sqllock.New(db)
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close() // frees the names this process still holds
	if err := locks.CreateTable(ctx); err != nil {
		log.Fatal(err)
	}
	locker, err := gocronlock.NewLocker(ctx, locks)
	if err != nil {
		log.Fatal(err) // the table is missing or differs from schema.sql
	}
	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
	if err != nil {
		log.Fatal(err)
	}
	_, err = s.NewJob(gocron.DurationJob(time.Second), gocron.NewTask(func() {
		log.Print("once a second, on one of the schedulers")
	}), gocron.WithName("tick")) // the lock's name: gocron:tick
	if err != nil {
		log.Fatal(err)
	}
	s.Start()
	defer s.Shutdown()
	time.Sleep(time.Minute)
}

// A job made with Task gets the Lock of its run, and passes its fence to
// what it writes: here a row that takes a write only with a fence at least
// the highest it has seen, in the same statement. A scheduler that stalled
// past its lease while another took the job over is then refused, and its
// context has ended. (For data in the lock's own database,
// [sqllock.Lock.Check] in the write's transaction does it without a fence
// column.)
func ExampleLocker_Task() {
	ctx := context.Background()
	db, err := sql.Open("mysql", "app:secret@tcp(db:3306)/app")
	if err != nil {
		log.Fatal(err)
	}
	locks, err := sqllock.New(db)
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close()
	locker, err := gocronlock.NewLocker(ctx, locks)
	if err != nil {
		log.Fatal(err)
	}
	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
	if err != nil {
		log.Fatal(err)
	}
	task := locker.Task(func(ctx context.Context, l *sqllock.Lock) error {
		total, err := sumInvoices(ctx, db) // long: the lease is renewed meanwhile
		if err != nil {
			return err
		}
		// written_at changes the row even when the total has not, so that
		// one row affected means the fence was taken.
		res, err := db.ExecContext(ctx,
			"UPDATE daily_total SET total = ?, fence = ?, written_at = NOW(6) WHERE id = 1 AND fence <= ?",
			total, l.Fence(), l.Fence())
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("fence %d refused: a later run has written", l.Fence())
		}
		return nil
	})
	// Name the job: its name is the lock's, gocron:daily-total.
	_, err = s.NewJob(gocron.DurationJob(time.Minute), gocron.NewTask(task), gocron.WithName("daily-total"))
	if err != nil {
		log.Fatal(err)
	}
	s.Start()
	defer s.Shutdown()
	time.Sleep(time.Hour)
}

func sumInvoices(ctx context.Context, db *sql.DB) (total int64, err error) {
	err = db.QueryRowContext(ctx, "SELECT COALESCE(SUM(amount), 0) FROM invoices WHERE day = CURRENT_DATE").Scan(&total)
	return total, err
}

// With an Elector, the scheduler that leads runs every job, and the others
// none; when it stops, another takes the lead within about a ttl.
func ExampleNewElector() {
	ctx := context.Background()
	db, err := sql.Open("mysql", "app:secret@tcp(db:3306)/app")
	if err != nil {
		log.Fatal(err)
	}
	locks, err := sqllock.New(db)
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close()
	if err := locks.CreateTable(ctx); err != nil {
		log.Fatal(err)
	}
	elector, err := gocronlock.NewElector(ctx, locks, "billing-scheduler", gocronlock.WithTTL(15*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer elector.Close() // gives the lead up at once
	s, err := gocron.NewScheduler(gocron.WithDistributedElector(elector))
	if err != nil {
		log.Fatal(err)
	}
	// Task gives the job the lead's Lock, for its fence.
	_, err = s.NewJob(gocron.DurationJob(time.Minute), gocron.NewTask(elector.Task(func(ctx context.Context, l *sqllock.Lock) error {
		log.Printf("once a minute, on the leader (fence %d)", l.Fence())
		return nil
	})), gocron.WithName("tick"))
	if err != nil {
		log.Fatal(err)
	}
	s.Start()
	defer s.Shutdown()
	time.Sleep(time.Hour)
}
