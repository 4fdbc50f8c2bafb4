// Command ratelimit fetches the URLs it is given from a partner's API that
// allows three calls at once, across every replica of the service: each call
// holds one of the three slots of a semaphore kept in the database.
// Usage: ratelimit URL...
package main

import (
	"context"
	"database/sql"
	"io"
	"log"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock"
)

// slots is how many calls the partner allows at once, from all replicas.
const slots = 3

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
	var wg sync.WaitGroup
	for _, url := range os.Args[1:] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := limited(ctx, locks, func(ctx context.Context) error { return fetch(ctx, url) }); err != nil {
				log.Printf("%s: %v", url, err)
			}
		}()
	}
	wg.Wait()
}

// limited runs call while this process holds one of the partner's slots,
// waiting while every slot is held. The slot's lease is renewed while call
// runs and freed when it returns; the slot of a process that dies is free
// again when its lease lapses, 30 s later at most. call's context ends if
// the lease is lost.
func limited(ctx context.Context, locks *sqllock.Client, call func(ctx context.Context) error) error {
	l, err := locks.Semaphore("partner-api", slots).Acquire(ctx, 30*time.Second)
	if err != nil {
		return err
	}
	return l.Do(ctx, func(ctx context.Context, _ *sqllock.Lock) error { return call(ctx) })
}

func fetch(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	log.Printf("%s: %s, %d bytes", url, resp.Status, n)
	return err
}
