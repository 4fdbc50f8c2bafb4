package sqllocktest_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/sqllocktest"
)

// accounts is a test's own table, behind a Handler: writes made in a
// transaction apply when it commits.
type accounts struct {
	mu      sync.Mutex
	balance map[string]int64
}

func (a *accounts) handle(ctx context.Context, st sqllocktest.Statement) (sqllocktest.Answer, error) {
	switch {
	case strings.HasPrefix(st.Query, "UPDATE accounts SET balance = balance + ? WHERE id = ?"):
		delta, id := st.Args[0].(int64), st.Args[1].(string)
		apply := func() {
			a.mu.Lock()
			a.balance[id] += delta
			a.mu.Unlock()
		}
		if st.Tx == nil {
			apply()
		} else {
			st.Tx.OnCommit(apply)
		}
		return sqllocktest.Answer{RowsAffected: 1}, nil
	case st.Query == "SELECT balance FROM accounts WHERE id = ?":
		a.mu.Lock()
		defer a.mu.Unlock()
		return sqllocktest.Answer{Columns: []string{"balance"},
			Rows: [][]driver.Value{{a.balance[st.Args[0].(string)]}}}, nil
	}
	return sqllocktest.Answer{}, fmt.Errorf("accounts: unexpected %q", st.Query)
}

func (a *accounts) get(id string) int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.balance[id]
}

// credit is the code under test, usage.md's pattern: check the lease and
// write in one transaction, so the write lands only under a live lease.
func credit(ctx context.Context, db *sql.DB, l *sqllock.Lock, id string, amount int64) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := l.Check(ctx, tx); err != nil {
		return err // ErrNotHeld: write nothing
	}
	if _, err := tx.ExecContext(ctx, "UPDATE accounts SET balance = balance + ? WHERE id = ?", amount, id); err != nil {
		return err
	}
	return tx.Commit()
}

// A Lock.Check transaction that writes the test's own table runs on the
// fake with a Handler: the write lands when the lease is live, and is
// rolled back, never seen, when it is not. The clock is the test's: no
// sleeps.
func TestWithHandler_checkAndOwnWrites(t *testing.T) {
	acct := &accounts{balance: map[string]int64{}}
	rolledBack := 0
	srv := sqllocktest.New(t, sqllocktest.WithFrozenClock(time.Time{}),
		sqllocktest.WithHandler(func(ctx context.Context, st sqllocktest.Statement) (sqllocktest.Answer, error) {
			if st.Tx != nil {
				st.Tx.OnRollback(func() { rolledBack++ })
			}
			return acct.handle(ctx, st)
		}))
	db := srv.DB()
	locks, err := sqllock.New(db)
	if err != nil {
		t.Fatal(err)
	}
	defer locks.Close()
	ctx := context.Background()
	l, err := locks.TryAcquire(ctx, "account:A", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := credit(ctx, db, l, "A", 10); err != nil {
		t.Fatal(err)
	}
	if got := acct.get("A"); got != 10 {
		t.Fatalf("balance after a credit under a live lease: got %d, want 10", got)
	}
	var b int64
	if err := db.QueryRowContext(ctx, "SELECT balance FROM accounts WHERE id = ?", "A").Scan(&b); err != nil || b != 10 {
		t.Fatalf("SELECT through the Handler: got %d, %v; want 10", b, err)
	}

	// The lease runs out on the server's clock: the next credit writes
	// nothing.
	if err := srv.Advance(2 * time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := credit(ctx, db, l, "A", 10); !errors.Is(err, sqllock.ErrNotHeld) {
		t.Fatalf("credit after the lease expired: got %v, want ErrNotHeld", err)
	}
	if got := acct.get("A"); got != 10 {
		t.Errorf("balance after a refused credit: got %d, want 10", got)
	}

	// A write the transaction rolls back is not applied.
	l2, err := locks.TryAcquire(ctx, "account:B", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := l2.Check(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, "UPDATE accounts SET balance = balance + ? WHERE id = ?", int64(5), "B"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if got := acct.get("B"); got != 0 || rolledBack != 1 {
		t.Errorf("after a rollback: balance %d, rollbacks seen %d; want 0 and 1", got, rolledBack)
	}

	// sqllock's statements are the fake's, a semaphore's too, never the
	// Handler's; and SQL of the test's own that names the lock table is
	// refused, not handed to the Handler, which would fail it otherwise.
	slot, err := locks.Semaphore("exports", 2).TryAcquire(ctx, time.Minute)
	if err != nil || slot.Slot() != 1 {
		t.Fatalf("a semaphore with a Handler set: got %v, %v, want slot 1", slot, err)
	}
	if err := slot.Release(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = db.ExecContext(ctx, "UPDATE `sqllock` SET expires_at = UTC_TIMESTAMP(6) WHERE name = ?", "account:A")
	if err == nil || !strings.Contains(err.Error(), "not implemented") || !strings.Contains(err.Error(), "names the fake's table sqllock") {
		t.Errorf("own SQL on the lock table with a Handler set: got %v, want it refused as naming the fake's table", err)
	}
	// A server down fails the test's own statements too.
	srv.Down()
	if _, err := db.ExecContext(ctx, "UPDATE accounts SET balance = balance + ? WHERE id = ?", int64(1), "A"); err == nil {
		t.Error("own SQL while the server is down: got no error")
	}
	srv.Up()
}

// Your own SQL in a Lock.Check transaction runs on the fake through a
// Handler that keeps your table; the server's clock is the test's, so the
// lease runs out without a sleep.
func ExampleWithHandler() {
	acct := &accounts{balance: map[string]int64{}}
	srv, err := sqllocktest.NewServer( // in a test: srv := sqllocktest.New(t, ...)
		sqllocktest.WithFrozenClock(time.Time{}),
		sqllocktest.WithHandler(acct.handle))
	if err != nil {
		panic(err)
	}
	defer srv.Close()
	db := srv.DB()
	locks, err := sqllock.New(db)
	if err != nil {
		panic(err)
	}
	defer locks.Close()
	ctx := context.Background()

	l, err := locks.TryAcquire(ctx, "account:A", time.Minute)
	if err != nil {
		panic(err)
	}
	fmt.Println("live lease:", credit(ctx, db, l, "A", 10), acct.get("A"))
	_ = srv.Advance(time.Minute) // the lease runs out
	err = credit(ctx, db, l, "A", 10)
	fmt.Println("expired lease:", errors.Is(err, sqllock.ErrNotHeld), acct.get("A"))
	// Output:
	// live lease: <nil> 10
	// expired lease: true 10
}
