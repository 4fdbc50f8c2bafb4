package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock/internal/fault"
)

// These tests run against a real server; see server_test.go for which.

func mustAcquire(t testing.TB, c *Client, name string, ttl time.Duration) *Lock {
	t.Helper()
	l, err := c.TryAcquire(testCtx(t), name, ttl)
	if err != nil {
		t.Fatalf("TryAcquire(%q): %v", name, err)
	}
	return l
}

func wantErrIs(t testing.TB, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("got %v, want an error wrapping %v", err, target)
	}
}

// checkedTx begins a transaction on c's pool and runs l.Check in it, as a
// holder does before its protected writes: l's lease row stays locked
// until the transaction ends. The test's end rolls it back, if the test
// has not ended it.
func checkedTx(t testing.TB, c *Client, l *Lock) *sql.Tx {
	t.Helper()
	ctx := testCtx(t)
	tx, err := c.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback() })
	if err := l.Check(ctx, tx); err != nil {
		t.Fatalf("Check: %v", err)
	}
	return tx
}

func inspect(t testing.TB, c *Client, name string) Info {
	t.Helper()
	info, err := c.Inspect(testCtx(t), name)
	if err != nil {
		t.Fatalf("Inspect(%q): %v", name, err)
	}
	return info
}

// Point 1: one statement takes a free name, takes over an expired lease,
// leaves a live one alone; every call draws a fresh token.
func TestClient_TryAcquire(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		a, b := e.twoClients(t)
		ctx := testCtx(t)

		la := mustAcquire(t, a, "job", 10*time.Second)
		if la.Fence() == 0 {
			t.Fatalf("got fence 0, want a positive fence")
		}
		_, err := b.TryAcquire(ctx, "job", 10*time.Second)
		wantErrIs(t, err, ErrNotAcquired)
		// Not even its own Client gets the name twice: every call is a new owner.
		_, err = a.TryAcquire(ctx, "job", 10*time.Second)
		wantErrIs(t, err, ErrNotAcquired)
		if got := inspect(t, a, "job"); got.Holder != "a" || got.Fence != la.Fence() || !got.Held {
			t.Fatalf("after failed attempts: got %+v, want a's lease untouched", got)
		}

		short := mustAcquire(t, a, "short", 30*time.Millisecond)
		time.Sleep(60 * time.Millisecond)
		lb, err := b.TryAcquire(ctx, "short", 10*time.Second)
		if err != nil {
			t.Fatalf("takeover of an expired lease: %v", err)
		}
		if lb.Token() == short.Token() {
			t.Fatalf("got the same token twice: %s", lb.Token())
		}
		if got := inspect(t, b, "short"); got.Holder != "b" || got.Fence != lb.Fence() || !got.Held {
			t.Fatalf("after takeover: got %+v, want b holding fence %d", got, lb.Fence())
		}
	})
}

// Point 2: the decision does not depend on affected rows, whose meaning
// clientFoundRows changes. This test first shows the trap is real on this
// server, then that TryAcquire is not caught in it.
func TestClient_TryAcquire_foundRowsCannotFool(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		found := e.openDBWith(t, func(c *mysql.Config) { c.ClientFoundRows = true })
		c := e.client(t, found, table)
		ctx := testCtx(t)
		held := mustAcquire(t, c, "n", 10*time.Second)

		// The acquire statement sent raw, by another owner, against the live
		// lease: it changes nothing, yet with clientFoundRows it reports as
		// many affected rows as it found (two, one on TiDB), the same as
		// inserting a new name's rows.
		us := (10 * time.Second).Microseconds()
		q := c.learned().sql[qAcquire]
		nargs, rows := 9, int64(2)
		if e.oneRow() {
			nargs, rows = tidbAcquireArgs, 1
		}
		args := func(name string) []any {
			return []any{name, "other", "x", us, name, "other", "x", "other", us}[:nargs]
		}
		res, err := found.ExecContext(ctx, q, args("n")...)
		if err != nil {
			t.Fatal(err)
		}
		if n, _ := res.RowsAffected(); n != rows {
			t.Fatalf("got %d affected rows for unchanged rows with clientFoundRows, want %d (the trap this test is about)", n, rows)
		}
		if id, _ := res.LastInsertId(); id != 0 {
			t.Fatalf("got insert id %d for a refused acquire, want 0", id)
		}
		res, err = found.ExecContext(ctx, q, args("fresh")...)
		if err != nil {
			t.Fatal(err)
		}
		if n, _ := res.RowsAffected(); n != rows {
			t.Fatalf("got %d affected rows for inserting a new name, want %d", n, rows)
		}
		_, err = c.TryAcquire(ctx, "n", time.Second)
		wantErrIs(t, err, ErrNotAcquired)
		if got := inspect(t, c, "n"); got.Fence != held.Fence() || !got.Held {
			t.Fatalf("got %+v, want the first lease untouched", got)
		}
	})
}

