package sqllock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock/internal/engine"
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
		e := newMockEnv(t, WithRetry(LinearBackoff(time.Hour)))
		e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, &tokenArg{}), errReply(errReadOnly))
		// The context ends once the first attempt was answered (a loaded
		// machine took over a second to, under -race): the error is then
		// the refusal, not a cancelled query.
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go func() {
			for headAttempts(e.c, "job") < 1 && ctx.Err() == nil {
				time.Sleep(time.Millisecond)
			}
			cancel()
		}()
		_, err := e.c.Acquire(ctx, "job", time.Second)
		assertErrIs(t, err, ErrNotAcquired, context.Canceled, errReadOnly)
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
		q := c.eng.Forms().SQL[qAcquire]
		nargs, rows := 9, int64(2)
		if e.oneRow() {
			nargs, rows = engine.OneRowAcquireArgs, 1
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

func TestClient_TryAcquire_args(t *testing.T) {
	const holder = "worker 7 on host-a"
	longName := strings.Repeat("n", MaxNameLen)
	tests := []struct {
		name   string
		table  string
		opts   []Option
		holder string
		lock   string
		ttl    time.Duration
		ttlUS  int64
	}{
		{"default table", DefaultTable, nil, mockHolder, "job", 2*time.Second + 345*time.Microsecond + 678, 2_000_345},
		{"WithTable", "my_locks", nil, mockHolder, "job", 2*time.Second + 345*time.Microsecond + 678, 2_000_345},
		{"WithHolder", DefaultTable, []Option{WithHolder(holder)}, holder, "job", time.Minute, 60_000_000},
		{"shortest ttl", DefaultTable, nil, mockHolder, "job", MinTTL, 1_000},
		{"longest ttl and name", DefaultTable, nil, mockHolder, longName, MaxTTL, 3_153_600_000_000_000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newMockEnvTable(t, tt.table, tt.opts...)
			tok := &tokenArg{}
			e.expectExec("acquire", acquireArgs(tt.lock, tt.holder, tt.ttlUS, tok), okReply(42, 1))
			l, err := e.c.TryAcquire(t.Context(), tt.lock, tt.ttl)
			if err != nil {
				t.Fatalf("TryAcquire: got %v, want nil", err)
			}
			if l.Token() != tok.token || !hexToken.MatchString(l.Token()) {
				t.Errorf("Token: got %q, want %q, 32 lowercase hex digits", l.Token(), tok.token)
			}
			if l.Name() != tt.lock {
				t.Errorf("Name: got %q, want %q", l.Name(), tt.lock)
			}
			e.done()
		})
	}
}

func TestClient_TryAcquire_freshToken(t *testing.T) {
	e := newMockEnv(t)
	tok1, tok2 := &tokenArg{}, &tokenArg{}
	e.expectExec("acquire", acquireArgs("a", mockHolder, 1_000_000, tok1), okReply(101, 2))
	e.expectExec("acquire", acquireArgs("b", mockHolder, 1_000_000, tok2), okReply(102, 2))
	for _, name := range []string{"a", "b"} {
		if _, err := e.c.TryAcquire(t.Context(), name, time.Second); err != nil {
			t.Fatalf("TryAcquire(%q): got %v, want nil", name, err)
		}
	}
	if tok1.token == tok2.token {
		t.Errorf("tokens of two calls: got %q twice, want two different", tok1.token)
	}
	e.done()
}

