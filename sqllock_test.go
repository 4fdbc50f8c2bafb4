package sqllock

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock/internal/fault"
	"github.com/sqllock/sqllock/internal/testdsn"
)

// ---------------------------------------------------------------------------
// The table

func TestClient_CreateTable(t *testing.T) {
	eachMockTable(t, func(t *testing.T, e *mockEnv) {
		// Before the first use, in the connection's database.
		e.mock.ExpectExec(strings.ReplaceAll(schema, "`sqllock`", "`"+e.table+"`")).WithoutArgs().WillReturnResult(sqlmock.NewResult(0, 0))
		e.expectAutocommit(1) // the first-use check, made once
		e.expectProof()       // and the proof, before any lease is taken
		if err := e.c.CreateTable(t.Context()); err != nil {
			t.Errorf("CreateTable: got %v, want nil", err)
		}
		e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, &tokenArg{}), okReply(101, 2))
		if _, err := e.c.TryAcquire(t.Context(), "job", time.Second); err != nil {
			t.Errorf("TryAcquire: got %v, want nil", err)
		}
	})
}

// ---------------------------------------------------------------------------
// A missing table

func TestClient_missingTable(t *testing.T) {
	// The hint, the table and the driver's error are all in the message.
	check := func(t *testing.T, err error) {
		t.Helper()
		assertErrContains(t, err, "CreateTable", "schema.sql", "`my_locks`")
		assertErrIs(t, err, errNoSuchTable)
		var me *mysql.MySQLError
		if !errors.As(err, &me) || me.Number != 1146 {
			t.Errorf("got %v, want an error wrapping *mysql.MySQLError 1146", err)
		}
	}
	t.Run("TryAcquire, at prepare", func(t *testing.T) {
		e := newMockEnvTable(t, "my_locks")
		e.expectPrepareError("acquire", errNoSuchTable)
		_, err := e.c.TryAcquire(t.Context(), "job", time.Second)
		check(t, err)
		e.done()
	})
	t.Run("Inspect, at prepare", func(t *testing.T) {
		e := newMockEnvTable(t, "my_locks")
		e.expectPrepareError("inspect", errNoSuchTable)
		_, err := e.c.Inspect(t.Context(), "job")
		check(t, err)
		e.done()
	})
	t.Run("Release, dropped after prepare", func(t *testing.T) {
		e := newMockEnvTable(t, "my_locks")
		l, tok := e.acquired("job")
		e.expectExec("release", releaseArgs("job", tok), errReply(errNoSuchTable))
		check(t, l.Release(t.Context()))
		e.done()
	})
	t.Run("CreateTable mends it", func(t *testing.T) {
		e := newMockEnvTable(t, "my_locks")
		e.expectPrepareError("acquire", errNoSuchTable)
		e.mock.ExpectExec(withTable(schema, "my_locks")).WillReturnResult(sqlmock.NewResult(0, 0))
		e.expectExec("acquire", acquireArgs("job", mockHolder, 1_000_000, &tokenArg{}), okReply(9, 1))
		_, err := e.c.TryAcquire(t.Context(), "job", time.Second)
		check(t, err)
		if err := e.c.CreateTable(t.Context()); err != nil {
			t.Fatalf("CreateTable: got %v, want nil", err)
		}
		if _, err := e.c.TryAcquire(t.Context(), "job", time.Second); err != nil {
			t.Errorf("TryAcquire after CreateTable: got %v, want nil", err)
		}
		e.done()
	})
}

// ---------------------------------------------------------------------------
// Close

