// Command leader is one replica of a service of which one replica at a time
// leads: the leader appends an entry to a ledger every second, and a replica
// that lost the lead (paused, cut off from the database) can never write to
// it again. Run it on every replica with the same SQLLOCK_DSN.
package main

import (
	"context"
	"database/sql"
	"errors"
	"log"
	"os"
	"os/signal"
	"syscall"
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
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := locks.CreateTable(ctx); err != nil {
		log.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, createLedger); err != nil {
		log.Fatal(err)
	}
	if err := campaign(ctx, locks, db, 15*time.Second, time.Second); err != nil && ctx.Err() == nil {
		log.Fatal(err)
	}
}

// A fence is about 2^51 (the server's clock in microseconds): BIGINT UNSIGNED.
const createLedger = `CREATE TABLE IF NOT EXISTS ledger (
	id BIGINT AUTO_INCREMENT PRIMARY KEY,
	fence BIGINT UNSIGNED NOT NULL,
	entry VARCHAR(255) NOT NULL
)`

// campaign runs for the lead until ctx ends, and appends an entry every
// interval while this replica leads.
func campaign(ctx context.Context, locks *sqllock.Client, db *sql.DB, ttl, every time.Duration) error {
	return locks.Elect(ctx, "ledger-writer", ttl, sqllock.Callbacks{
		OnStartedLeading: func(ctx context.Context, l *sqllock.Lock) error {
			for {
				err := appendEntry(ctx, db, l, "tick")
				if errors.Is(err, sqllock.ErrNotHeld) || ctx.Err() != nil {
					return nil // the lead is lost: step down and campaign again
				}
				if err != nil {
					log.Printf("append: %v", err) // try again at the next tick
				}
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(every):
				}
			}
		},
		OnNewLeader: func(holder string) { log.Printf("%s leads", holder) },
	})
}

// appendEntry appends entry to the ledger if l's lease is still this
// replica's; otherwise it returns an error wrapping sqllock.ErrNotHeld.
func appendEntry(ctx context.Context, db *sql.DB, l *sqllock.Lock, entry string) error {
	return inLease(ctx, db, l, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO ledger (fence, entry) VALUES (?, ?)", l.Fence(), entry)
		return err
	})
}

// inLease runs write in a transaction that commits only while l's lease is
// this process's: Check keeps the lease row locked until the commit, so no
// other process can take the name over in between. When the lease is lost,
// it returns an error wrapping sqllock.ErrNotHeld and nothing is written.
func inLease(ctx context.Context, db *sql.DB, l *sqllock.Lock, write func(tx *sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() // after Commit, it does nothing
	if err := l.Check(ctx, tx); err != nil {
		return err
	}
	if err := write(tx); err != nil {
		return err
	}
	return tx.Commit()
}