func TestClient_TryAcquire_result(t *testing.T) {
	tests := []struct {
		name     string
		id, rows int64
		wantErr  error  // nil: acquired with fence id, unless wantMsg
		wantMsg  string // an error that wraps no sentinel
	}{
		{"new rows", 1_700_000_000_000_000, 2, nil, ""},
		{"taken over", 1_700_000_000_000_001, 4, nil, ""},
		{"small fence", 4, 1, nil, ""},
		{"held, 0 rows", 0, 0, ErrNotAcquired, ""},
		{"held, 1 row (clientFoundRows)", 0, 1, ErrNotAcquired, ""},
		{"held, 2 rows", 0, 2, ErrNotAcquired, ""},
		{"mark 1 came through", 1, 2, nil, "fence row is missing (mark 1)"},
		{"mark 2 came through", 2, 1, nil, "fence row is missing (mark 2)"},
		{"fence 2^63", -1 << 63, 2, nil, ""},
		{"fence 2^64-1", -1, 2, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newMockEnv(t)
			tok := &tokenArg{}
			e.expectExec("acquire", acquireArgs("job", mockHolder, 10_000_000, tok), okReply(tt.id, tt.rows))
			if tt.wantMsg != "" {
				// The lease it took is given back.
				e.expectExec("release", releaseArgs("job", tok), okReply(0, 1))
			}
			before := time.Now()
			l, err := e.c.TryAcquire(t.Context(), "job", 10*time.Second)
			after := time.Now()
			switch {
			case tt.wantErr != nil || tt.wantMsg != "":
				if tt.wantErr != nil {
					assertErrIs(t, err, tt.wantErr)
				} else {
					assertErrContains(t, err, tt.wantMsg)
					if errors.Is(err, ErrNotAcquired) {
						t.Errorf("got %v, want an error not wrapping %v", err, ErrNotAcquired)
					}
				}
				if l != nil {
					t.Errorf("Lock: got %v, want nil", l)
				}
			default:
				if err != nil {
					t.Fatalf("TryAcquire: got %v, want nil", err)
				}
				if got, want := l.Fence(), uint64(tt.id); got != want {
					t.Errorf("Fence: got %v, want %v", got, want)
				}
				if v := l.ValidUntil(); v.Before(before.Add(10*time.Second)) || v.After(after.Add(10*time.Second)) {
					t.Errorf("ValidUntil: got %v, want between %v and %v", v, before.Add(10*time.Second), after.Add(10*time.Second))
				}
			}
			e.done()
		})
	}
	t.Run("no insert id", func(t *testing.T) {
		e := newMockEnv(t)
		noID := errors.New("LastInsertId is not supported")
		e.expectPrepare("acquire")
		e.mock.ExpectExec(e.sql("acquire")).WillReturnResult(sqlmock.NewErrorResult(noID))
		_, err := e.c.TryAcquire(t.Context(), "job", time.Second)
		assertErrIs(t, err, noID)
		e.done()
	})
}

// Issue 21, point 8. An acquire whose lease row stays locked past its own
// bound (1205: a holder's Lock.Check transaction) is undone, is not sent
// again, and reports the name held.
func TestClient_TryAcquire_rowLockedIsHeld(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
	}{{"lock wait timeout", errLockWait}, {"as text only", errors.New("Error 1205 (HY000): Lock wait timeout exceeded")}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newMockEnv(t)
			e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, &tokenArg{}), errReply(tc.err))
			_, err := e.c.TryAcquire(t.Context(), "job", time.Second)
			assertErrIs(t, err, ErrNotAcquired, tc.err)
			if n := e.c.orphans.Count("job"); n != 0 {
				t.Errorf("tokens remembered: got %d, want 0", n)
			}
			e.done()
		})
	}
}

func TestClient_Acquire_retryStrategy(t *testing.T) {
	held, free := okReply(0, 1), okReply(7, 1)
	tests := []struct {
		name     string
		strategy RetryStrategy
		replies  []reply // one per attempt
		wantErr  error   // nil: acquired with fence 7
	}{
		{"NoRetry", NoRetry(), []reply{held}, ErrNotAcquired},
		{"LimitRetry 3", LimitRetry(LinearBackoff(time.Millisecond), 3), []reply{held, held, held}, ErrNotAcquired},
		{"acquired on the third attempt", LinearBackoff(time.Millisecond), []reply{held, held, free}, nil},
		{"server error ends Acquire", LinearBackoff(time.Millisecond), []reply{errReply(errSyntax)}, errSyntax},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newMockEnv(t, WithRetry(tt.strategy))
			// One token serves every attempt: with one name waited
			// for, each poll is the acquire (internal/wait/look.go).
			tok := &tokenArg{}
			e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, tok), tt.replies...)
			l, err := e.c.Acquire(t.Context(), "job", time.Second)
			switch {
			case tt.wantErr != nil:
				assertErrIs(t, err, tt.wantErr)
				if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
					t.Errorf("got %v, want no context error", err)
				}
			case err != nil:
				t.Errorf("Acquire: got %v, want nil", err)
			case l.Fence() != 7 || l.Token() != tok.token:
				t.Errorf("Lock: got fence %d token %q, want fence 7 token %q", l.Fence(), l.Token(), tok.token)
			}
			e.done()
		})
	}
}