// twoClients returns two Clients on one fresh table, each with a *sql.DB of
// its own, as two processes would have, holding as "a" and "b"; b has
// bOpts too.
func (e *testEnv) twoClients(t testing.TB, bOpts ...Option) (a, b *Client) {
	t.Helper()
	table := e.newTable(t)
	return e.client(t, e.db, table, WithHolder("a")), e.client(t, e.openDB(t), table, append([]Option{WithHolder("b")}, bOpts...)...)
}

// openDBWith opens a *sql.DB on the environment's DSN changed by f.
func (e *testEnv) openDBWith(t testing.TB, f func(*mysql.Config)) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", e.dsnWith(t, f))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// Point 3: Refresh extends from the server's now, only while the lease is
// ours and live, and never shortens it.
func TestLock_Refresh(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		a, b := e.twoClients(t)
		ctx := testCtx(t)

		l := mustAcquire(t, a, "r", 2*time.Second)
		if err := l.Refresh(ctx, time.Hour); err != nil {
			t.Fatalf("Refresh: %v", err)
		}
		if got := inspect(t, a, "r"); got.TTL < 59*time.Minute || got.TTL > time.Hour || got.Fence != l.Fence() {
			t.Fatalf("after Refresh(1h): got %+v, want TTL just under 1h and the same fence", got)
		}
		if d := time.Until(l.ValidUntil()); d < 59*time.Minute || d > time.Hour {
			t.Fatalf("ValidUntil is %v away, want just under 1h", d)
		}
		// A refresh never shortens the lease: the later expiry stays.
		if err := l.Refresh(ctx, 40*time.Millisecond); err != nil {
			t.Fatalf("Refresh: %v", err)
		}
		if got := inspect(t, a, "r"); got.TTL < 59*time.Minute {
			t.Fatalf("after Refresh(40ms): got %+v, want the hour kept", got)
		}
		if d := time.Until(l.ValidUntil()); d < 59*time.Minute {
			t.Fatalf("ValidUntil after Refresh(40ms) is %v away, want the hour kept", d)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		l = mustAcquire(t, a, "r", 40*time.Millisecond)
		time.Sleep(80 * time.Millisecond)
		wantErrIs(t, l.Refresh(ctx, time.Second), ErrNotHeld)

		// Expired and taken over: the new owner's lease is untouched.
		lb := mustAcquire(t, b, "r", 10*time.Second)
		wantErrIs(t, l.Refresh(ctx, time.Second), ErrNotHeld)
		if got := inspect(t, b, "r"); got.Fence != lb.Fence() || got.TTL < 9*time.Second {
			t.Fatalf("got %+v, want b's lease as it was", got)
		}
	})
}

// Point 3, second half: an error that is not loss is not reported as loss.
func TestLock_Refresh_networkErrorIsNotLoss(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		p := startProxy(t, e.serverAddr(t))
		db := e.openDBWith(t, func(c *mysql.Config) { c.Addr = p.Addr() })
		c := e.client(t, db, table)
		l := mustAcquire(t, c, "net", 10*time.Second)

		p.Stall(true)
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := l.Refresh(ctx, 10*time.Second)
		cancel()
		p.Stall(false)
		if err == nil || errors.Is(err, ErrNotHeld) {
			t.Fatalf("Refresh through a stalled network: got %v, want an error that is not ErrNotHeld", err)
		}
		p.CutAll()
		if err := l.Refresh(testCtx(t), 10*time.Second); err != nil {
			t.Fatalf("Refresh after the network healed: %v", err)
		}
	})
}

