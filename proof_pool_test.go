package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"
)

// warmPool opens n connections of db and puts them back idle, so that
// what follows finds them there instead of dialling.
func warmPool(t *testing.T, db *sql.DB, n int) {
	t.Helper()
	db.SetMaxIdleConns(n)
	ctx := testCtx(t)
	conns := make([]*sql.Conn, n)
	for i := range conns {
		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = conn
	}
	for _, conn := range conns {
		conn.Close()
	}
}

// notProven returns the log records that say what the first use could
// not prove for want of connections.
func notProven(rec *recorder) []string {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var out []string
	for _, r := range rec.recs {
		if r.Level >= slog.LevelInfo && attr(r, "not_proven") != "" {
			out = append(out, r.Level.String()+" "+r.Message)
		}
	}
	return out
}

// A caller that holds a connection of a small pool in a transaction of its
// own when the Client's first use comes gets a Lock within its context, or,
// when it holds the pool's only connection, its context's end: the first
// use takes a connection beyond its first only when the pool has one to
// spare. What it could not prove without one it says in one log line, and
// a later acquire proves it, once the pool has two connections free. No
// proof row is left.
func TestClient_firstUse_callerHoldsAConnection(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipFakeFor(t, e, "it holds the caller's connection in a transaction of plain SQL")
		table := e.newTable(t)
		for _, limit := range []int{1, 2, 4} {
			t.Run(fmt.Sprintf("MaxOpenConns=%d", limit), func(t *testing.T) {
				db := e.openDB(t)
				db.SetMaxOpenConns(limit)
				warmPool(t, db, limit)
				rec, opt := newRecorder()
				c := e.client(t, db, table, opt)
				ctx, cancel := context.WithTimeout(testCtx(t), 30*time.Second)
				defer cancel()
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback()
				if _, err := tx.ExecContext(ctx, "SELECT 1"); err != nil {
					t.Fatal(err)
				}
				name := "job"
				if limit == 1 {
					// Nothing can run while the caller holds the only
					// connection: the call ends with the caller's context.
					short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
					defer cancel()
					_, err := c.TryAcquire(short, name, time.Minute)
					t.Logf("TryAcquire with the pool's only connection held: %v", err)
					if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ErrNotAcquired) {
						t.Fatalf("TryAcquire: got %v, want the caller's deadline and ErrNotAcquired", err)
					}
					assertErrContains(t, err, "every connection of the pool was in use, at its limit SetMaxOpenConns(1)")
				} else {
					l, err := c.TryAcquire(ctx, name, time.Minute)
					if err != nil {
						t.Fatalf("TryAcquire with one of %d connections held by the caller: got %v, want a Lock", limit, err)
					}
					if err := l.Release(ctx); err != nil {
						t.Fatal(err)
					}
				}
				switch got := notProven(rec); {
				case limit == 2 && len(got) != 1:
					t.Errorf("log: got %q, want one line saying what was not proven", got)
				case limit != 2 && len(got) != 0:
					t.Errorf("log: got %q, want none before the first use has run", got)
				}
				if err := tx.Rollback(); err != nil {
					t.Fatal(err)
				}
				// The caller's transaction has ended: what the first use
				// could not prove, a later acquire does.
				for range 2 {
					if err := mustAcquire(t, c, name, time.Minute).Release(ctx); err != nil {
						t.Fatal(err)
					}
				}
				got := notProven(rec)
				if len(got) > 1 {
					t.Errorf("log: got %q, want one line at the most", got)
				}
				if pending := c.eng.PoolProofPending(); pending != (limit == 1) {
					t.Errorf("after the caller's transaction: proof pending %v, want %v", pending, limit == 1)
				}
				if limit == 1 && len(got) != 1 {
					t.Errorf("log: got %q, want one line: a pool of one cannot prove the row lock", got)
				}
				if n := e.proofRows(t, table); n != 0 {
					t.Errorf("%d proof rows left, want 0", n)
				}
				if s := db.Stats(); s.InUse != 0 {
					t.Errorf("%d connections in use after the calls, want 0", s.InUse)
				}
			})
		}
	})
}

// A pool over two servers whose first use found no connection to spare
// beside the one the caller held is refused by the first acquire that
// finds two free, naming both servers, and then by every acquire, also
// while the pool has none to spare again.
func TestClient_firstUse_twoServersProvenLater(t *testing.T) {
	envs, table, db := balancedPool(t)
	db.SetMaxOpenConns(2)
	rec, opt := newRecorder()
	c := envs[0].client(t, db, table, opt)
	ctx := testCtx(t)
	tx, err := db.BeginTx(ctx, nil) // the first connection: the first server
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	l, err := c.TryAcquire(ctx, "job", time.Minute) // on the second server
	if err != nil {
		t.Fatalf("TryAcquire beside the caller's transaction: got %v, want a Lock", err)
	}
	if got := notProven(rec); len(got) != 1 {
		t.Errorf("log: got %q, want one line saying what was not proven", got)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	_, err = c.TryAcquire(ctx, "other", time.Minute)
	t.Logf("TryAcquire with two connections free: %v", err)
	wantTwoServers(t, err, envs)
	_ = l.Release(ctx) // on either server: the other may answer that it holds no such lease
	if tx, err = db.BeginTx(ctx, nil); err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	_, err = c.TryAcquire(ctx, "other", time.Minute)
	t.Logf("TryAcquire with one connection free: %v", err)
	wantTwoServers(t, err, envs)
	for _, e := range envs {
		if n := e.proofRows(t, table); n != 0 {
			t.Errorf("%s: %d proof rows left, want 0", e.server.Label, n)
		}
	}
}

// The first use of a Client on a small pool that other goroutines use
// without pause, while the caller holds a connection in a transaction,
// gets a Lock and leaves no proof row: a connection the pool's counts said
// was free but another goroutine took first holds it up only for a bound.
func TestClient_firstUse_busyPool(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipFakeFor(t, e, "it counts the proof's rows with plain SQL")
		table := e.newTable(t)
		db := e.openDB(t)
		db.SetMaxOpenConns(4)
		ctx, cancel := context.WithCancel(testCtx(t))
		defer cancel()
		var wg sync.WaitGroup
		defer wg.Wait()
		defer cancel()
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					_, _ = db.ExecContext(ctx, "DO 1")
				}
			}()
		}
		for i := range 3 {
			c := e.client(t, db, table)
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			l, err := c.TryAcquire(ctx, fmt.Sprint("job", i), time.Minute)
			if err != nil {
				t.Fatalf("TryAcquire on a busy pool: got %v, want a Lock", err)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			_ = tx.Rollback()
		}
		if n := e.proofRows(t, table); n != 0 {
			t.Errorf("%d proof rows left, want 0", n)
		}
	})
}
