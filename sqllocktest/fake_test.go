package sqllocktest_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/sqllocktest"
)

func newClient(t *testing.T, srv *sqllocktest.Server, opts ...sqllock.Option) *sqllock.Client {
	t.Helper()
	db := srv.DB()
	t.Cleanup(func() { db.Close() })
	c, err := sqllock.New(db, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// checkedTx returns a transaction on a pool of srv's in which l.Check has
// passed, rolled back when t ends unless committed first.
func checkedTx(t *testing.T, ctx context.Context, srv *sqllocktest.Server, l *sqllock.Lock) *sql.Tx {
	t.Helper()
	db := srv.DB()
	t.Cleanup(func() { db.Close() })
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback() })
	if err := l.Check(ctx, tx); err != nil {
		t.Fatalf("Check: %v", err)
	}
	return tx
}

// waitsForCommit runs take, a takeover of a row tx holds, which must wait
// for tx: it fails t if take returns within 50 ms, then commits tx and
// returns take's error.
func waitsForCommit(t *testing.T, tx *sql.Tx, take func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- take() }()
	select {
	case err := <-done:
		t.Fatalf("a takeover committed before the Check's transaction ended: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return <-done
}

func TestServer_leaseLifecycle(t *testing.T) {
	srv := sqllocktest.New(t, sqllocktest.WithFrozenClock(time.Time{}))
	a, b := newClient(t, srv, sqllock.WithHolder("a")), newClient(t, srv, sqllock.WithHolder("b"))
	ctx := ctxFor(t)

	l, err := a.TryAcquire(ctx, "job", time.Minute)
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	if _, err := b.TryAcquire(ctx, "job", time.Minute); !errors.Is(err, sqllock.ErrNotAcquired) {
		t.Fatalf("second TryAcquire: got %v, want ErrNotAcquired", err)
	}
	info, err := b.Inspect(ctx, "job")
	if err != nil || info.Holder != "a" || info.Fence != l.Fence() {
		t.Fatalf("Inspect: got %+v, %v; want holder a, fence %d", info, err, l.Fence())
	}
	if err := srv.Advance(59 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := l.Refresh(ctx, time.Minute); err != nil {
		t.Fatalf("Refresh: %v", err)
	}
	if err := srv.Advance(61 * time.Second); err != nil {
		t.Fatal(err)
	}
	l2, err := b.TryAcquire(ctx, "job", time.Minute)
	if err != nil {
		t.Fatalf("TryAcquire after expiry: %v", err)
	}
	if l2.Fence() <= l.Fence() {
		t.Fatalf("fence: got %d, want more than %d", l2.Fence(), l.Fence())
	}
	if err := l.Refresh(ctx, time.Minute); !errors.Is(err, sqllock.ErrNotHeld) {
		t.Fatalf("Refresh of the lost lease: got %v, want ErrNotHeld", err)
	}
	infos, err := a.List(ctx)
	if err != nil || len(infos) != 1 || infos[0].Holder != "b" {
		t.Fatalf("List: got %+v, %v", infos, err)
	}
	if err := l2.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if got := srv.Count("acquire"); got < 3 {
		t.Fatalf("Count(acquire): got %d, want at least 3", got)
	}
}

func TestServer_check(t *testing.T) {
	srv := sqllocktest.New(t)
	c := newClient(t, srv)
	ctx := ctxFor(t)
	l, err := c.TryAcquire(ctx, "job", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	tx := checkedTx(t, ctx, srv, l)
	// The Check's transaction holds the lease row: a takeover waits for it.
	if err := srv.Expire("job"); err != nil {
		t.Fatal(err)
	}
	other := newClient(t, srv)
	if err := waitsForCommit(t, tx, func() error {
		_, err := other.TryAcquire(ctx, "job", time.Minute)
		return err
	}); err != nil {
		t.Fatalf("takeover after commit: %v", err)
	}
	// A user's own SQL in the transaction is refused, by name.
	db := srv.DB()
	defer db.Close()
	tx, err = db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	_, err = tx.ExecContext(ctx, "UPDATE accounts SET balance = 0")
	if err == nil || !strings.Contains(err.Error(), "not implemented") || !strings.Contains(err.Error(), "UPDATE accounts") {
		t.Fatalf("own SQL: got %v, want a not-implemented error naming it", err)
	}
}

func TestServer_faults(t *testing.T) {
	srv := sqllocktest.New(t)
	c := newClient(t, srv)
	ctx := ctxFor(t)
	// A deadlock is retried by the library; a lost reply after the write
	// is settled by sending again with the same token.
	if err := srv.Inject(
		sqllocktest.Fault{Statement: "acquire", Err: sqllocktest.Deadlock},
		sqllocktest.Fault{Statement: "acquire", Err: sqllocktest.ErrLostConnection, Applied: true},
	); err != nil {
		t.Fatal(err)
	}
	before := srv.Count("acquire")
	l, err := c.TryAcquire(ctx, "job", time.Minute)
	if err != nil {
		t.Fatalf("TryAcquire through faults: %v", err)
	}
	if got := srv.Count("acquire") - before; got < 3 {
		t.Fatalf("acquires sent: got %d, want 3 or more (a deadlock, a lost reply, a retry)", got)
	}
	if err := srv.Inject(sqllocktest.Fault{Statement: "refresh", Err: sqllocktest.ServerError{Number: 1146, Message: "Table 'x' doesn't exist"}}); err != nil {
		t.Fatal(err)
	}
	if err := l.Refresh(ctx, time.Minute); err == nil || !strings.Contains(err.Error(), "1146") {
		t.Fatalf("Refresh: got %v, want error 1146", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

func TestServer_down(t *testing.T) {
	srv := sqllocktest.New(t)
	c := newClient(t, srv)
	ctx := ctxFor(t)
	l, err := c.TryAcquire(ctx, "job", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	srv.Down()
	if err := l.Refresh(ctx, time.Minute); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("Refresh while down: got %v, want connection refused", err)
	}
	srv.Up()
	if err := l.Refresh(ctx, time.Minute); err != nil {
		t.Fatalf("Refresh after Up: %v", err)
	}
}

func TestServer_badInput(t *testing.T) {
	srv := sqllocktest.New(t)
	for _, tc := range []struct {
		f    sqllocktest.Fault
		want string
	}{
		{sqllocktest.Fault{Statement: "acquire"}, "no Err"},
		{sqllocktest.Fault{Statement: "aquire", Err: sqllocktest.Deadlock}, `no statement is called "aquire"`},
		{sqllocktest.Fault{Err: errors.New("boom")}, "neither a ServerError nor ErrLostConnection"},
	} {
		if err := srv.Inject(tc.f); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Inject(%+v): got %v, want an error with %q", tc.f, err, tc.want)
		}
	}
	if err := srv.Advance(-time.Second); err == nil {
		t.Error("Advance(-1s): got nil, want an error")
	}
	if err := srv.Expire("nobody"); err == nil {
		t.Error("Expire of a name never taken: got nil, want an error")
	}
	if err := srv.CreateTable("bad name"); err == nil {
		t.Error("CreateTable(bad name): got nil, want an error")
	}
	if _, err := sqllocktest.NewServer(sqllocktest.WithLockWaitTimeout(0)); err == nil {
		t.Error("WithLockWaitTimeout(0): got nil, want an error")
	}
	if srv.Pending() != 0 {
		t.Errorf("Pending after refused Injects: got %d, want 0", srv.Pending())
	}
}

// Clients racing for one name on one fake: one holder at a time, and
// fences that grow.
func TestServer_race(t *testing.T) {
	srv := sqllocktest.New(t)
	ctx := ctxFor(t)
	var mu sync.Mutex
	holders := 0
	var last uint64
	var wg sync.WaitGroup
	for i := 0; i < 6; i++ {
		c := newClient(t, srv, sqllock.WithWakeups(4*(i%2)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 15; j++ {
				l, err := c.Acquire(ctx, "job", time.Minute)
				if err != nil {
					t.Errorf("Acquire: %v", err)
					return
				}
				mu.Lock()
				holders++
				if holders != 1 || l.Fence() <= last {
					t.Errorf("holders %d, fence %d after %d", holders, l.Fence(), last)
				}
				last = l.Fence()
				mu.Unlock()
				time.Sleep(time.Millisecond)
				mu.Lock()
				holders--
				mu.Unlock()
				if j%5 == 4 {
					c.Close() // releases, and ends this Client's turn
					return
				}
				if err := l.Release(ctx); err != nil {
					t.Errorf("Release: %v", err)
				}
			}
		}()
	}
	wg.Wait()
}
