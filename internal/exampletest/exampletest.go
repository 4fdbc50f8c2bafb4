// Package exampletest is what the tests of the programs under examples/ (and
// gocron/examples/) share: each test runs its program's own functions as
// several replicas of a service would, on a database of the test's own
// (testdsn.Database) on each server of SQLLOCK_TEST_DSN.
package exampletest

import (
	"context"
	"database/sql"
	"os"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/testdsn"
)

// Main is an example's TestMain: the driver's log silent, several tests at
// once on every server.
func Main(m *testing.M) {
	testdsn.QuietDriver()
	testdsn.Parallel()
	os.Exit(m.Run())
}

// Replica returns a pool and a Client of their own on dsn, as one replica
// of a service has, with the lock table created and the statements of
// schema run; holder describes the replica (sqllock.WithHolder). Both are
// closed when t ends.
func Replica(t testing.TB, dsn, holder string, schema ...string) (*sql.DB, *sqllock.Client) {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	locks, err := sqllock.New(db, sqllock.WithHolder(holder))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { locks.Close() }) // before the pool closes
	if err := locks.CreateTable(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, q := range schema {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	return db, locks
}

// Stale returns the Lock of a holder of name that stalled (taken through
// paused with a one-second lease and no keep-alive) and the Lock of next,
// which took name over once that lease had expired.
func Stale(t testing.TB, ctx context.Context, paused, next *sqllock.Client, name string) (stale, live *sqllock.Lock) {
	t.Helper()
	stale, err := paused.TryAcquire(ctx, name, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if live, err = next.Acquire(ctx, name, time.Minute); err != nil {
		t.Fatal(err)
	}
	return stale, live
}

// Fences reads a column of fences, as query selects it.
func Fences(t testing.TB, db *sql.DB, query string) []uint64 {
	t.Helper()
	rows, err := db.Query(query)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var fences []uint64
	for rows.Next() {
		var f uint64
		if err := rows.Scan(&f); err != nil {
			t.Fatal(err)
		}
		fences = append(fences, f)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return fences
}
