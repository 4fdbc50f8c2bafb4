package sqllock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
)

// Real-server tests of how a Client and its Locks begin and end: Close
// against the calls it races, prepares and waits that a dead connection
// holds up, and keep-alives against Release and Refresh. A stuck call is
// detected by a watchdog far longer than any healthy run needs: a liveness
// bound, not a timing claim.

// stuckLimit is how long a call may take, in these tests, before it counts
// as held up by another that waits on a stalled connection.
const stuckLimit = 20 * time.Second

// within runs f in a goroutine and returns its error, failing the test if f
// has not returned after stuckLimit.
func within(t *testing.T, what string, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(stuckLimit):
		t.Fatalf("%s still blocked after %v", what, stuckLimit)
		return nil
	}
}

// waitCommand waits until the proxy has received a command with code since
// its counts were reset.
func waitCommand(t *testing.T, p *proxy, code byte) {
	t.Helper()
	waitFor(t, stuckLimit, fmt.Sprintf("command 0x%02x at the proxy", code), func() bool {
		return p.Commands()[code] > 0
	})
}

// Once Release or Close is deleting the lease, a keep-alive started before
// has ended, and a KeepAlive called meanwhile returns a context that has
// ended: the name may be another's as soon as the DELETE commits, before its
// reply comes back.
func TestLock_KeepAlive_duringReleaseHasEnded(t *testing.T) {
	ends := []struct {
		name    string
		end     func(c *Client, l *Lock) error
		wantErr error // the cause the keep-alive's context ends with
	}{
		{"Release", func(_ *Client, l *Lock) error { return l.Release(context.Background()) }, ErrNotHeld},
		{"Close", func(c *Client, _ *Lock) error { return c.Close() }, ErrClosed},
	}
	for _, end := range ends {
		// With a keep-alive running already, and with none: then KeepAlive
		// would start the first renewer.
		for _, running := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/keep-alive running %v", end.name, running), func(t *testing.T) {
				eachServerEnv(t, func(t *testing.T, e *testEnv) {
					a, p := e.proxiedClient(t, e.newTable(t))
					ctx := testCtx(t)
					// Prepare the release statement, so that the DELETE is
					// the first command Release sends.
					if err := mustAcquire(t, a, "warm", time.Minute).Release(ctx); err != nil {
						t.Fatal(err)
					}
					l := mustAcquire(t, a, "k", time.Minute)
					var before context.Context
					if running {
						before = l.KeepAlive(context.Background())
					}

					p.ResetCounts()
					p.Stall(true)
					ended := make(chan error, 1)
					go func() { ended <- end.end(a, l) }()
					waitCommand(t, p, proxyComStmtExecute)
					liveBefore := running && before.Err() == nil
					kctx := l.KeepAlive(context.Background())
					live := kctx.Err() == nil
					p.Stall(false)
					if err := within(t, end.name, func() error { return <-ended }); err != nil {
						t.Fatalf("%s: %v", end.name, err)
					}
					if liveBefore {
						t.Errorf("the keep-alive started before %s: its context was live while the DELETE was on its way", end.name)
					}
					if live {
						t.Fatalf("KeepAlive while %s's DELETE was on its way: got a live context", end.name)
					}
					if running {
						wantErrIs(t, context.Cause(before), end.wantErr)
					}
					wantErrIs(t, context.Cause(kctx), end.wantErr)
				})
			})
		}
	}
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
			t.Parallel() // each waits out Close's bound on its own tables
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

