// Command quickstart is one replica of a service whose nightly report must run
// on one replica at a time: README.md's first example, as written there.
package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock"
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
	ctx := context.Background()
	// Once, at deploy time or start-up; schema.sql does the same by hand.
	if err := locks.CreateTable(ctx); err != nil {
		log.Fatal(err)
	}

	lock, err := locks.TryAcquire(ctx, "nightly-report", time.Minute)
	if errors.Is(err, sqllock.ErrNotAcquired) {
		fmt.Println("not acquired: another replica runs the report")
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	defer lock.Release(ctx)
	fmt.Printf("acquired, fence %d: running the report\n", lock.Fence())
	time.Sleep(2 * time.Second) // the report; lock.Refresh renews the lease if it runs long
}
