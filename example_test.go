package sqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/sqllock/sqllock"
)

// The examples need a server, so they have no Output lines: they compile
// everywhere and run nowhere by themselves.

func ExampleNew() {
	db, err := sql.Open("mysql", "app:secret@tcp(db:3306)/app")
	if err != nil {
		log.Fatal(err)
	}
	locks, err := sqllock.New(db, sqllock.WithTable("app_locks"), sqllock.WithHolder("worker-3"))
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close()
	// Once, at deploy time or start-up; schema.sql does the same by hand.
	if err := locks.CreateTable(context.Background()); err != nil {
		log.Fatal(err)
	}
}

func ExampleClient_TryAcquire() {
	ctx := context.Background()
	var locks *sqllock.Client // from sqllock.New

	lock, err := locks.TryAcquire(ctx, "nightly-report", time.Minute)
	if errors.Is(err, sqllock.ErrNotAcquired) {
		return // another replica runs tonight's report
	}
	if err != nil {
		log.Fatal(err)
	}
	// Release even if ctx is cancelled by then.
	defer lock.Release(context.WithoutCancel(ctx))
	fmt.Println("running the report under fence", lock.Fence())
}

func ExampleClient_Acquire() {
	var locks *sqllock.Client // from sqllock.New
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	lock, err := locks.Acquire(ctx, "schema-migration", time.Minute)
	if errors.Is(err, context.DeadlineExceeded) {
		log.Fatal("another replica held the migration lock for 30s") // err is also ErrNotAcquired
	}
	if err != nil {
		log.Fatal(err)
	}
	defer lock.Release(context.WithoutCancel(ctx))
}

func ExampleLock_Refresh() {
	ctx := context.Background()
	var lock *sqllock.Lock // from TryAcquire or Acquire, with a ttl of one minute

	err := lock.Refresh(ctx, time.Minute)
	switch {
	case errors.Is(err, sqllock.ErrNotHeld):
		log.Print("lease lost: stop the work") // someone took the name over
	case err != nil:
		// Not proof of loss: the lease stands until lock.ValidUntil().
		log.Printf("refresh failed, retry before %v: %v", lock.ValidUntil(), err)
	}
}

func ExampleClient_Inspect() {
	var locks *sqllock.Client // from sqllock.New
	info, err := locks.Inspect(context.Background(), "nightly-report")
	if err != nil {
		log.Fatal(err)
	}
	if info.Held {
		fmt.Printf("%s holds it for another %v (fence %d)\n", info.Holder, info.TTL, info.Fence)
	}
}
