package gocronlock_test

import (
	"context"
	"database/sql"
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
	_, err = s.NewJob(gocron.DurationJob(time.Minute), gocron.NewTask(func() {
		log.Print("once a minute, on the leader")
	}))
	if err != nil {
		log.Fatal(err)
	}
	s.Start()
	defer s.Shutdown()
	time.Sleep(time.Hour)
}