func TestClient_Acquire_deadline(t *testing.T) {
	// Two quick retries, then a wait longer than the context lives: its
	// deadline passes once the third attempt asks for the hour-long wait,
	// not at a time a loaded machine may reach before the first use's
	// proof is through.
	ctx := newDeadlineCtx(t.Context())
	strategy := retryFunc(func(attempt int) (time.Duration, bool) {
		if attempt < 3 {
			return time.Millisecond, true
		}
		ctx.pass()
		return time.Hour, true
	})
	e := newMockEnv(t, WithRetry(strategy))
	e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, &tokenArg{}), repeatReply(okReply(0, 1), 3)...)
	l, err := e.c.Acquire(ctx, "job", time.Second)
	if l != nil {
		t.Errorf("Lock: got %v, want nil", l)
	}
	assertErrIs(t, err, ErrNotAcquired, context.DeadlineExceeded)
	e.done()
}

func TestClient_acquire_cancelledInFlight(t *testing.T) {
	tests := []struct {
		name    string
		acquire func(c *Client, ctx context.Context) (*Lock, error)
		ctx     func(t *testing.T, tok *tokenArg) (context.Context, context.CancelFunc)
		wantCtx error
	}{
		{
			"TryAcquire, deadline",
			func(c *Client, ctx context.Context) (*Lock, error) { return c.TryAcquire(ctx, "job", time.Second) },
			// Long enough for the statement to be sent on a loaded
			// machine (the first use's proof taken as made); it then
			// hangs for a minute, so the deadline passes in flight.
			func(t *testing.T, _ *tokenArg) (context.Context, context.CancelFunc) {
				return context.WithTimeout(t.Context(), 2*time.Second)
			},
			context.DeadlineExceeded,
		},
		{
			"Acquire, cancel",
			func(c *Client, ctx context.Context) (*Lock, error) { return c.Acquire(ctx, "job", time.Second) },
			// Cancelled once the statement is in flight.
			func(t *testing.T, tok *tokenArg) (context.Context, context.CancelFunc) {
				ctx, cancel := context.WithCancel(t.Context())
				go func() {
					for !tok.sent.Load() && ctx.Err() == nil {
						time.Sleep(time.Millisecond)
					}
					time.Sleep(10 * time.Millisecond) // into the mock's delay
					cancel()
				}()
				return ctx, cancel
			},
			context.Canceled,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newMockEnv(t)
			e.c.markProven()
			e.proven = true
			tok := &tokenArg{}
			e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, tok), reply{id: 42, rows: 1, delay: time.Minute})
			// The cleanup: the release statement with the same name and token.
			e.expectExec("release", releaseArgs("job", tok), okReply(0, 1))
			ctx, cancel := tt.ctx(t, tok)
			defer cancel()
			l, err := tt.acquire(e.c, ctx)
			if l != nil {
				t.Errorf("Lock: got %v, want nil", l)
			}
			assertErrIs(t, err, ErrNotAcquired, tt.wantCtx)
			e.done()
		})
	}
	t.Run("cancelled before, no SQL", func(t *testing.T) {
		e := newMockEnv(t)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, err := e.c.TryAcquire(ctx, "job", time.Second)
		assertErrIs(t, err, ErrNotAcquired, context.Canceled)
		e.assertNothingPrepared()
		e.done()
	})
}