// serverAddr is the host:port of the environment's server.
func (e *testEnv) serverAddr(t testing.TB) string {
	t.Helper()
	skipFakeFor(t, e, "it needs the server's TCP address")
	cfg, err := mysql.ParseDSN(e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Addr
}

// Point 4: Release deletes only our own row.
func TestLock_Release(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		a, b := e.twoClients(t)
		ctx := testCtx(t)

		l := mustAcquire(t, a, "x", 10*time.Second)
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
		if got := inspect(t, a, "x"); got.Held || got.Holder != "" || got.Fence != l.Fence() {
			t.Fatalf("after Release: got %+v, want the lease gone and fence %d kept", got, l.Fence())
		}
		wantErrIs(t, l.Release(ctx), ErrNotHeld)
		mustAcquire(t, b, "x", 10*time.Second)

		// Expired, taken over: release is refused and b's lease stays.
		old := mustAcquire(t, a, "y", 30*time.Millisecond)
		time.Sleep(60 * time.Millisecond)
		lb := mustAcquire(t, b, "y", 10*time.Second)
		wantErrIs(t, old.Release(ctx), ErrNotHeld)
		if got := inspect(t, b, "y"); !got.Held || got.Fence != lb.Fence() {
			t.Fatalf("got %+v, want b's lease kept", got)
		}

		// Expired, nobody took it: nobody held the name in between.
		lapsed := mustAcquire(t, a, "z", 30*time.Millisecond)
		time.Sleep(60 * time.Millisecond)
		if err := lapsed.Release(ctx); err != nil {
			t.Fatalf("Release of an expired, untaken lease: %v", err)
		}
		if got := inspect(t, a, "z"); got.Held || got.Holder != "" || got.Fence != lapsed.Fence() {
			t.Fatalf("got %+v, want the lease gone", got)
		}
	})
}

// Point 5: fences grow strictly with every new holder: takeover, release and
// re-acquire; a refresh keeps the fence.
func TestLock_Fence_order(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		a, b := e.twoClients(t)
		ctx := testCtx(t)

		var fences []uint64
		for i := range 6 {
			c := a
			if i%2 == 1 {
				c = b
			}
			ttl := 10 * time.Second
			if i%3 == 2 {
				ttl = 300 * time.Millisecond // to lapse: no Refresh shortens a lease
			}
			l := mustAcquire(t, c, "f", ttl)
			fences = append(fences, l.Fence())
			if err := l.Refresh(ctx, ttl); err != nil {
				t.Fatal(err)
			}
			if got := inspect(t, c, "f"); got.Fence != l.Fence() {
				t.Fatalf("after Refresh: got fence %d, want %d", got.Fence, l.Fence())
			}
			if i%3 == 2 {
				// Let it lapse: the next holder takes it over.
				time.Sleep(ttl + 100*time.Millisecond)
				continue
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		for i := 1; i < len(fences); i++ {
			if fences[i] <= fences[i-1] {
				t.Fatalf("fences %v: got %d after %d, want strictly increasing", fences, fences[i], fences[i-1])
			}
		}
	})
}

// Point 5, the part that needs no clock: a takeover moves the fence past the
// old one even when the old one is far ahead of the server's clock.
func TestLock_Fence_takeoverPassesFutureFence(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		c := e.client(t, e.db, table)
		ctx := testCtx(t)
		mustAcquire(t, c, "g", 10*time.Second)
		const future = uint64(1) << 60
		if _, err := e.db.ExecContext(ctx, "UPDATE `"+table+"` SET fence = IF(kind = '"+e.fenceKind()+"', ?, 0), expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE name = 'g'", future); err != nil {
			t.Fatal(err)
		}
		l := mustAcquire(t, c, "g", 10*time.Second)
		if l.Fence() != future+1 {
			t.Fatalf("got fence %d, want %d", l.Fence(), future+1)
		}
	})
}

