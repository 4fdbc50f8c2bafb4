package orm_test

import (
	"context"
	"database/sql"
	"errors"
	"log"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sqllock/sqllock"
)

// A service on sqlx takes its Client from the *sql.DB its sqlx.DB embeds,
// and checks its lease in the *sql.Tx its sqlx.Tx embeds.
func Example_sqlx() {
	ctx := context.Background()
	xdb, err := sqlx.Open("mysql", "app:secret@tcp(db:3306)/app")
	if err != nil {
		log.Fatal(err)
	}
	locks, err := sqllock.New(xdb.DB)
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close()
	lock, err := locks.TryAcquire(ctx, "nightly-report", time.Minute)
	if err != nil {
		log.Fatal(err) // sqllock.ErrNotAcquired: another replica runs it
	}
	defer lock.Release(ctx)

	tx, err := xdb.BeginTxx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	if err := lock.Check(ctx, tx.Tx); errors.Is(err, sqllock.ErrNotHeld) {
		log.Print("the lease was lost: another replica took the report over")
		return // write nothing
	} else if err != nil {
		log.Fatal(err)
	}
	_, err = tx.NamedExecContext(ctx, "UPDATE reports SET status = :status, fence = :fence WHERE id = 1",
		map[string]any{"status": "done", "fence": lock.Fence()})
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
}

func TestSqlx_fencedWrites(t *testing.T) {
	fencedWrites(t, func(t *testing.T, dsn, table string) (*sql.DB, writer) {
		xdb, err := sqlx.Open("mysql", dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { xdb.Close() })
		return xdb.DB, func(ctx context.Context, l *sqllock.Lock, who string) error {
			tx, err := xdb.BeginTxx(ctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback()
			if err := l.Check(ctx, tx.Tx); err != nil {
				return err
			}
			_, err = tx.NamedExecContext(ctx, "UPDATE `"+table+"` SET holder = :holder, fence = :fence WHERE id = 1",
				map[string]any{"holder": who, "fence": l.Fence()})
			if err != nil {
				return err
			}
			return tx.Commit()
		}
	})
}