// stalledClient returns a fresh Client whose every connection goes through
// a proxy, and the proxy, stalled; the stall ends when the test does.
func stalledClient(t *testing.T, e *testEnv) (*Client, *proxy) {
	t.Helper()
	c, p := e.proxiedClient(t, e.newTable(t))
	// A connection in the pool, so that the Client's first command reaches
	// the proxy; a new connection's handshake would stall before it.
	if err := c.db.PingContext(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	p.ResetCounts()
	p.Stall(true)
	t.Cleanup(func() { p.Stall(false) })
	return c, p
}

// A call that needs a statement another call is preparing on a dead
// connection waits only as long as its own context allows.
func TestClient_stuckPrepare_waitsEndWithTheirContext(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		c, p := stalledClient(t, e)
		go func() { _, _ = c.TryAcquire(testCtx(t), "x", time.Minute) }()
		waitCommand(t, p, proxyComQuery) // the first use's check (first_use)
		calls := []struct {
			name string
			call func(ctx context.Context) error
		}{
			{"TryAcquire", func(ctx context.Context) error { _, err := c.TryAcquire(ctx, "x", time.Minute); return err }},
			{"Acquire", func(ctx context.Context) error { _, err := c.Acquire(ctx, "y", time.Minute); return err }},
			{"Inspect", func(ctx context.Context) error { _, err := c.Inspect(ctx, "x"); return err }},
		}
		for _, call := range calls {
			t.Run(call.name, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
				defer cancel()
				err := within(t, call.name, func() error { return call.call(ctx) })
				wantErrIs(t, err, context.DeadlineExceeded)
			})
		}
	})
}

// A call waiting for a prepare whose caller gave up prepares anew under its
// own context, rather than failing with the other caller's context's error.
func TestClient_stuckPrepare_waiterOutlivesPreparer(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		c, p := stalledClient(t, e)
		ctx := testCtx(t)
		first, cancelFirst := context.WithCancel(ctx)
		firstDone := make(chan error, 1)
		go func() {
			_, err := c.TryAcquire(first, "x", time.Minute)
			firstDone <- err
		}()
		waitCommand(t, p, proxyComQuery)
		secondDone := make(chan error, 1)
		go func() {
			_, err := c.TryAcquire(ctx, "y", time.Minute)
			secondDone <- err
		}()
		time.Sleep(100 * time.Millisecond) // let it join the prepare
		cancelFirst()
		wantErrIs(t, within(t, "first TryAcquire", func() error { return <-firstDone }), context.Canceled)
		p.Stall(false)
		if err := within(t, "second TryAcquire", func() error { return <-secondDone }); err != nil {
			t.Fatalf("second TryAcquire: got %v, want nil", err)
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

// Close returns while a prepare hangs on a dead connection, and the prepare
// that completes after it leaves no statement open.
func TestClient_Close_notHeldUpByStuckPrepare(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		c, p := stalledClient(t, e)
		closeWhileAcquireStuck(t, c, p, proxyComQuery)
		for i := range c.stmts {
			if st := c.stmts[i].Load(); st != nil {
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

// A Refresh that waits for another Refresh of the same Lock, stuck on a dead
// connection, ends with its own context.
func TestLock_Refresh_waitEndsWithItsContext(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		c, p := e.proxiedClient(t, e.newTable(t))
		ctx := testCtx(t)
		l := mustAcquire(t, c, "r", time.Minute)
		if err := l.Refresh(ctx, time.Minute); err != nil {
			t.Fatal(err)
		}
		p.ResetCounts()
		p.Stall(true)
		t.Cleanup(func() { p.Stall(false) })
		go func() { _ = l.Refresh(ctx, time.Minute) }()
		waitCommand(t, p, proxyComStmtExecute)
		short, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		err := within(t, "Refresh", func() error { return l.Refresh(short, time.Minute) })
		wantErrIs(t, err, context.DeadlineExceeded)
	})
}

// A query whose statement Close closed under it (Once's check for a
// completion record, Inspect, List) reports ErrClosed, as a write does, not
// database/sql's "statement is closed".
func TestClient_query_statementClosedUnderIt(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		c := e.newClient(t)
		ctx := testCtx(t)
		st, err := c.stmt(ctx, qOnceDone)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		_, err = st.QueryContext(ctx, "job")
		if err == nil {
			t.Fatal("query on a statement Close closed: got no error")
		}
		wantErrIs(t, c.serverError("once", err), ErrClosed)
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
