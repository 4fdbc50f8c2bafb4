package orm_test

import (
	"context"
	"database/sql"
	"errors"
	"log"
	"testing"
	"time"

	"entgo.io/ent/dialect"
	entsql "entgo.io/ent/dialect/sql"
	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/testdsn"
	"github.com/sqllock/sqllock/orm/entlock"
)

// A service on ent opens the *sql.DB itself, gives it to ent with
// entsql.OpenDB and to sqllock, and begins its ent transaction with
// entlock.WithCheck: the transaction checks the lease before anything
// else. A generated client does the same with
// ent.NewClient(ent.Driver(drv)) and client.Tx(entlock.WithCheck(ctx, lock)).
func Example_ent() {
	ctx := context.Background()
	db, err := sql.Open("mysql", "app:secret@tcp(db:3306)/app")
	if err != nil {
		log.Fatal(err)
	}
	drv := entlock.Driver(entsql.OpenDB(dialect.MySQL, db))
	locks, err := sqllock.New(db)
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close()
	lock, err := locks.TryAcquire(ctx, "nightly-report", time.Minute)
	if err != nil {
		log.Fatal(err) // sqllock.ErrNotAcquired: another replica runs it
	}
	defer lock.Release(ctx)

	tx, err := drv.Tx(entlock.WithCheck(ctx, lock))
	if errors.Is(err, sqllock.ErrNotHeld) {
		log.Print("the lease was lost: another replica took the report over")
		return // the transaction is rolled back: write nothing
	} else if err != nil {
		log.Fatal(err)
	}
	query, args := entsql.Dialect(dialect.MySQL).Update("reports").
		Set("status", "done").Set("fence", lock.Fence()).
		Where(entsql.EQ("id", 1)).Query()
	if err := tx.Exec(ctx, query, args, nil); err != nil {
		tx.Rollback()
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
}

// The transaction is the one ent's generated client begins: client.Tx
// calls the driver's Tx, and every write of the *ent.Tx goes through it.
func TestEnt_fencedWrites(t *testing.T) {
	fencedWrites(t, func(t *testing.T, dsn, table string) (*sql.DB, writer) {
		db, err := sql.Open("mysql", dsn)
		if err != nil {
			t.Fatal(err)
		}
		drv := entlock.Driver(entsql.OpenDB(dialect.MySQL, db))
		t.Cleanup(func() { drv.Close() })
		return db, func(ctx context.Context, l *sqllock.Lock, who string) error {
			tx, err := drv.Tx(entlock.WithCheck(ctx, l))
			if err != nil {
				return err
			}
			query, args := entsql.Dialect(dialect.MySQL).Update(table).
				Set("holder", who).Set("fence", l.Fence()).
				Where(entsql.EQ("id", 1)).Query()
			if err := tx.Exec(ctx, query, args, nil); err != nil {
				return errors.Join(err, tx.Rollback())
			}
			return tx.Commit()
		}
	})
}

// Only a transaction begun with entlock.WithCheck runs Check: the others
// are the driver's own, whatever lease the process holds. A refused one
// has been rolled back, and its connection is free again.
func TestEnt_checkOnlyWithCheck(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, locks := newTables(t, s.DSN)
		db, err := sql.Open("mysql", s.DSN)
		if err != nil {
			t.Fatal(err)
		}
		drv := entlock.Driver(entsql.OpenDB(dialect.MySQL, db))
		t.Cleanup(func() { drv.Close() })
		c := newClient(t, db, locks, sqllock.WithLockDelay(0))
		l, err := c.TryAcquire(ctx, "report", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.ForceRelease(ctx, "report"); err != nil {
			t.Fatal(err)
		}

		tx, err := drv.Tx(ctx)
		if err != nil {
			t.Fatalf("Tx without WithCheck: got %v, want nil", err)
		}
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
		beginTx := drv.(interface {
			BeginTx(context.Context, *sql.TxOptions) (dialect.Tx, error)
		}).BeginTx
		for name, begin := range map[string]func(ctx context.Context) (dialect.Tx, error){
			"Tx":      drv.Tx,
			"BeginTx": func(ctx context.Context) (dialect.Tx, error) { return beginTx(ctx, &sql.TxOptions{}) },
		} {
			tx, err := begin(entlock.WithCheck(ctx, l))
			if !errors.Is(err, sqllock.ErrNotHeld) || tx != nil {
				t.Fatalf("%s with WithCheck after the lease's loss: got %v, %v, want nil, ErrNotHeld", name, tx, err)
			}
		}
		if n := db.Stats().InUse; n != 0 {
			t.Errorf("connections in use after the refused transactions: got %d, want 0", n)
		}
	})
}