func TestClient_badInput_noSQL(t *testing.T) {
	longName := strings.Repeat("n", MaxNameLen+1)
	names := []struct{ name, want string }{
		{"", "empty lock name"},
		{longName, "lock name is 256 bytes, longer than the 255"},
	}
	ttls := []struct {
		ttl  time.Duration
		want string
	}{
		{0, "below the minimum"},
		{-time.Second, "below the minimum"},
		{999 * time.Microsecond, "below the minimum"},
		{MaxTTL + 1, "beyond the maximum"},
	}
	type call func(ctx context.Context, e *mockEnv, name string, ttl time.Duration) error
	tryAcquire := func(ctx context.Context, e *mockEnv, name string, ttl time.Duration) error {
		_, err := e.c.TryAcquire(ctx, name, ttl)
		return err
	}
	acquire := func(ctx context.Context, e *mockEnv, name string, ttl time.Duration) error {
		_, err := e.c.Acquire(ctx, name, ttl)
		return err
	}
	inspect := func(ctx context.Context, e *mockEnv, name string, _ time.Duration) error {
		_, err := e.c.Inspect(ctx, name)
		return err
	}
	refresh := func(ctx context.Context, e *mockEnv, _ string, ttl time.Duration) error {
		l := newLock(e.c, "job", strings.Repeat("a", 32), 1, time.Hour, time.Now().Add(time.Hour))
		return l.Refresh(ctx, ttl)
	}
	nop := func(context.Context, *Lock) error { return nil }
	do := func(ctx context.Context, e *mockEnv, name string, ttl time.Duration) error {
		return e.c.Do(ctx, name, ttl, nop)
	}
	tryDo := func(ctx context.Context, e *mockEnv, name string, ttl time.Duration) error {
		return lockDo(e.c.TryAcquire(ctx, name, ttl))(ctx, nop)
	}
	type tcase struct {
		name string
		call call
		lock string
		ttl  time.Duration
		want string
	}
	var tests []tcase
	for _, op := range []struct {
		name string
		call call
	}{{"TryAcquire", tryAcquire}, {"Acquire", acquire}, {"Do", do}, {"TryDo", tryDo}} {
		for _, n := range names {
			tests = append(tests, tcase{fmt.Sprintf("%s name of %d bytes", op.name, len(n.name)), op.call, n.name, time.Second, n.want})
		}
		for _, d := range ttls {
			tests = append(tests, tcase{fmt.Sprintf("%s ttl %v", op.name, d.ttl), op.call, "job", d.ttl, d.want})
		}
		// Both wrong: the name is named, as TryAcquire checks it first.
		tests = append(tests, tcase{op.name + " empty name and ttl 0s", op.call, "", 0, "empty lock name"})
	}
	for _, n := range names {
		tests = append(tests, tcase{fmt.Sprintf("Inspect name of %d bytes", len(n.name)), inspect, n.name, 0, n.want})
	}
	for _, d := range ttls {
		tests = append(tests, tcase{fmt.Sprintf("Refresh ttl %v", d.ttl), refresh, "", d.ttl, d.want})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newMockEnv(t)
			err := tt.call(t.Context(), e, tt.lock, tt.ttl)
			assertErrContains(t, err, tt.want)
			e.assertNothingPrepared()
			e.done()
		})
	}
}

// A token whose acquire's outcome stayed unknown, and whose cleanup failed,
// is remembered: the next acquire of the name deletes its lease first, and
// forgets it once that DELETE removed the lease, when the acquire had one
// send that may have committed (its resend was refused).
func TestClient_TryAcquire_claimsUnknownAcquire_args(t *testing.T) {
	e := newMockEnv(t)
	lost := &tokenArg{}
	e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, lost),
		errReply(errors.New("invalid connection")), errReply(errReadOnly))
	e.expectExec("release", releaseArgs("job", lost), errReply(&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}))
	if _, err := e.c.TryAcquire(t.Context(), "job", time.Second); err == nil {
		t.Fatalf("TryAcquire: got nil, want an error")
	}
	if n := e.c.orphans.Count("job"); n != 1 {
		t.Fatalf("tokens remembered: got %d, want 1", n)
	}
	e.expectExec("release", releaseArgs("job", lost), okReply(0, 1))
	e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, &tokenArg{}), okReply(9, 1))
	if _, err := e.c.TryAcquire(t.Context(), "job", time.Second); err != nil {
		t.Fatalf("TryAcquire: got %v, want nil", err)
	}
	if n := e.c.orphans.Count("job"); n != 0 {
		t.Errorf("tokens remembered after the claim: got %d, want 0", n)
	}
	// Other names, and later acquires, send nothing more.
	e.expectExec("acquire", acquireArgs("other", mockHolder, 1_000_000, &tokenArg{}), okReply(10, 1))
	if _, err := e.c.TryAcquire(t.Context(), "other", time.Second); err != nil {
		t.Fatalf("TryAcquire: got %v, want nil", err)
	}
	e.done()
}

