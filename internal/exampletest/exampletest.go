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
// of a service has, with the lock table created; holder describes the
// replica (sqllock.WithHolder). Both are closed when t ends.
func Replica(t testing.TB, dsn, holder string) (*sql.DB, *sqllock.Client) {
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
	return db, locks
}