func TestClient_Close(t *testing.T) {
	t.Run("unused", func(t *testing.T) {
		e := newMockEnv(t)
		if err := e.c.Close(); err != nil {
			t.Errorf("Close: got %v, want nil", err)
		}
		e.done()
	})
	t.Run("closes statements, not the DB", func(t *testing.T) {
		e := newMockEnv(t)
		released, tok := e.acquired("a")
		e.expectExec("release", releaseArgs("a", tok), okReply(0, 1))
		if err := released.Release(t.Context()); err != nil {
			t.Fatalf("Release: got %v, want nil", err)
		}
		// Close gives back the lease it holds before closing the statements.
		held, heldTok := e.acquired("b")
		e.expectExec("release", releaseArgs("b", heldTok), okReply(0, 1))
		e.prepared["acquire"].WillBeClosed()
		e.prepared["release"].WillBeClosed()

		if err := e.c.Close(); err != nil {
			t.Errorf("Close: got %v, want nil", err)
		}
		if err := e.c.Close(); err != nil {
			t.Errorf("second Close: got %v, want nil", err)
		}
		if err := e.db.PingContext(t.Context()); err != nil {
			t.Errorf("DB Ping after Close: got %v, want nil", err)
		}

		ctx := t.Context()
		calls := map[string]func() error{
			"TryAcquire": func() error { _, err := e.c.TryAcquire(ctx, "c", time.Second); return err },
			"Acquire":    func() error { _, err := e.c.Acquire(ctx, "c", time.Second); return err },
			"Inspect":    func() error { _, err := e.c.Inspect(ctx, "c"); return err },
			"CreateTable": func() error {
				return e.c.CreateTable(ctx)
			},
			"Refresh": func() error { return held.Refresh(ctx, time.Second) },
			"Release": func() error { return held.Release(ctx) },
		}
		for _, name := range slices.Sorted(maps.Keys(calls)) {
			t.Run(name, func(t *testing.T) { assertErrIs(t, calls[name](), ErrClosed) })
		}
		e.done()
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

// Close ends every keep-alive and releases every lease its Client holds.
func TestClient_Close_releasesHeld(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		a, b := e.twoClients(t)
		ctx := testCtx(t)
		x := mustAcquire(t, a, "x", time.Minute)
		mustAcquire(t, a, "y", time.Minute)
		started := make(chan struct{})
		var cause error
		done := make(chan error, 1)
		go func() {
			done <- a.Do(ctx, "z", time.Minute, func(ctx context.Context, _ *Lock) error {
				close(started)
				<-ctx.Done()
				cause = context.Cause(ctx)
				return nil
			})
		}()
		<-started
		if got, want := a.Held(), []string{"x", "y", "z"}; !slices.Equal(got, want) {
			t.Fatalf("Held: got %v, want %v", got, want)
		}
		if err := a.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		err := <-done
		wantErrIs(t, err, ErrClosed)
		wantErrIs(t, cause, ErrClosed)
		for _, n := range []string{"x", "y", "z"} {
			if got := inspect(t, b, n); got.Held {
				t.Fatalf("after Close: %q is %+v, want released", n, got)
			}
		}
		if got := a.Held(); len(got) != 0 {
			t.Fatalf("Held after Close: got %v, want none", got)
		}
		wantErrIs(t, x.Release(ctx), ErrClosed)
		_, err = a.TryAcquire(ctx, "x", time.Second)
		wantErrIs(t, err, ErrClosed)
	})
}

// An acquire that commits after Close has closed the statements gives its
// lease back, whether or not the Client ever prepared the release: the
// Client has no statement left, but the *sql.DB is open.
func TestClient_Close_racingAcquireReleasesItsLease(t *testing.T) {
	warmups := []struct {
		name string
		warm func(t *testing.T, a, b *Client)
	}{
		{"release prepared", func(t *testing.T, a, _ *Client) {
			if err := mustAcquire(t, a, "warm", time.Minute).Release(testCtx(t)); err != nil {
				t.Fatal(err)
			}
		}},
		{"release never prepared", func(t *testing.T, a, b *Client) {
			// An acquire refused prepares the acquire statement alone,
			// and leaves Close nothing to release.
			mustAcquire(t, b, "busy", time.Minute)
			_, err := a.TryAcquire(testCtx(t), "busy", time.Minute)
			wantErrIs(t, err, ErrNotAcquired)
		}},
	}
	for _, w := range warmups {
		t.Run(w.name, func(t *testing.T) {
			testdsn.ParallelTest(t) // each waits out Close's bound on its own tables
			eachServerEnv(t, func(t *testing.T, e *testEnv) {
				table := e.newTable(t)
				a, p := e.proxiedClient(t, table)
				b := e.client(t, e.db, table)
				ctx := testCtx(t)
				w.warm(t, a, b)

				p.ResetCounts()
				p.Stall(true)
				acquired := make(chan error, 1)
				go func() {
					_, err := a.TryAcquire(ctx, "x", time.Minute)
					acquired <- err
				}()
				waitCommand(t, p, proxyComStmtExecute)
				if err := within(t, "Close", a.Close); err != nil {
					t.Fatalf("Close: %v", err)
				}
				p.Stall(false)
				err := within(t, "TryAcquire", func() error { return <-acquired })
				wantErrIs(t, err, ErrClosed)
				if got := inspect(t, b, "x"); got.Held {
					t.Fatalf("after the acquire that lost to Close: got %+v, want the name free", got)
				}
			})
		})
	}
}

// Close calls at once make one release pass; each returns after it, with its
// result.
func TestClient_Close_concurrentCallsShareOnePass(t *testing.T) {
	closeTwice := func(c *Client) (errs [2]error) {
		var wg sync.WaitGroup
		wg.Add(len(errs))
		for i := range errs {
			go func() { defer wg.Done(); errs[i] = c.Close() }()
		}
		wg.Wait()
		return errs
	}
	t.Run("every lease released", func(t *testing.T) {
		eachServerEnv(t, func(t *testing.T, e *testEnv) {
			table := e.newTable(t)
			a, p := e.proxiedClient(t, table)
			b := e.client(t, e.db, table)
			const n = 30
			for i := range n {
				mustAcquire(t, a, fmt.Sprint("n", i), time.Minute)
			}
			// Slow replies stretch the pass, so that the calls overlap.
			p.Latency(20 * time.Millisecond)
			for i, err := range closeTwice(a) {
				if err != nil {
					t.Errorf("Close %d: got %v, want nil", i, err)
				}
			}
			for i := range n {
				if got := inspect(t, b, fmt.Sprint("n", i)); got.Held {
					t.Errorf("after Close: got %+v, want released", got)
				}
			}
		})
	})
	t.Run("one result", func(t *testing.T) {
		eachServerEnv(t, func(t *testing.T, e *testEnv) {
			a, p := e.proxiedClient(t, e.newTable(t))
			mustAcquire(t, a, "x", time.Minute)
			mustAcquire(t, a, "y", time.Minute)
			// The releases cannot reach the server.
			p.Refuse(true)
			p.CutAll()
			errs := closeTwice(a)
			if errs[0] == nil || errs[0] != errs[1] {
				t.Fatalf("Close: got %v and %v, want one release error for both", errs[0], errs[1])
			}
			if err := a.Close(); err != errs[0] {
				t.Fatalf("Close after the pass: got %v, want %v", err, errs[0])
			}
		})
	})
}

// Close returns while a prepare hangs on a dead connection, and the prepare
// that completes after it leaves no statement open.
func TestClient_Close_notHeldUpByStuckPrepare(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		c, p := stalledClient(t, e)
		closeWhileAcquireStuck(t, c, p, proxyComQuery)
		for i := range numStmts {
			if st := c.eng.Prepared(i); st != nil {
				t.Errorf("statement %s after Close: got %v, want nil", stmtNames[i], st)
			}
		}
	})
}

