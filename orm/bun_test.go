package orm_test

import (
	"context"
	"database/sql"
	"errors"
	"log"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/mysqldialect"
)

// A service on bun takes its Client from the *sql.DB its bun.DB embeds, and
// checks its lease in the *sql.Tx its bun.Tx embeds.
func Example_bun() {
	ctx := context.Background()
	sqldb, err := sql.Open("mysql", "app:secret@tcp(db:3306)/app")
	if err != nil {
		log.Fatal(err)
	}
	bdb := bun.NewDB(sqldb, mysqldialect.New())
	locks, err := sqllock.New(bdb.DB)
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close()
	lock, err := locks.TryAcquire(ctx, "nightly-report", time.Minute)
	if err != nil {
		log.Fatal(err) // sqllock.ErrNotAcquired: another replica runs it
	}
	defer lock.Release(ctx)

	err = bdb.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
		if err := lock.Check(ctx, tx.Tx); err != nil {
			return err // sqllock.ErrNotHeld: bun rolls back, nothing is written
		}
		_, err := tx.NewUpdate().Table("reports").
			Set("status = ?", "done").Set("fence = ?", lock.Fence()).
			Where("id = ?", 1).Exec(ctx)
		return err
	})
	if errors.Is(err, sqllock.ErrNotHeld) {
		log.Print("the lease was lost: another replica took the report over")
	} else if err != nil {
		log.Fatal(err)
	}
}

func TestBun_fencedWrites(t *testing.T) {
	fencedWrites(t, func(t *testing.T, dsn, table string) (*sql.DB, writer) {
		sqldb, err := sql.Open("mysql", dsn)
		if err != nil {
			t.Fatal(err)
		}
		bdb := bun.NewDB(sqldb, mysqldialect.New())
		t.Cleanup(func() { bdb.Close() })
		return bdb.DB, func(ctx context.Context, l *sqllock.Lock, who string) error {
			return bdb.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
				if err := l.Check(ctx, tx.Tx); err != nil {
					return err
				}
				_, err := tx.NewUpdate().Table(table).
					Set("holder = ?", who).Set("fence = ?", l.Fence()).
					Where("id = ?", 1).Exec(ctx)
				return err
			})
		}
	})
}
