package sqllock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// These tests run against a real server; see harness_servers_test.go for which.

// Point 6: names and tokens compare byte for byte.
func TestClient_names_byteForByte(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		c := e.newClient(t)
		ctx := testCtx(t)
		names := []string{"Job", "job", "job ", "jöb", "job\x00", "\xff\xfe", "\xff\xfd", strings.Repeat("n", MaxNameLen-1) + "a", strings.Repeat("n", MaxNameLen-1) + "b"}
		locks := make(map[string]*Lock)
		for _, n := range names {
			locks[n] = mustAcquire(t, c, n, 10*time.Second)
		}
		for _, n := range names {
			if got := inspect(t, c, n); got.Fence != locks[n].Fence() || !got.Held {
				t.Fatalf("Inspect(%q): got %+v, want fence %d held", n, got, locks[n].Fence())
			}
		}
		// A token that differs only in case is another owner's.
		l := locks["Job"]
		forged := newLock(c, l.name, strings.ToUpper(l.token), l.Fence(), l.ttl, l.ValidUntil())
		wantErrIs(t, forged.Release(ctx), ErrNotHeld)
		wantErrIs(t, forged.Refresh(ctx, time.Second), ErrNotHeld)
		for _, n := range names {
			if err := locks[n].Release(ctx); err != nil {
				t.Fatalf("Release(%q): %v", n, err)
			}
		}
	})
}

// Point 7: one round trip for each operation on a warm connection, whatever
// the DSN, counted by a proxy that sees every command the client sends.
func TestClient_oneRoundTrip(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		p := startProxy(t, e.serverAddr(t))
		db := e.openDBWith(t, func(c *mysql.Config) { c.Addr = p.Addr() })
		db.SetMaxOpenConns(1)
		c := e.client(t, db, table)
		ctx := testCtx(t)

		// Warm up: the first use of each statement prepares it.
		w := mustAcquire(t, c, "warm", time.Second)
		if err := w.Refresh(ctx, time.Second); err != nil {
			t.Fatal(err)
		}
		if err := w.Release(ctx); err != nil {
			t.Fatal(err)
		}

		ops := []struct {
			name string
			do   func(*Lock) (*Lock, error)
		}{
			{"TryAcquire", func(*Lock) (*Lock, error) { return c.TryAcquire(ctx, "one", time.Second) }},
			{"TryAcquire refused", func(l *Lock) (*Lock, error) {
				_, err := c.TryAcquire(ctx, "one", time.Second)
				if !errors.Is(err, ErrNotAcquired) {
					return l, fmt.Errorf("got %v, want ErrNotAcquired", err)
				}
				return l, nil
			}},
			{"Refresh", func(l *Lock) (*Lock, error) { return l, l.Refresh(ctx, time.Second) }},
			{"Release", func(l *Lock) (*Lock, error) { return l, l.Release(ctx) }},
		}
		var l *Lock
		for _, op := range ops {
			noRecheck(c)
			p.ResetCounts()
			var err error
			if l, err = op.do(l); err != nil {
				t.Fatalf("%s: %v", op.name, err)
			}
			if got := p.Commands(); p.CommandCount() != 1 || got[proxyComStmtExecute] != 1 {
				t.Fatalf("%s sent commands %v, want exactly one COM_STMT_EXECUTE", op.name, got)
			}
		}
	})
}

// Mutual exclusion under contention: several Clients on separate *sql.DBs,
// standing in for processes, do a non-atomic read-modify-write of a counter
// under the lock. A lost update, or a fence out of order, fails the test.
func TestIntegration_mutualExclusion_stress(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		const clients, goroutines, rounds = 4, 16, 12
		table := e.newTable(t)
		counter := table + "_counter"
		ctx := testCtx(t)
		e.vindexOn(t, counter, "id")
		if _, err := e.db.ExecContext(ctx, "CREATE TABLE `"+counter+"` (id INT PRIMARY KEY, n INT NOT NULL)"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.db.Exec("DROP TABLE IF EXISTS `" + counter + "`") })
		if _, err := e.db.ExecContext(ctx, "INSERT INTO `"+counter+"` (id, n) VALUES (1, 0)"); err != nil {
			t.Fatal(err)
		}
		cs := make([]*Client, clients)
		for i := range cs {
			cs[i] = e.client(t, e.openDB(t), table, WithRetry(ExponentialBackoff(time.Millisecond, 8*time.Millisecond)))
		}

		var (
			mu     sync.Mutex
			fences []uint64
		)
		var wg sync.WaitGroup
		errs := make(chan error, goroutines)
		for g := range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c := cs[g%clients]
				for range rounds {
					if err := criticalSection(ctx, c, counter, &mu, &fences); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		var n int
		if err := e.db.QueryRowContext(ctx, "SELECT n FROM `"+counter+"` WHERE id = 1").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != goroutines*rounds || len(fences) != goroutines*rounds {
			t.Fatalf("got counter %d after %d acquisitions, want %d", n, len(fences), goroutines*rounds)
		}
		for i := 1; i < len(fences); i++ {
			if fences[i] <= fences[i-1] {
				t.Fatalf("acquisition %d got fence %d after %d, want fences increasing in acquisition order", i, fences[i], fences[i-1])
			}
		}
	})
}

func criticalSection(ctx context.Context, c *Client, counter string, mu *sync.Mutex, fences *[]uint64) error {
	l, err := c.Acquire(ctx, "counter", 30*time.Second)
	if err != nil {
		return fmt.Errorf("Acquire: %w", err)
	}
	var n int
	if err := c.db.QueryRowContext(ctx, "SELECT n FROM `"+counter+"` WHERE id = 1").Scan(&n); err != nil {
		return err
	}
	mu.Lock()
	*fences = append(*fences, l.Fence())
	mu.Unlock()
	time.Sleep(100 * time.Microsecond) // widen the window a lost update needs
	if _, err := c.db.ExecContext(ctx, "UPDATE `"+counter+"` SET n = ? WHERE id = 1", n+1); err != nil {
		return err
	}
	return l.Release(ctx)
}