// Close is not held up by a call stuck on a dead connection in a statement
// Close closes either: closing a *sql.Stmt waits for its executions, so
// Close stops waiting when its few seconds are up. The acquire that commits
// after Close gives its lease back.
func TestClient_Close_notHeldUpByStuckCall(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		c, p := e.proxiedClient(t, table)
		witness := e.client(t, e.openDB(t), table)
		// Prepare the acquire, so that the stuck command is its execution.
		if err := mustAcquire(t, c, "warm", time.Minute).Release(testCtx(t)); err != nil {
			t.Fatal(err)
		}
		p.ResetCounts()
		p.Stall(true)
		t.Cleanup(func() { p.Stall(false) })
		closeWhileAcquireStuck(t, c, p, proxyComStmtExecute)
		if got := inspect(t, witness, "x"); got.Held {
			t.Fatalf("after the acquire that lost to Close: got %+v, want the name free", got)
		}
	})
}

// Close racing every kind of call, twice at once, leaves no lease behind:
// each acquire that lost to it gives its lease back, and every lease held
// is released.
func TestClient_Close_racingEveryCall(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		for round := range 20 {
			c := e.client(t, e.db, table)
			names := []string{fmt.Sprintf("%d-a", round), fmt.Sprintf("%d-b", round), fmt.Sprintf("%d-c", round)}
			var wg sync.WaitGroup
			wg.Add(6)
			for g := range 6 {
				go func() {
					defer wg.Done()
					for i := 0; ; i++ {
						err := randomCall(c, names[rand.N(len(names))], fmt.Sprintf("%d-once-%d-%d", round, g, i))
						if err != nil && !expectedDuringClose(err) {
							t.Errorf("round %d: unexpected error: %v", round, err)
						}
						if c.isClosed() {
							return
						}
					}
				}()
			}
			time.Sleep(rand.N(30 * time.Millisecond))
			var closeErrs [2]error
			wg.Add(len(closeErrs))
			for i := range closeErrs {
				go func() { defer wg.Done(); closeErrs[i] = c.Close() }()
			}
			wg.Wait()
			for _, err := range closeErrs {
				if err != nil {
					t.Errorf("round %d: Close: %v", round, err)
				}
			}
			rows, err := e.db.Query("SELECT name, owner FROM `" + table + "` WHERE kind = 'L' AND expires_at > UTC_TIMESTAMP(6)")
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var name, owner string
				if err := rows.Scan(&name, &owner); err != nil {
					t.Fatal(err)
				}
				t.Errorf("round %d: after Close, a live lease on %q under token %s", round, name, owner)
			}
			if err := rows.Close(); err != nil {
				t.Fatal(err)
			}
			// Each round reports only what it left.
			if _, err := e.db.Exec("DELETE FROM `" + table + "` WHERE kind = 'L'"); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// Issue 20, point 6. A Lock whose ValidUntil passed, though nobody took its
// name, is swept from the Client's registry as it grows; a Refresh that then
// finds the lease still its own makes it live again, and Close must release
// it.
func TestClient_Close_releasesLockRefreshedAfterSweep(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		c := e.client(t, e.db, table)
		witness := e.client(t, e.openDB(t), table)
		ctx := testCtx(t)
		l := mustAcquire(t, c, "swept", time.Minute)
		// ValidUntil is a lower bound on the client's clock: a slow reply can
		// leave it behind while the server's lease is still live. Make it so.
		l.mu.Lock()
		l.validUntil = time.Now().Add(-time.Millisecond)
		l.mu.Unlock()
		for i := range 64 { // enough Locks to make the registry sweep
			mustAcquire(t, c, fmt.Sprintf("other-%d", i), time.Minute)
		}
		if slices.Contains(c.Held(), "swept") {
			t.Fatal("the lapsed Lock was not swept: the test did not make the case")
		}
		if err := l.Refresh(ctx, time.Minute); err != nil {
			t.Fatalf("Refresh of a lapsed lease nobody took: got %v, want nil", err)
		}
		if !slices.Contains(c.Held(), "swept") {
			t.Error("Held after the Refresh: the Lock is missing")
		}
		if err := c.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if info := inspect(t, witness, "swept"); info.Held {
			t.Fatalf("after Close: %+v, want the name released", info)
		}
	})
}