// On TiDB fences end at 2^63-2, where its LAST_INSERT_ID(expr) ends less
// one for the refresh: a lease with that fence is acquired, refreshed and
// released, and the acquire after it fails and holds nothing, under every
// DSN, including a lenient sql_mode that would report a smaller fence.
func TestLock_Fence_TiDBLimit(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		if !e.server.TiDB {
			t.Skipf("%s is %s: the limit is TiDB's; elsewhere fences go to 2^64-1 (TestLock_Fence_beyondInt64)", e.server.Label, e.server.Version)
		}
		a, b := e.twoClients(t)
		table := a.table[1 : len(a.table)-1]
		ctx := testCtx(t)
		mustAcquire(t, a, "edge", time.Minute)
		if _, err := e.db.ExecContext(ctx, "UPDATE `"+table+"` SET fence = ?, expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE name = 'edge'", uint64(maxTiDBFence-1)); err != nil {
			t.Fatal(err)
		}
		l := mustAcquire(t, b, "edge", time.Minute)
		if l.Fence() != maxTiDBFence {
			t.Fatalf("got fence %d, want %d", l.Fence(), uint64(maxTiDBFence))
		}
		if err := l.Refresh(ctx, time.Minute); err != nil {
			t.Fatalf("Refresh: %v", err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
		if _, err := a.TryAcquire(ctx, "edge", time.Minute); err == nil || errors.Is(err, ErrNotAcquired) {
			t.Fatalf("acquire past TiDB's largest fence: got %v, want an error", err)
		}
		if got := inspect(t, b, "edge"); got.Held {
			t.Fatalf("after the failed acquire: got %+v, want the name free", got)
		}
	})
}

// Fences are unsigned 64-bit end to end: a fence at or past 2^63, which the
// driver's insert id carries as a negative int64, is reported as it is, and an
// acquire that cannot go past the largest fence fails and holds nothing.
func TestLock_Fence_beyondInt64(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		if e.server.TiDB {
			t.Skip("TiDB's LAST_INSERT_ID(expr) takes a signed value: its fences end at 2^63-2 (TestLock_Fence_TiDBLimit)")
		}
		a, b := e.twoClients(t)
		table := a.table[1 : len(a.table)-1]
		ctx := testCtx(t)
		setFence := func(name string, fence uint64) {
			t.Helper()
			mustAcquire(t, a, name, time.Minute)
			// The fence goes as text: vtgate turns a bound uint64 past 2^63
			// into a negative INT64.
			if _, err := e.db.ExecContext(ctx, "UPDATE `"+table+"` SET fence = IF(kind = '"+e.fenceKind()+"', "+strconv.FormatUint(fence, 10)+", 0), expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE name = ?", name); err != nil {
				t.Fatal(err)
			}
		}
		const big = uint64(1)<<63 + 5
		setFence("big", big)
		l := mustAcquire(t, b, "big", time.Minute)
		if l.Fence() != big+1 {
			t.Fatalf("got fence %d, want %d", l.Fence(), big+1)
		}
		if got := inspect(t, a, "big"); !got.Held || got.Holder != "b" || got.Fence != big+1 {
			t.Fatalf("Inspect: got %+v, want b holding fence %d", got, big+1)
		}
		infos, err := a.List(ctx)
		if err != nil || len(infos) != 1 || infos[0].Fence != big+1 {
			t.Fatalf("List: got %+v, %v, want one lease with fence %d", infos, err, big+1)
		}
		_, err = a.TryAcquire(ctx, "big", time.Minute)
		wantErrIs(t, err, ErrNotAcquired)
		if got := inspect(t, a, "big"); !got.Held || got.Holder != "b" || got.Fence != big+1 {
			t.Fatalf("after a refused acquire: got %+v, want b's lease untouched", got)
		}
		if err := l.Refresh(ctx, time.Minute); err != nil {
			t.Fatalf("Refresh: %v", err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}

		// No fence comes after the largest: the acquire fails and holds nothing.
		setFence("last", math.MaxUint64)
		if _, err := b.TryAcquire(ctx, "last", time.Minute); err == nil || errors.Is(err, ErrNotAcquired) {
			t.Fatalf("acquire past the largest fence: got %v, want a server error", err)
		}
		if got := inspect(t, a, "last"); got.Held || got.Fence != math.MaxUint64 {
			t.Fatalf("after the failed acquire: got %+v, want no live lease and fence %d", got, uint64(math.MaxUint64))
		}
	})
}

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

