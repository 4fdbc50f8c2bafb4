package sqllock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock/internal/fault"
)

// MariaDB's snapshot isolation (innodb_snapshot_isolation, ON by default from
// 11.6) under SERIALIZABLE refuses an acquire whose lease row another
// transaction changed while the acquire waited for it: Error 1020, "Record
// has changed since last read". The statement was rolled back, so the
// acquire is sent again with its token and takes the lease.
func TestClient_TryAcquire_recordChanged_retried(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		if !e.server.MariaDB {
			t.Skip("innodb_snapshot_isolation is MariaDB's")
		}
		var on int
		if err := e.db.QueryRow("SELECT @@innodb_snapshot_isolation").Scan(&on); err != nil {
			t.Skipf("this MariaDB has no innodb_snapshot_isolation (10.6.18, 10.11.8 and later do): %v", err)
		}
		table := e.newTable(t)
		db := e.openDBWith(t, func(c *mysql.Config) {
			setParam(c, "innodb_snapshot_isolation", "ON")
			setParam(c, "tx_isolation", "'SERIALIZABLE'")
		})
		db.SetMaxOpenConns(1)
		c := e.client(t, db, table, WithHolder("serializable"))
		witness := e.client(t, e.openDB(t), table, WithHolder("witness"))
		// An expired lease for the acquire to take over; the statements are
		// prepared first, so that the acquire's one connection is known.
		mustAcquire(t, witness, "job", time.Millisecond)
		mustAcquire(t, c, "warm", time.Minute)
		var id int64
		if err := db.QueryRow("SELECT CONNECTION_ID()").Scan(&id); err != nil {
			t.Fatal(err)
		}

		// Another transaction locks the lease row and changes it while the
		// acquire waits for it.
		k := &killEnv{admin: e.openDB(t)}
		ctx := testCtx(t)
		tx, err := k.admin.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, "UPDATE `"+table+"` SET expires_at = expires_at - INTERVAL 1 SECOND WHERE name = 'job' AND kind = 'L'"); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			l, err := c.TryAcquire(ctx, "job", time.Minute)
			if err == nil && l.Fence() == 0 {
				err = errors.New("no fence")
			}
			done <- err
		}()
		k.waitRunning(t, id)
		time.Sleep(50 * time.Millisecond) // waiting for the row lock
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("TryAcquire after the row changed under it: got %v, want the lease", err)
		}
		if got := inspect(t, witness, "job"); !got.Held || got.Holder != "serializable" {
			t.Fatalf("after the acquire: got %+v, want held by serializable", got)
		}
	})
}

// Acquire waits out an outage: while no connection to the server can be
// made, each attempt fails with an error that may pass, and the call goes
// on polling until the server answers again.
func TestClient_Acquire_waitsOutAnOutage(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		f := newFaultEnv(t, e)
		ctx := testCtx(t)
		// Prepared on a live connection, which the outage then breaks.
		warm := mustAcquire(t, f.c, "job", time.Minute)
		if err := warm.Release(ctx); err != nil {
			t.Fatal(err)
		}
		f.p.Refuse(true)
		f.p.CutAll()
		done := make(chan error, 1)
		go func() {
			l, err := f.c.Acquire(ctx, "job", time.Minute)
			if err == nil {
				err = l.Release(ctx)
			}
			done <- err
		}()
		time.Sleep(500 * time.Millisecond) // several attempts, refused
		select {
		case err := <-done:
			t.Fatalf("Acquire returned during the outage: %v", err)
		default:
		}
		f.p.Refuse(false)
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("Acquire after the outage: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("Acquire still waiting 10s after the outage ended")
		}
	})
}

// Acquire's polling goes on through errors that may pass, counting each as
// an attempt, and stops on a final one.
func TestClient_Acquire_pollsThroughPassableErrors(t *testing.T) {
	for _, tc := range passableErrors {
		t.Run(tc.name, func(t *testing.T) {
			e := newMockEnv(t, WithRetry(LinearBackoff(time.Millisecond)))
			tok := &tokenArg{}
			args := acquireArgs("job", mockHolder, 1_000_000, tok)
			e.expectExec("acquire", args, errReply(tc.err), okReply(0, 1), errReply(tc.err), okReply(7, 1))
			l, err := e.c.Acquire(t.Context(), "job", time.Second)
			if err != nil {
				t.Fatalf("Acquire: got %v, want nil", err)
			}
			if l.Fence() != 7 {
				t.Errorf("fence: got %d, want 7", l.Fence())
			}
			e.done()
		})
	}
	t.Run("strategy gives up: the last error", func(t *testing.T) {
		e := newMockEnv(t, WithRetry(LimitRetry(LinearBackoff(time.Millisecond), 2)))
		e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, &tokenArg{}), errReply(errReadOnly), errReply(errReadOnly))
		_, err := e.c.Acquire(t.Context(), "job", time.Second)
		assertErrIs(t, err, errReadOnly)
		e.done()
	})
	t.Run("context ends: the last error too", func(t *testing.T) {
		t.Parallel() // waits out its deadline
		e := newMockEnv(t, WithRetry(LinearBackoff(time.Hour)))
		e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, &tokenArg{}), errReply(errReadOnly))
		// Far enough that a loaded machine answers the first attempt
		// before it: then the error is the refusal, not the cancelled query.
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		_, err := e.c.Acquire(ctx, "job", time.Second)
		assertErrIs(t, err, ErrNotAcquired, context.DeadlineExceeded, errReadOnly)
		e.done()
	})
	t.Run("final error ends it", func(t *testing.T) {
		e := newMockEnv(t, WithRetry(LinearBackoff(time.Millisecond)))
		e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, &tokenArg{}), errReply(errReadOnly), errReply(errSyntax))
		_, err := e.c.Acquire(t.Context(), "job", time.Second)
		assertErrIs(t, err, errSyntax)
		e.done()
	})
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
