package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// Benchmarks need a server, found as for the tests (server_test.go); without
// one they skip. Run them with
//
//	SQLLOCK_TEST_DSN='root@tcp(127.0.0.1:3306)/test' go test -run '^$' -bench . -benchmem
//
// or go run ./cmd/sqllock-bench, which runs them, prints ratios to the
// durable floor and writes bench/results.txt and bench/chart.svg.
//
// Every variant of a benchmark runs as a b.Run of the same benchmark, so
// that they are compared on one server under one load; on a shared machine
// only ratios within one run mean much.

func benchEnv(b *testing.B) *testEnv {
	b.Helper()
	requireServers(b)
	return newEnv(b, testServers[0], variants[0])
}

// benchTTL is the lease the benchmarks take: long enough that nothing
// expires during a run.
const benchTTL = 10 * time.Second

// scratchTable creates a table of the given columns for one benchmark and
// drops it when the benchmark ends. It returns the backtick-quoted name.
func (e *testEnv) scratchTable(b *testing.B, columns string) string {
	b.Helper()
	name := "`" + e.newTable(b) + "_x`"
	if _, err := e.db.Exec("CREATE TABLE " + name + " (" + columns + ") ENGINE=InnoDB"); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.db.Exec("DROP TABLE IF EXISTS " + name) })
	return name
}

func mustPrepare(b *testing.B, db interface {
	PrepareContext(context.Context, string) (*sql.Stmt, error)
}, query string) *sql.Stmt {
	b.Helper()
	st, err := db.PrepareContext(context.Background(), query)
	if err != nil {
		b.Fatalf("prepare %s: %v", query, err)
	}
	b.Cleanup(func() { st.Close() })
	return st
}