// An Acquire whose first attempt's outcome stays unknown, and whose cleanup
// fails, retires that token (acquire.go, rule 1): its next attempt deletes
// the lease the token may hold, then acquires under a fresh one. A late
// DELETE by the old token then cannot take the Lock's lease, and no later
// acquire of the name in the Client sends one with the Lock's token.
func TestClient_Acquire_unknownAttemptThenLease_tokenRetired(t *testing.T) {
	e := newMockEnv(t, WithRetry(LinearBackoff(time.Millisecond)))
	old, fresh := &tokenArg{}, &tokenArg{}
	lost := errors.New("invalid connection")
	e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, old), repeatReply(errReply(lost), fault.MaxTransientAttempts)...)
	e.expectExec("release", releaseArgs("job", old), errReply(&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}))
	// The next attempt deletes what the lost one took, then takes the name
	// under a token of its own.
	e.expectExec("release", releaseArgs("job", old), okReply(0, 1))
	e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, fresh), okReply(42, 1))
	l, err := e.c.Acquire(t.Context(), "job", time.Second)
	if err != nil {
		t.Fatalf("Acquire: got %v, want nil", err)
	}
	if l.Token() != fresh.token || fresh.token == old.token {
		t.Errorf("Lock token: got %q, want the fresh %q, not the retired %q", l.Token(), fresh.token, old.token)
	}
	// Four sends were lost: the DELETE removed what one of them wrote, and
	// another may still be in flight. The token stays remembered until no
	// send of it can commit, and each acquire of the name deletes again.
	if n := e.c.orphans.Count("job"); n != 1 {
		t.Errorf("tokens remembered after the DELETE removed the lease of one of four lost sends: got %d, want 1", n)
	}
	// Another acquire of the name sends no DELETE with the Lock's token.
	e.expectExec("release", releaseArgs("job", old), okReply(0, 0))
	e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, &tokenArg{}), okReply(0, 0))
	_, err = e.c.TryAcquire(t.Context(), "job", time.Second)
	assertErrIs(t, err, ErrNotAcquired)
	e.done()
}

// An attempt whose first send was lost and whose resend was refused may
// still take the name later, when the other owner's lease ends: its token is
// remembered whatever the answer (rule 2), and the next acquire of the name
// deletes that lease first.
func TestClient_TryAcquire_lostSendThenRefused_tokenRemembered(t *testing.T) {
	e := newMockEnv(t)
	old := &tokenArg{}
	lost := errors.New("invalid connection")
	e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, old), errReply(lost), okReply(0, 0))
	_, err := e.c.TryAcquire(t.Context(), "job", time.Second)
	assertErrIs(t, err, ErrNotAcquired)
	if n := e.c.orphans.Count("job"); n != 1 {
		t.Fatalf("tokens remembered after a lost send and a refusal: got %d, want 1", n)
	}
	e.expectExec("release", releaseArgs("job", old), okReply(0, 0))
	e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, &tokenArg{}), okReply(43, 1))
	if _, err := e.c.TryAcquire(t.Context(), "job", time.Second); err != nil {
		t.Fatalf("TryAcquire: got %v, want nil", err)
	}
	e.done()
}