// Issue 21, point 8, on a real server: a holder's open Check transaction
// keeps its lease row locked. Another process's TryAcquire waits for the
// row at most about a second, then reports the name held (not error 1205
// after innodb_lock_wait_timeout, 50 s by default); its Acquire takes the
// name once the holder commits and releases.
func TestClient_TryAcquire_behindCheckTransaction(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		holder := e.client(t, e.db, table)
		other := e.client(t, e.openDB(t), table, WithRetry(LinearBackoff(20*time.Millisecond)))
		ctx := testCtx(t)
		l := mustAcquire(t, holder, "w", time.Minute)
		tx, err := e.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if err := l.Check(ctx, tx); err != nil {
			t.Fatalf("Check: %v", err)
		}
		// MariaDB bounds the acquire's wait itself; on MySQL the caller's
		// deadline does (queries.sql, lock_wait_mariadb).
		tctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		if !e.server.MariaDB {
			tctx, cancel = context.WithTimeout(ctx, 2*time.Second)
		}
		defer cancel()
		start := time.Now()
		_, err = other.TryAcquire(tctx, "w", time.Minute)
		wantErrIs(t, err, ErrNotAcquired)
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("TryAcquire behind an open Check took %v, want about a second at most", took)
		}
		got := acquireAsync(ctx, other, "w")
		time.Sleep(200 * time.Millisecond)
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		l2 := mustGet(t, got)
		if l2.Fence() <= l.Fence() {
			t.Fatalf("got fence %d after %d, want it higher", l2.Fence(), l.Fence())
		}
	})
}

// Point 9: Acquire waits for a release, gives up when its strategy does, and
// reports a context's end as both causes.
func TestClient_Acquire(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		a := e.client(t, e.db, table)
		b := e.client(t, e.openDB(t), table, WithRetry(LinearBackoff(5*time.Millisecond)))
		ctx := testCtx(t)

		l := mustAcquire(t, a, "q", 10*time.Second)
		go func() {
			time.Sleep(100 * time.Millisecond)
			l.Release(context.Background())
		}()
		lb, err := b.Acquire(ctx, "q", 10*time.Second)
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		if lb.Fence() <= l.Fence() {
			t.Fatalf("got fence %d after %d, want it higher", lb.Fence(), l.Fence())
		}

		short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		_, err = b.Acquire(short, "q", time.Second)
		wantErrIs(t, err, ErrNotAcquired)
		wantErrIs(t, err, context.DeadlineExceeded)

		if e.variant.name != variants[0].name {
			return // the rest does not depend on the DSN, and waits 2 s on the wake-up channel
		}
		limited := e.client(t, e.db, table, WithRetry(LimitRetry(LinearBackoff(time.Millisecond), 3)))
		_, err = limited.Acquire(ctx, "q", time.Second)
		wantErrIs(t, err, ErrNotAcquired)
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			t.Fatalf("got %v, want a plain ErrNotAcquired from a strategy that gave up", err)
		}
	})
}