// BenchmarkPair is one uncontended acquire and release, the cost every lock
// user pays, beside what it can be compared with:
//
//   - floor: two prepared single-row UPDATE commits on a table of their
//     own, the least any durable acquire and release can cost (one round
//     trip and one redo-log flush each);
//   - sqllock: Client.TryAcquire then Lock.Release;
//   - driver: sqllock's own two prepared statements run directly with fixed
//     arguments, which is what the driver and database/sql cost (and
//     allocate) for them without the library;
//   - seedDeleteInsert and seedSelectUpsert: the two multi-statement recipes
//     people write by hand, over prepared statements;
//   - getLock: GET_LOCK and RELEASE_LOCK on one pinned connection, which
//     write nothing and hold no lease.
func BenchmarkPair(b *testing.B) {
	e := benchEnv(b)
	ctx := context.Background()

	b.Run("floor", func(b *testing.B) {
		t := e.scratchTable(b, "id INT PRIMARY KEY, v BIGINT NOT NULL")
		if _, err := e.db.Exec("INSERT INTO " + t + " VALUES (1, 0)"); err != nil {
			b.Fatal(err)
		}
		up := mustPrepare(b, e.db, "UPDATE "+t+" SET v = v + 1 WHERE id = ?")
		b.ReportAllocs()
		for b.Loop() {
			for range 2 {
				if _, err := up.ExecContext(ctx, 1); err != nil {
					b.Fatal(err)
				}
			}
		}
	})

	b.Run("sqllock", func(b *testing.B) {
		c := e.newClient(b)
		mustAcquire(b, c, "warm", time.Second).Release(ctx)
		b.ReportAllocs()
		for b.Loop() {
			l, err := c.TryAcquire(ctx, "bench", benchTTL)
			if err != nil {
				b.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})

	b.Run("driver", func(b *testing.B) {
		c := e.newClient(b)
		acquire := mustPrepare(b, e.db, c.sql[qAcquire])
		release := mustPrepare(b, e.db, c.sql[qRelease])
		const name, token = "bench", "0123456789abcdef0123456789abcdef"
		us := benchTTL.Microseconds()
		b.ReportAllocs()
		for b.Loop() {
			res, err := acquire.ExecContext(ctx, name, token, c.holder, us, name, token, c.holder, token, us)
			if err != nil {
				b.Fatal(err)
			}
			if id, _ := res.LastInsertId(); id <= 2 {
				b.Fatalf("acquire reported %d", id)
			}
			res, err = release.ExecContext(ctx, name, token)
			if err != nil {
				b.Fatal(err)
			}
			if n, _ := res.RowsAffected(); n != 1 {
				b.Fatalf("release deleted %d rows", n)
			}
		}
	})

	b.Run("seedDeleteInsert", func(b *testing.B) {
		r := newSeedRecipes(b, e)
		b.ReportAllocs()
		for b.Loop() {
			if err := r.deleteInsertPair(ctx, "bench"); err != nil {
				b.Fatal(err)
			}
		}
	})

	b.Run("seedSelectUpsert", func(b *testing.B) {
		r := newSeedRecipes(b, e)
		b.ReportAllocs()
		for b.Loop() {
			if err := r.selectUpsertPair(ctx, "bench"); err != nil {
				b.Fatal(err)
			}
		}
	})

	b.Run("getLock", func(b *testing.B) {
		conn, err := e.db.Conn(ctx)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { conn.Close() })
		get := mustPrepare(b, conn, "SELECT GET_LOCK(?, 0)")
		rel := mustPrepare(b, conn, "SELECT RELEASE_LOCK(?)")
		name := e.newTable(b) // a name no one else uses on this server
		b.ReportAllocs()
		for b.Loop() {
			var ok sql.NullInt64
			if err := get.QueryRowContext(ctx, name).Scan(&ok); err != nil || ok.Int64 != 1 {
				b.Fatalf("GET_LOCK: %v, %v", ok, err)
			}
			if err := rel.QueryRowContext(ctx, name).Scan(&ok); err != nil || ok.Int64 != 1 {
				b.Fatalf("RELEASE_LOCK: %v, %v", ok, err)
			}
		}
	})
}

// seedRecipes are the hand-written lease locks the seed documents describe,
// each over prepared statements on a one-row-per-name table of its own:
//
//   - delete-insert: delete the name's row if it has expired, insert a
//     row (a duplicate key means someone holds it), delete it to release;
//   - select-upsert: read the row, and if it is absent or expired write it
//     with an INSERT ... ON DUPLICATE KEY UPDATE, then release by setting
//     its expiry to now.
//
// They are here to be timed, not used: both check, then act, in separate
// statements, and the select-upsert one can give two callers the lock.
type seedRecipes struct {
	delExpired, insert, del *sql.Stmt
	sel, upsert, expire     *sql.Stmt
}

func newSeedRecipes(b *testing.B, e *testEnv) *seedRecipes {
	t := e.scratchTable(b, "name VARBINARY(255) PRIMARY KEY, owner VARBINARY(32) NOT NULL, expires_at DATETIME(6) NOT NULL")
	p := func(q string) *sql.Stmt { return mustPrepare(b, e.db, q) }
	return &seedRecipes{
		delExpired: p("DELETE FROM " + t + " WHERE name = ? AND expires_at < UTC_TIMESTAMP(6)"),
		insert:     p("INSERT INTO " + t + " (name, owner, expires_at) VALUES (?, ?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)"),
		del:        p("DELETE FROM " + t + " WHERE name = ? AND owner = ?"),
		sel:        p("SELECT owner, expires_at > UTC_TIMESTAMP(6) FROM " + t + " WHERE name = ?"),
		upsert: p("INSERT INTO " + t + " (name, owner, expires_at) VALUES (?, ?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)" +
			" ON DUPLICATE KEY UPDATE owner = ?, expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND"),
		expire: p("UPDATE " + t + " SET expires_at = UTC_TIMESTAMP(6) WHERE name = ? AND owner = ?"),
	}
}

func (r *seedRecipes) deleteInsertPair(ctx context.Context, name string) error {
	token, err := newToken()
	if err != nil {
		return err
	}
	if _, err := r.delExpired.ExecContext(ctx, name); err != nil {
		return err
	}
	if _, err := r.insert.ExecContext(ctx, name, token, benchTTL.Microseconds()); err != nil {
		return err // a duplicate key: held
	}
	_, err = r.del.ExecContext(ctx, name, token)
	return err
}

func (r *seedRecipes) selectUpsertPair(ctx context.Context, name string) error {
	token, err := newToken()
	if err != nil {
		return err
	}
	var owner string
	var live bool
	switch err := r.sel.QueryRowContext(ctx, name).Scan(&owner, &live); {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return err
	case live:
		return ErrNotAcquired
	}
	us := benchTTL.Microseconds()
	if _, err := r.upsert.ExecContext(ctx, name, token, us, token, us); err != nil {
		return err
	}
	_, err = r.expire.ExecContext(ctx, name, token)
	return err
}

// BenchmarkTryAcquireContended is goroutines racing for one name with
// TryAcquire alone: each attempt either takes the lock (and releases it) or
// is refused.
func BenchmarkTryAcquireContended(b *testing.B) {
	e := benchEnv(b)
	c := e.newClient(b)
	ctx := context.Background()
	var won atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(4)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			l, err := c.TryAcquire(ctx, "contended", benchTTL)
			if errors.Is(err, ErrNotAcquired) {
				continue
			}
			if err != nil {
				b.Error(err)
				return
			}
			won.Add(1)
			if err := l.Release(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(won.Load())/float64(b.N), "acquired/op")
}
