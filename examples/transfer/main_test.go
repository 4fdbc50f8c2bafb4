package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/exampletest"
	"github.com/sqllock/sqllock/internal/testdsn"
)

func TestMain(m *testing.M) { exampletest.Main(m) }

var accounts = []string{"alice", "bob", "carol", "dave"}

const opening = 1000 // each account's balance at the start

// bank makes main's tables on a database of the test's own, opens the
// accounts and returns a Client per replica, on a pool of its own.
func bank(t *testing.T, s testdsn.Server, replicas int) (*sql.DB, []*sqllock.Client) {
	t.Helper()
	dsn, db := testdsn.Database(t, s)
	if _, err := db.Exec(createAccounts); err != nil {
		t.Fatal(err)
	}
	for _, a := range accounts {
		if _, err := db.Exec("INSERT INTO accounts (name, balance) VALUES (?, ?)", a, opening); err != nil {
			t.Fatal(err)
		}
	}
	var clients []*sqllock.Client
	for i := range replicas {
		_, locks := exampletest.Replica(t, dsn, fmt.Sprintf("replica-%d", i))
		clients = append(clients, locks)
	}
	return db, clients
}

func balances(t *testing.T, db *sql.DB) map[string]int64 {
	t.Helper()
	rows, err := db.Query("SELECT name, balance FROM accounts")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[string]int64{}
	for rows.Next() {
		var name string
		var balance int64
		if err := rows.Scan(&name, &balance); err != nil {
			t.Fatal(err)
		}
		got[name] = balance
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return got
}

// Three replicas, two goroutines each, make random transfers between four
// accounts, each reading both balances and writing them back. No money is
// made or lost, and no account goes below zero.
func TestTransfer_moneyConserved(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		db, clients := bank(t, s, 3)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		var wg sync.WaitGroup
		errs := make(chan error, 2*len(clients))
		for _, locks := range clients {
			for range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range 25 {
						i, j := rand.IntN(len(accounts)), rand.IntN(len(accounts)-1)
						if j >= i {
							j++ // another account than i
						}
						err := transfer(ctx, locks, db, accounts[i], accounts[j], 1+rand.Int64N(300))
						if err != nil && !errors.Is(err, errFunds) {
							errs <- err
							return
						}
					}
				}()
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		got, total := balances(t, db), int64(0)
		for name, b := range got {
			total += b
			if b < 0 {
				t.Errorf("%s: got balance %d, want at least 0", name, b)
			}
		}
		if want := int64(opening * len(accounts)); total != want {
			t.Errorf("total: got %d, want %d (balances %v)", total, want, got)
		}
	})
}

// A transfer whose set expired, and was taken by another transfer, is
// refused and writes nothing; the other's goes through.
func TestMove_staleSetRefused(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		db, clients := bank(t, s, 2)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		names := []string{"account:alice", "account:bob"}
		// The first transfer holds both names, with no keep-alive: as if paused.
		stale, err := clients[0].TryAcquireSet(ctx, names, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		next, err := clients[1].AcquireSet(ctx, names, time.Minute) // once the stale set expired
		if err != nil {
			t.Fatal(err)
		}
		if err := move(ctx, db, stale, "alice", "bob", 100); !errors.Is(err, sqllock.ErrNotHeld) {
			t.Errorf("the stale transfer: got %v, want ErrNotHeld", err)
		}
		if err := move(ctx, db, next, "bob", "alice", 10); err != nil {
			t.Errorf("the live transfer: got %v, want nil", err)
		}
		got := balances(t, db)
		if got["alice"] != opening+10 || got["bob"] != opening-10 {
			t.Errorf("got alice %d, bob %d; want %d and %d: the live transfer only", got["alice"], got["bob"], opening+10, opening-10)
		}
	})
}