// Point 10: bad input is refused before anything is sent; a missing table
// says how to create it.
func TestClient_badInput(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		ctx := testCtx(t)
		c, err := New(e.db, WithTable("no_such_table_here"))
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.TryAcquire(ctx, "n", time.Second)
		if err == nil || !strings.Contains(err.Error(), "CreateTable") || !strings.Contains(err.Error(), "schema.sql") {
			t.Fatalf("got %v, want an error that says to call CreateTable or run schema.sql", err)
		}
		if n, ok := fault.Errno(err); !ok || n != e.noSuchTable() {
			t.Fatalf("got errno %d, %v, want the driver's %d kept", n, ok, e.noSuchTable())
		}

		c = e.newClient(t)
		for _, tc := range []struct {
			name string
			ttl  time.Duration
			want string
		}{
			{"", time.Second, "empty lock name"},
			{strings.Repeat("x", MaxNameLen+1), time.Second, "longer than"},
			{"n", 0, "below the minimum"},
			{"n", MinTTL - time.Microsecond, "below the minimum"},
			{"n", MaxTTL + time.Second, "beyond the maximum"},
		} {
			_, err := c.TryAcquire(ctx, tc.name, tc.ttl)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("TryAcquire(%d-byte name, %v): got %v, want an error containing %q", len(tc.name), tc.ttl, err, tc.want)
			}
		}
		// The longest name and the extreme leases work against the server.
		l := mustAcquire(t, c, strings.Repeat("x", MaxNameLen), MaxTTL)
		if got := inspect(t, c, l.Name()); !got.Held || got.TTL < MaxTTL-time.Minute {
			t.Fatalf("got %+v, want a lease of about MaxTTL", got)
		}
		if err := l.Refresh(ctx, MinTTL); err != nil {
			t.Fatal(err)
		}
	})
}

// A Client that cannot connect says so, in the words of the step that
// failed, with "sqllock:" once; the driver's error stays wrapped.
func TestClient_connectError(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		ctx := testCtx(t)
		for _, tc := range []struct {
			name  string
			dsn   func(*mysql.Config)
			errno int // 0: a refused dial
		}{
			{"wrong password", func(c *mysql.Config) { c.Passwd = "not-the-password" }, 1045},
			{"unknown database", func(c *mysql.Config) { c.DBName = "sqllock_no_such_db" }, 1049},
			{"nothing listening", func(c *mysql.Config) { c.Addr = "127.0.0.1:1" }, 0},
		} {
			t.Run(tc.name, func(t *testing.T) {
				if tc.errno == 1045 {
					skipOnVitess(t, e, vitessNoAuth)
				}
				c := e.client(t, e.openDBWith(t, tc.dsn), "sqllock")
				_, err := c.TryAcquire(ctx, "x", time.Second)
				assertPrefixOnce(t, err)
				if !strings.HasPrefix(err.Error(), `sqllock: acquire "x": connect to the server: `) {
					t.Errorf("got %q, want it to say that connecting failed", err)
				}
				if n, _ := fault.Errno(err); n != tc.errno {
					t.Errorf("got errno %d, want %d", n, tc.errno)
				}
			})
		}
	})
}

// A session without autocommit would never commit a lease.
func TestClient_autocommitOff(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		db := e.openDBWith(t, func(c *mysql.Config) { setParam(c, "autocommit", "0") })
		c := e.client(t, db, table)
		_, err := c.TryAcquire(testCtx(t), "n", time.Second)
		if err == nil || !strings.Contains(err.Error(), "autocommit") {
			t.Fatalf("got %v, want an error about autocommit", err)
		}
	})
}

// Point 11: Inspect reads holder, fence, liveness and the remaining lease as
// the server computes it.
func TestClient_Inspect(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		c := e.newClient(t, WithHolder("host-7:42"))
		if got := inspect(t, c, "free"); got != (Info{Name: "free"}) {
			t.Fatalf("free name: got %+v, want only the name", got)
		}
		l := mustAcquire(t, c, "i", 5*time.Second)
		got := inspect(t, c, "i")
		if got.Name != "i" || got.Holder != "host-7:42" || got.Fence != l.Fence() || !got.Held || got.TTL <= 2*time.Second || got.TTL > 5*time.Second {
			t.Fatalf("got %+v, want holder host-7:42, fence %d, held, TTL under 5s", got, l.Fence())
		}
		lapsed := mustAcquire(t, c, "lapsed", 20*time.Millisecond)
		time.Sleep(50 * time.Millisecond)
		if got := inspect(t, c, "lapsed"); got.Held || got.TTL != 0 || got.Fence != lapsed.Fence() || got.Holder != "host-7:42" {
			t.Fatalf("expired lease: got %+v, want the last holder and fence, not held", got)
		}
	})
}