func TestClient_TryAcquire_retries(t *testing.T) {
	if fault.MaxTransientAttempts < 2 {
		t.Fatalf("fault.MaxTransientAttempts: got %d, want at least 2", fault.MaxTransientAttempts)
	}
	for _, tc := range transientErrors {
		if errors.Is(tc.err, errLockWait) {
			continue // the acquire reports its row held: TestClient_TryAcquire_rowLockedIsHeld
		}
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // each its own mock: "bounded" waits out a deadline
			failures := fault.MaxTransientAttempts - 1
			if tc.rolledBack {
				failures = manyConflicts
			}
			t.Run("then success, same token", func(t *testing.T) {
				// A budget no load outlasts: CI's load (six test groups
				// under -race) once made ten mock sends outlast 5 s.
				e := newMockEnv(t, withRetryBudget(fault.Budget{Max: time.Minute, Backoff: func(int) time.Duration { return time.Millisecond }}))
				tok := &tokenArg{}
				replies := append(repeatReply(errReply(tc.err), failures), okReply(7, 1))
				e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, tok), replies...)
				l, err := e.c.TryAcquire(t.Context(), "job", time.Second)
				if err != nil {
					t.Fatalf("TryAcquire: got %v, want nil", err)
				}
				if l.Fence() != 7 || l.Token() != tok.token {
					t.Errorf("Lock: got fence %d token %q, want fence 7 token %q", l.Fence(), l.Token(), tok.token)
				}
				e.done()
			})
			t.Run("bounded", func(t *testing.T) {
				tok := &tokenArg{}
				if tc.rolledBack {
					e := newMockEnv(t, quickRetries)
					// Conflicts go on past the Client's budget (100 ms,
					// 1 ms apart: a thousand replies outlast it): the
					// retries stop within it (internal/fault's TestRetry
					// shows they stop within a context's deadline too).
					// The minute only bounds a broken test: under -race
					// beside other test groups the mock took 5 s and more
					// to answer (CI), and ten thousand replies made each
					// match slower (sqlmock scans them in order).
					e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, tok), repeatReply(errReply(tc.err), 1_000)...)
					ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
					defer cancel()
					_, err := e.c.TryAcquire(ctx, "job", time.Second)
					assertErrIs(t, err, tc.err)
					return
				}
				// A broken connection ends after MaxTransientAttempts
				// sends, within the library's budget.
				e := newMockEnv(t, quickBackoff)
				e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, tok),
					repeatReply(errReply(tc.err), fault.MaxTransientAttempts)...)
				// The cleanup of the unknown outcome.
				e.expectExec("release", releaseArgs("job", tok), okReply(0, 1))
				_, err := e.c.TryAcquire(t.Context(), "job", time.Second)
				assertErrIs(t, err, tc.err)
				if errors.Is(err, ErrNotAcquired) {
					t.Errorf("got %v, want an error not wrapping %v", err, ErrNotAcquired)
				}
				e.done()
			})
		})
	}
}

// A server that refuses to run the statement (read-only during a failover,
// no server listening) applied nothing: the operation returns at once, for
// the loops above it to pace their retries, and sends no cleanup.
func TestClient_TryAcquire_refusedNotRetried(t *testing.T) {
	dialRefused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	for _, refused := range []error{errReadOnly, dialRefused} {
		t.Run(refused.Error(), func(t *testing.T) {
			e := newMockEnv(t)
			e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, &tokenArg{}), errReply(refused))
			_, err := e.c.TryAcquire(t.Context(), "job", time.Second)
			assertErrIs(t, err, refused)
			if n := e.c.orphans.Count("job"); n != 0 {
				t.Errorf("tokens remembered: got %d, want 0", n)
			}
			e.done()
		})
	}
}

func TestClient_TryAcquire_finalErrorNotRetried(t *testing.T) {
	for _, final := range []error{errSyntax, errors.New("boom")} {
		t.Run(final.Error(), func(t *testing.T) {
			e := newMockEnv(t)
			e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, &tokenArg{}), errReply(final))
			_, err := e.c.TryAcquire(t.Context(), "job", time.Second)
			assertErrIs(t, err, final)
			e.done()
		})
	}
}

// A deadlineCtx is a context whose deadline passes when the test says, not
// at a time: Err is then context.DeadlineExceeded, as for a context made by
// context.WithTimeout.
type deadlineCtx struct {
	context.Context
	done   chan struct{}
	passed sync.Once
}

func newDeadlineCtx(parent context.Context) *deadlineCtx {
	return &deadlineCtx{Context: parent, done: make(chan struct{})}
}

func (c *deadlineCtx) pass() { c.passed.Do(func() { close(c.done) }) }

func (c *deadlineCtx) Done() <-chan struct{} { return c.done }

func (c *deadlineCtx) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}
