package orm_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"os"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/testdsn"
)

func TestMain(m *testing.M) {
	testdsn.Parallel() // several tests at once on every server
	os.Exit(m.Run())
}

// A writer sets row 1 of the test's data table to who and l's fence, in
// one transaction of its ORM that calls l.Check first; it returns Check's
// error as it is, and leaves the row as it was when it returns an error.
type writer func(ctx context.Context, l *sqllock.Lock, who string) error

// An opener opens an ORM on dsn, closed when the test ends, and returns the
// *sql.DB the ORM's handle gives, for a Client, and a writer to table.
type opener func(t *testing.T, dsn, table string) (*sql.DB, writer)

// fencedWrites runs one scenario through open's ORM on every server: a
// holder's checked write commits; once another holder has taken the name,
// the first holder's write is refused with ErrNotHeld and changes nothing,
// and the new holder's commits.
func fencedWrites(t *testing.T, open opener) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		data, locks := newTables(t, s.DSN)
		dbA, writeA := open(t, s.DSN, data)
		dbB, writeB := open(t, s.DSN, data)
		a := newClient(t, dbA, locks)
		// The other replica evicts at once: a stale holder without waiting.
		b := newClient(t, dbB, locks, sqllock.WithLockDelay(0))

		la, err := a.TryAcquire(ctx, "report", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if err := writeA(ctx, la, "a"); err != nil {
			t.Fatalf("the holder's write: got %v, want nil", err)
		}
		wantRow(t, dbA, data, "a", la.Fence())

		if _, err := b.ForceRelease(ctx, "report"); err != nil {
			t.Fatal(err)
		}
		lb, err := b.TryAcquire(ctx, "report", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if err := writeA(ctx, la, "stale a"); !errors.Is(err, sqllock.ErrNotHeld) {
			t.Fatalf("the stale holder's write: got %v, want ErrNotHeld", err)
		}
		wantRow(t, dbA, data, "a", la.Fence())

		if err := writeB(ctx, lb, "b"); err != nil {
			t.Fatalf("the new holder's write: got %v, want nil", err)
		}
		wantRow(t, dbA, data, "b", lb.Fence())
		if lb.Fence() <= la.Fence() {
			t.Errorf("fences: got %d after %d, want a higher one", lb.Fence(), la.Fence())
		}
	})
}

// newTables creates a data table of one row (id 1) and names a lock
// table, both of the test's own, dropped when the test ends.
func newTables(t *testing.T, dsn string) (data, locks string) {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	suffix := hex.EncodeToString(b[:])
	data, locks = "orm_data_"+suffix, "orm_locks_"+suffix
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	// Registered first, so it runs last: after the Clients have closed.
	t.Cleanup(func() {
		defer db.Close()
		for _, table := range []string{data, locks} {
			if _, err := db.Exec("DROP TABLE IF EXISTS `" + table + "`"); err != nil {
				t.Errorf("drop %s: %v", table, err)
			}
		}
	})
	for _, stmt := range []string{
		"CREATE TABLE `" + data + "` (id INT PRIMARY KEY, holder VARCHAR(64) NOT NULL, fence BIGINT UNSIGNED NOT NULL)",
		"INSERT INTO `" + data + "` VALUES (1, '', 0)",
	} {
		if _, err := db.Exec(stmt); err != nil {
			t.Fatal(err)
		}
	}
	return data, locks
}

// newClient returns a Client on db keeping its leases in table, which it
// creates if it is missing, closed when the test ends.
func newClient(t *testing.T, db *sql.DB, table string, opts ...sqllock.Option) *sqllock.Client {
	t.Helper()
	c, err := sqllock.New(db, append(opts, sqllock.WithTable(table))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := c.CreateTable(context.Background()); err != nil {
		t.Fatal(err)
	}
	return c
}

// wantRow fails t unless row 1 of table holds who and fence.
func wantRow(t *testing.T, db *sql.DB, table, who string, fence uint64) {
	t.Helper()
	var gotWho string
	var gotFence uint64
	err := db.QueryRow("SELECT holder, fence FROM `"+table+"` WHERE id = 1").Scan(&gotWho, &gotFence)
	if err != nil {
		t.Fatal(err)
	}
	if gotWho != who || gotFence != fence {
		t.Fatalf("row 1: got %q with fence %d, want %q with %d", gotWho, gotFence, who, fence)
	}
}