// The default holder names the host and process.
func TestClient_defaultHolder(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		c := e.newClient(t)
		mustAcquire(t, c, "h", time.Second)
		if got, want := inspect(t, c, "h").Holder, defaultHolder(); got != want || !strings.Contains(got, ":") {
			t.Fatalf("got holder %q, want %q (hostname:pid)", got, want)
		}
	})
}

// Clients racing for a name nobody has taken yet, which each tries to
// insert: exactly one gets it, and the others are told it is held, not an
// error (TiDB's autocommit statements are optimistic: two inserts of one new
// key may both run, and one must then fail at commit and be sent again).
func TestClient_TryAcquire_newNameRace(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		const clients, rounds = 8, 25
		table := e.newTable(t)
		ctx := testCtx(t)
		cs := make([]*Client, clients)
		for i := range cs {
			cs[i] = e.client(t, e.openDB(t), table, WithHolder(fmt.Sprint("c", i)))
		}
		for r := range rounds {
			name := fmt.Sprint("new-", r)
			start := make(chan struct{})
			results := make(chan error, clients)
			for _, c := range cs {
				go func() {
					<-start
					_, err := c.TryAcquire(ctx, name, time.Minute)
					results <- err
				}()
			}
			close(start)
			won := 0
			for range clients {
				switch err := <-results; {
				case err == nil:
					won++
				case !errors.Is(err, ErrNotAcquired):
					t.Fatalf("round %d: TryAcquire: got %v, want nil or ErrNotAcquired", r, err)
				}
			}
			if won != 1 {
				t.Fatalf("round %d: %d clients acquired %q, want 1", r, won, name)
			}
		}
	})
}

// Mutual exclusion under contention: several Clients on separate *sql.DBs,
// standing in for processes, do a non-atomic read-modify-write of a counter
// under the lock. A lost update, or a fence out of order, fails the test.
func TestMutualExclusion_stress(t *testing.T) {
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

// Each DSN variant reaches the server: a session opened under it runs at the
// isolation level, time zone and sql_mode the variant names, so a variant
// never passes by testing the default twice.
func TestVariants_reachTheServer(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		ctx := testCtx(t)
		var isolation, zone, mode string
		err := e.db.QueryRowContext(ctx, "SELECT @@"+isolationVariable(e.server)+", @@time_zone, @@sql_mode").
			Scan(&isolation, &zone, &mode)
		if err != nil {
			t.Fatal(err)
		}
		want := e.variant.isolation
		if want == "" {
			want = "REPEATABLE-READ"
		}
		if isolation != want {
			t.Errorf("isolation: got %s, want %s", isolation, want)
		}
		for name, wantZone := range map[string]string{"timeZone+13": "+13:00", "allAtOnce": "-11:00"} {
			if e.variant.name == name && zone != wantZone {
				t.Errorf("time_zone: got %s, want %s", zone, wantZone)
			}
		}
		for name, wantModes := range map[string][]string{"simultaneousAssignment": {"SIMULTANEOUS_ASSIGNMENT"}, "allAtOnce": {"ANSI_QUOTES"},
			"sqlModeOracle": {"ORACLE"}, "sqlModesVitess": {"PAD_CHAR_TO_FULL_LENGTH", "NO_UNSIGNED_SUBTRACTION"},
			"sqlModes": {"ANSI_QUOTES", "PIPES_AS_CONCAT", "PAD_CHAR_TO_FULL_LENGTH", "NO_BACKSLASH_ESCAPES", "NO_UNSIGNED_SUBTRACTION"}} {
			for _, wantMode := range wantModes {
				if e.variant.name == name && !strings.Contains(mode, wantMode) {
					t.Errorf("sql_mode: got %s, want it to contain %s", mode, wantMode)
				}
			}
		}
		if e.server.TiDB {
			var txnMode string
			if err := e.db.QueryRowContext(ctx, "SELECT @@tidb_txn_mode").Scan(&txnMode); err != nil {
				t.Fatal(err)
			}
			if want := map[bool]string{true: "optimistic", false: "pessimistic"}[e.variant.name == "optimistic"]; txnMode != want {
				t.Errorf("tidb_txn_mode: got %s, want %s", txnMode, want)
			}
		}
	})
}