// closeWhileAcquireStuck starts a TryAcquire of "x" on c, whose proxy p
// stalls, and once p has received command code, Close: Close must return,
// and the acquire too once p lets the command through, with ErrClosed.
func closeWhileAcquireStuck(t *testing.T, c *Client, p *proxy, code byte) {
	t.Helper()
	acquired := make(chan error, 1)
	go func() {
		_, err := c.TryAcquire(testCtx(t), "x", time.Minute)
		acquired <- err
	}()
	waitCommand(t, p, code)
	if err := within(t, "Close", c.Close); err != nil {
		t.Fatalf("Close: %v", err)
	}
	p.Stall(false)
	wantErrIs(t, within(t, "TryAcquire", func() error { return <-acquired }), ErrClosed)
}

// randomCall makes one call of the lease API, chosen at random, on name;
// onceName is for Once.
func randomCall(c *Client, name, onceName string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	pause := func() { time.Sleep(rand.N(3 * time.Millisecond)) }
	switch rand.N(8) {
	case 6: // a set left for Close to release (refused through Vitess)
		_, err := c.TryAcquireSet(ctx, []string{name, name + "-set"}, time.Minute)
		if errors.Is(err, errors.ErrUnsupported) {
			return nil
		}
		return err
	case 7:
		err := lockDo(c.AcquireSet(ctx, []string{name + "-set", name}, time.Minute))(ctx, func(_ context.Context, _ *Lock) error { pause(); return nil })
		if errors.Is(err, errors.ErrUnsupported) {
			return nil
		}
		return err
	case 0: // a lease left for Close to release
		_, err := c.TryAcquire(ctx, name, time.Minute)
		return err
	case 1:
		l, err := c.Acquire(ctx, name, time.Minute)
		if err != nil {
			return err
		}
		pause()
		return l.Release(ctx)
	case 2:
		l, err := c.TryAcquire(ctx, name, time.Minute)
		if err != nil {
			return err
		}
		kctx := l.KeepAlive(ctx)
		pause()
		if err := l.Refresh(ctx, time.Minute); err != nil {
			return err
		}
		err = l.Release(ctx)
		if kctx.Err() == nil {
			return errors.New("a keep-alive's context outlived Release")
		}
		return err
	case 3:
		return c.Do(ctx, name, time.Minute, func(_ context.Context, _ *Lock) error { pause(); return nil })
	case 4:
		_, err := c.Once(ctx, onceName, func(_ context.Context, _ *Lock) error { pause(); return nil })
		return err
	default:
		l, err := c.TryAcquire(ctx, name, time.Minute)
		if err != nil {
			return err
		}
		released := make(chan error, 1)
		go func() { released <- l.Release(ctx) }()
		kctx := l.KeepAlive(ctx) // racing the Release
		err = <-released
		if kctx.Err() == nil {
			return errors.New("a keep-alive's context outlived Release")
		}
		return err
	}
}

// expectedDuringClose reports whether err is one a call racing Close may
// return: the Client closed, the name held by another call, or a lease
// released by Close under it.
func expectedDuringClose(err error) bool {
	return errors.Is(err, ErrClosed) || errors.Is(err, ErrNotAcquired) || errors.Is(err, ErrNotHeld)
}
