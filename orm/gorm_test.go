package orm_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// gormSQLTx returns the *sql.Tx of a gorm transaction: the ConnPool of its
// Statement, which is the *sql.Tx itself, or with PrepareStmt a
// *gorm.PreparedStmtTX around it.
func gormSQLTx(tx *gorm.DB) (*sql.Tx, error) {
	switch pool := tx.Statement.ConnPool.(type) {
	case *sql.Tx:
		return pool, nil
	case *gorm.PreparedStmtTX:
		if stx, ok := pool.Tx.(*sql.Tx); ok {
			return stx, nil
		}
	}
	return nil, fmt.Errorf("not in a gorm transaction on a *sql.Tx: its ConnPool is a %T", tx.Statement.ConnPool)
}

// A service on gorm takes its Client from gorm's *sql.DB, and checks its
// lease in the transaction its gorm writes go through.
func Example_gorm() {
	ctx := context.Background()
	gdb, err := gorm.Open(mysql.Open("app:secret@tcp(db:3306)/app"))
	if err != nil {
		log.Fatal(err)
	}
	db, err := gdb.DB()
	if err != nil {
		log.Fatal(err)
	}
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

	err = gdb.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		stx, err := gormSQLTx(tx)
		if err != nil {
			return err
		}
		if err := lock.Check(ctx, stx); err != nil {
			return err // sqllock.ErrNotHeld: gorm rolls back, nothing is written
		}
		return tx.Table("reports").Where("id = ?", 1).
			Updates(map[string]any{"status": "done", "fence": lock.Fence()}).Error
	})
	if errors.Is(err, sqllock.ErrNotHeld) {
		log.Print("the lease was lost: another replica took the report over")
	} else if err != nil {
		log.Fatal(err)
	}
}

func TestGorm_fencedWrites(t *testing.T) {
	for _, prepare := range []bool{false, true} {
		t.Run(fmt.Sprintf("PrepareStmt=%v", prepare), func(t *testing.T) {
			fencedWrites(t, func(t *testing.T, dsn, table string) (*sql.DB, writer) {
				gdb, err := gorm.Open(mysql.Open(dsn), &gorm.Config{
					PrepareStmt: prepare,
					Logger:      logger.Discard,
				})
				if err != nil {
					t.Fatal(err)
				}
				db, err := gdb.DB()
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { db.Close() })
				return db, func(ctx context.Context, l *sqllock.Lock, who string) error {
					return gdb.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
						stx, err := gormSQLTx(tx)
						if err != nil {
							return err
						}
						if err := l.Check(ctx, stx); err != nil {
							return err
						}
						return tx.Table(table).Where("id = ?", 1).
							Updates(map[string]any{"holder": who, "fence": l.Fence()}).Error
					})
				}
			})
		})
	}
}
