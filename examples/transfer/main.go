// Command transfer moves money between two accounts. It holds both
// accounts' names, taken together as a set, so that no other transfer of
// either account runs meanwhile, and writes the balances only while both
// leases are still its own. Usage: transfer FROM TO AMOUNT
package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"strconv"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock"
)

func main() {
	if len(os.Args) != 4 {
		log.Fatal("usage: transfer FROM TO AMOUNT")
	}
	amount, err := strconv.ParseInt(os.Args[3], 10, 64)
	if err != nil || amount <= 0 {
		log.Fatalf("transfer: the amount must be a whole number above 0, not %q", os.Args[3])
	}
	db, err := sql.Open("mysql", os.Getenv("SQLLOCK_DSN")) // e.g. app:secret@tcp(db:3306)/app
	if err != nil {
		log.Fatal(err)
	}
	locks, err := sqllock.New(db)
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := locks.CreateTable(ctx); err != nil {
		log.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, createAccounts); err != nil {
		log.Fatal(err)
	}
	if err := transfer(ctx, locks, db, os.Args[1], os.Args[2], amount); err != nil {
		log.Fatal(err)
	}
}

const createAccounts = `CREATE TABLE IF NOT EXISTS accounts (
	name VARCHAR(64) PRIMARY KEY,
	balance BIGINT NOT NULL
)`

var errFunds = errors.New("insufficient funds")

// transfer waits until it holds both accounts' names, then moves amount.
func transfer(ctx context.Context, locks *sqllock.Client, db *sql.DB, from, to string, amount int64) error {
	// All or none, in one statement, and no deadlock with a transfer the
	// other way: the server takes the names in one order.
	l, err := locks.AcquireSet(ctx, []string{"account:" + from, "account:" + to}, 30*time.Second)
	if err != nil {
		return err
	}
	defer l.Release(ctx)
	return move(ctx, db, l, from, to, amount)
}

// move writes the new balances in a transaction that commits only while
// every lease of l is still this process's. The set keeps every other
// transfer of the two accounts out, so the balances read here stay as they
// are until the commit, whatever the program does in between.
func move(ctx context.Context, db *sql.DB, l *sqllock.Lock, from, to string, amount int64) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() // after Commit, it does nothing
	if err := l.Check(ctx, tx); err != nil {
		return err // wraps sqllock.ErrNotHeld: another process may hold the accounts now
	}
	var have, toHave int64
	if err := tx.QueryRowContext(ctx, "SELECT balance FROM accounts WHERE name = ?", from).Scan(&have); err != nil {
		return fmt.Errorf("account %s: %w", from, err)
	}
	if err := tx.QueryRowContext(ctx, "SELECT balance FROM accounts WHERE name = ?", to).Scan(&toHave); err != nil {
		return fmt.Errorf("account %s: %w", to, err)
	}
	if have < amount {
		return fmt.Errorf("%s has %d, not %d: %w", from, have, amount, errFunds)
	}
	if _, err := tx.ExecContext(ctx, "UPDATE accounts SET balance = ? WHERE name = ?", have-amount, from); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, "UPDATE accounts SET balance = ? WHERE name = ?", toHave+amount, to); err != nil {
		return err
	}
	return tx.Commit()
}
