package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock/internal/fault"
)

// Real-server tests of the work run under a lease: keep-alive, Do, Check,
// Held, List and Close. Timings in them are correctness bounds with wide
// slack, never performance claims.

// heldLock returns the Lock c holds on name, as Do keeps it to itself.
func heldLock(t *testing.T, c *Client, name string) *Lock {
	t.Helper()
	c.held.mu.Lock()
	defer c.held.mu.Unlock()
	for l := range c.held.locks {
		if l.name == name {
			return l
		}
	}
	t.Fatalf("%q is not held", name)
	return nil
}

// pollAcquire makes b try to take name until it succeeds and returns when
// the successful attempt was sent: the takeover committed after that.
func pollAcquire(t *testing.T, b *Client, name string, ttl time.Duration) (*Lock, time.Time) {
	t.Helper()
	ctx := testCtx(t)
	for {
		sent := time.Now()
		l, err := b.TryAcquire(ctx, name, ttl)
		if err == nil {
			return l, sent
		}
		wantErrIs(t, err, ErrNotAcquired)
		time.Sleep(2 * time.Millisecond)
	}
}

// (a) With renewals blocked, fn's context is cancelled before another
// Client, polling the server directly, can take the name.
func TestDo_stalledRenewals_cancelBeforeTakeover(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		a, p := e.proxiedClient(t, table, WithHolder("a"))
		b := e.client(t, e.openDB(t), table, WithHolder("b"))
		const ttl = 1500 * time.Millisecond
		ctx := testCtx(t)

		started := make(chan struct{})
		told := make(chan time.Time, 1)
		var cause error
		done := make(chan error, 1)
		go func() {
			done <- a.Do(ctx, "job", ttl, func(ctx context.Context, _ *Lock) error {
				close(started)
				<-ctx.Done()
				told <- time.Now()
				cause = context.Cause(ctx)
				return ctx.Err()
			})
		}()
		<-started
		// One renewal goes through, then the network stops.
		l := heldLock(t, a, "job")
		acquired := l.ValidUntil()
		waitFor(t, 5*time.Second, "a renewal", func() bool { return l.ValidUntil().After(acquired) })
		p.Stall(true)
		stalled := time.Now()

		_, sent := pollAcquire(t, b, "job", 10*time.Second)
		var toldAt time.Time
		select {
		case toldAt = <-told:
		default:
			t.Fatalf("b took the name over %v after the stall and fn's context is still live", sent.Sub(stalled))
		}
		if !toldAt.Before(sent) {
			t.Fatalf("fn was told at %v, after b's winning attempt was sent at %v", toldAt, sent)
		}
		t.Logf("fn was told %v after the stall began, %v before b's winning attempt was sent", toldAt.Sub(stalled), sent.Sub(toldAt))

		p.Stall(false)
		err := <-done
		wantErrIs(t, err, ErrLockLost)
		wantErrIs(t, err, context.Canceled)
		wantErrIs(t, cause, ErrLockLost)
		if got := a.Held(); len(got) != 0 {
			t.Fatalf("Held after loss: got %v, want none", got)
		}
	})
}

// (b) One renewal fails, the network recovers: fn runs on, the lease and its
// fence unchanged.
func TestDo_renewalFailsOnce_leaseKept(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		a, p := e.proxiedClient(t, table, WithHolder("a"))
		// One connection, on which the renewal is prepared: the next renewal
		// is one command on it, not a dial or a prepare on another.
		a.db.SetMaxOpenConns(1)
		b := e.client(t, e.openDB(t), table, WithHolder("b"))
		const ttl = 2 * time.Second
		ctx := testCtx(t)

		started := make(chan struct{})
		finish := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- a.Do(ctx, "job", ttl, func(ctx context.Context, _ *Lock) error {
				close(started)
				select {
				case <-ctx.Done():
					return context.Cause(ctx)
				case <-finish:
					return nil
				}
			})
		}()
		<-started
		fence := inspect(t, b, "job").Fence

		// After one renewal has come back, the next reaches the proxy and is
		// held there; then its connection is cut, so it fails, and the
		// network comes back.
		l := heldLock(t, a, "job")
		acquired := l.ValidUntil()
		waitFor(t, 5*time.Second, "a renewal", func() bool { return l.ValidUntil().After(acquired) })
		p.ResetCounts()
		p.Stall(true)
		waitFor(t, 5*time.Second, "a renewal held by the stall", func() bool { return p.CommandCount() > 0 })
		time.Sleep(50 * time.Millisecond)
		p.CutAll()
		p.Stall(false)

		// Long enough that the lease would have lapsed without renewals.
		time.Sleep(ttl + ttl/2)
		select {
		case err := <-done:
			t.Fatalf("Do returned while renewals could recover: %v", err)
		default:
		}
		if got := inspect(t, b, "job"); !got.Held || got.Holder != "a" || got.Fence != fence {
			t.Fatalf("after a failed renewal: got %+v, want a's lease with fence %d", got, fence)
		}
		close(finish)
		if err := <-done; err != nil {
			t.Fatalf("Do: got %v, want nil", err)
		}
	})
}

// (c) Do releases with a context of its own after the caller's ended.
func TestDo_releasesAfterCallerCancel(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		a, b := e.twoClients(t)
		ctx, cancel := context.WithCancel(testCtx(t))
		started := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- a.Do(ctx, "job", time.Minute, func(ctx context.Context, _ *Lock) error {
				close(started)
				<-ctx.Done()
				return ctx.Err()
			})
		}()
		<-started
		cancel()
		wantErrIs(t, <-done, context.Canceled)
		if got := inspect(t, b, "job"); got.Held || got.Holder != "" {
			t.Fatalf("after Do: got %+v, want the lease released", got)
		}
		mustAcquire(t, b, "job", time.Second)
	})
}

// TryAcquire then Lock.Do does not wait and does not run fn when the name is held; Do waits.
func TestTryDo_notAcquired(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		a, b := e.twoClients(t)
		ctx := testCtx(t)
		l := mustAcquire(t, a, "job", time.Minute)
		ran := false
		err := lockDo(b.TryAcquire(ctx, "job", time.Second))(ctx, func(_ context.Context, _ *Lock) error { ran = true; return nil })
		wantErrIs(t, err, ErrNotAcquired)
		if ran {
			t.Fatal("Lock.Do ran fn without the lease")
		}
		time.AfterFunc(100*time.Millisecond, func() { l.Release(context.Background()) })
		if err := b.Do(ctx, "job", time.Second, func(_ context.Context, _ *Lock) error { ran = true; return nil }); err != nil || !ran {
			t.Fatalf("Do after the release: got %v, ran %v; want nil, true", err, ran)
		}
	})
}

// A panic in fn releases the lease and goes on.
func TestDo_panicReleases(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		a, b := e.twoClients(t)
		func() {
			defer func() {
				if r := recover(); r != "boom" {
					t.Fatalf("recovered %v, want the panic of fn", r)
				}
			}()
			a.Do(testCtx(t), "job", time.Minute, func(_ context.Context, _ *Lock) error { panic("boom") })
		}()
		if got := inspect(t, b, "job"); got.Held {
			t.Fatalf("after a panic in fn: got %+v, want the lease released", got)
		}
		if got := a.Held(); len(got) != 0 {
			t.Fatalf("Held: got %v, want none", got)
		}
	})
}

// (f) WithMinHold keeps another host out until acquired-at + d, then lets
// it in; a minimum that has passed releases at once.
func TestDo_WithMinHold(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		a, b := e.twoClients(t)
		ctx := testCtx(t)
		const minHold = 700 * time.Millisecond

		start := time.Now()
		if err := a.Do(ctx, "tick", time.Minute, func(_ context.Context, _ *Lock) error { return nil }, WithMinHold(minHold)); err != nil {
			t.Fatalf("Do: %v", err)
		}
		if got := inspect(t, b, "tick"); !got.Held || got.TTL > minHold {
			t.Fatalf("after Do: got %+v, want a lease of at most %v left", got, minHold)
		}
		// acquired_at is after start: an attempt answered before start +
		// minHold ran before the minimum passed and must be refused.
		for {
			_, err := b.TryAcquire(ctx, "tick", time.Second)
			replied := time.Now()
			if err == nil {
				if replied.Sub(start) < minHold {
					t.Fatalf("b acquired %v after a's acquire began, within the minimum hold %v", replied.Sub(start), minHold)
				}
				if waited := replied.Sub(start); waited > minHold+5*time.Second {
					t.Fatalf("b acquired only %v after a's acquire began, want soon after %v", waited, minHold)
				}
				break
			}
			wantErrIs(t, err, ErrNotAcquired)
			time.Sleep(5 * time.Millisecond)
		}

		// The minimum has passed when fn returns: nobody is kept out.
		err := a.Do(ctx, "late", time.Minute, func(_ context.Context, _ *Lock) error {
			time.Sleep(50 * time.Millisecond)
			return nil
		}, WithMinHold(10*time.Millisecond))
		if err != nil {
			t.Fatalf("Do: %v", err)
		}
		if got := inspect(t, b, "late"); got.Held {
			t.Fatalf("after a passed minimum: got %+v, want no live lease", got)
		}
		mustAcquire(t, b, "late", time.Second)
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

// Held lists this Client's live leases; List every live lease in the table.
func TestClient_Held_List(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		a, b := e.twoClients(t)
		ctx := testCtx(t)
		if got := a.Held(); len(got) != 0 {
			t.Fatalf("Held: got %v, want none", got)
		}
		lb := mustAcquire(t, a, "b", time.Minute)
		la := mustAcquire(t, a, "a", time.Minute)
		mustAcquire(t, a, "lapsed", 20*time.Millisecond)
		lc := mustAcquire(t, b, "c", time.Minute)
		released := mustAcquire(t, b, "released", time.Minute)
		if err := released.Release(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
		if got, want := a.Held(), []string{"a", "b"}; !slices.Equal(got, want) {
			t.Fatalf("Held: got %v, want %v", got, want)
		}
		if err := la.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if got, want := a.Held(), []string{"b"}; !slices.Equal(got, want) {
			t.Fatalf("Held after a release: got %v, want %v", got, want)
		}

		infos, err := b.List(ctx)
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		want := []Info{{Name: "b", Holder: "a", Fence: lb.Fence(), Held: true}, {Name: "c", Holder: "b", Fence: lc.Fence(), Held: true}}
		if len(infos) != len(want) {
			t.Fatalf("List: got %+v, want %+v", infos, want)
		}
		for i, got := range infos {
			if got.TTL <= 50*time.Second || got.TTL > time.Minute {
				t.Fatalf("List[%d].TTL: got %v, want just under a minute", i, got.TTL)
			}
			if got.Age < 0 || got.Age > 10*time.Second {
				t.Fatalf("List[%d].Age: got %v, want the time since its acquire", i, got.Age)
			}
			got.TTL, got.Age = 0, 0
			if got != want[i] {
				t.Fatalf("List[%d]: got %+v, want %+v", i, got, want[i])
			}
		}
	})
}

// Check in a transaction: a takeover of the expired lease waits until the
// transaction commits.
func TestLock_Check_takeoverWaitsForCommit(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		a, b := e.twoClients(t)
		ctx := testCtx(t)
		// Long enough that Check comes before the lapse on a loaded machine.
		l := mustAcquire(t, a, "rows", time.Second)
		tx := checkedTx(t, a, l)
		// The lease has expired by the server's clock, which decides the
		// takeover: ValidUntil is the client's earlier bound, and a loaded
		// machine can leave the row live past it by a slow round trip.
		time.Sleep(time.Until(l.ValidUntil()))
		waitServerExpired(t, a, "rows")

		type result struct {
			l   *Lock
			err error
			at  time.Time
		}
		took := make(chan result, 1)
		go func() {
			l, err := b.TryAcquire(ctx, "rows", time.Minute)
			took <- result{l, err, time.Now()}
		}()
		if e.variant.name == "optimistic" {
			// TiDB's optimistic transactions lock nothing before commit:
			// the takeover goes ahead, and the commit fails instead.
			r := <-took
			if r.err != nil {
				t.Fatalf("takeover: %v", r.err)
			}
			err := tx.Commit()
			if n, _ := fault.Errno(err); n != fault.TiDBWriteConflict {
				t.Fatalf("Commit after a takeover, optimistic: got %v, want TiDB's write conflict (9007)", err)
			}
			return
		}
		select {
		case r := <-took:
			t.Fatalf("takeover returned before the commit: %v, %v", r.l, r.err)
		case <-time.After(500 * time.Millisecond):
		}
		committed := time.Now()
		if err := tx.Commit(); err != nil {
			t.Fatalf("Commit: %v", err)
		}
		r := <-took
		if r.err != nil {
			t.Fatalf("takeover after the commit: %v", r.err)
		}
		if r.at.Before(committed) {
			t.Fatalf("takeover returned at %v, before the commit at %v", r.at, committed)
		}

		// Now the lease is b's: a's Check fails, and b's holds.
		tx2, err := a.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx2.Rollback()
		wantErrIs(t, l.Check(ctx, tx2), ErrNotHeld)
		// tx2 is on a's *sql.DB, not b's: any one on the same database does.
		if err := r.l.Check(ctx, tx2); err != nil {
			t.Fatalf("Check by the new holder: %v", err)
		}
		// The row lock holds up b's own release too, until tx2 ends.
		tx2.Rollback()
		if err := r.l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// waitServerExpired returns once the server's clock has passed the expiry of
// name's lease on c's table. Inspect is a plain read: it takes no row lock,
// so it does not wait on a transaction that wrote the row.
func waitServerExpired(t *testing.T, c *Client, name string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); inspect(t, c, name).Held; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the lease of %q is still live by the server's clock 10s on", name)
		}
	}
}

// Check writes the lease row in the caller's transaction, at every isolation
// level: a written row is what a multi-writer cluster certifies at commit,
// where a shared lock would be local to one node. Its answer does not change
// with the DSN, and a second Check in the same transaction answers the same.
func TestLock_Check_writesLeaseRow(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		for _, level := range isolationLevels {
			t.Run(level, func(t *testing.T) {
				db := e.isolated(t, level)
				c := e.client(t, db, table)
				ctx := testCtx(t)
				l := mustAcquire(t, c, level, time.Minute)
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback()
				// The write flips the lowest bit of acquired_at's microseconds,
				// and the transaction sees its own write.
				micro := func() int {
					t.Helper()
					var us int
					err := tx.QueryRowContext(ctx, "SELECT MICROSECOND(acquired_at) FROM `"+table+"` WHERE name = ? AND kind = 'L'", level).Scan(&us)
					if err != nil {
						t.Fatal(err)
					}
					return us
				}
				before := micro()
				for i, want := range []int{before ^ 1, before} {
					if err := l.Check(ctx, tx); err != nil {
						t.Fatalf("Check %d: got %v, want nil", i+1, err)
					}
					if got := micro(); got != want {
						t.Fatalf("after Check %d: got acquired_at's microseconds %d, want %d (written by the transaction)", i+1, got, want)
					}
				}
				if err := tx.Commit(); err != nil {
					t.Fatal(err)
				}
				if got := inspect(t, c, level); !got.Held || got.Fence != l.Fence() {
					t.Fatalf("after Check: got %+v, want the lease unchanged", got)
				}

				// Expired, and then taken over: not held. (A Check that finds
				// nothing may still lock the row it read, until the rollback.)
				short := mustAcquire(t, c, level+"-short", 20*time.Millisecond)
				time.Sleep(40 * time.Millisecond)
				for _, takeover := range []bool{false, true} {
					if takeover {
						mustAcquire(t, c, level+"-short", time.Minute)
					}
					tx, err := db.BeginTx(ctx, nil)
					if err != nil {
						t.Fatal(err)
					}
					wantErrIs(t, short.Check(ctx, tx), ErrNotHeld)
					if err := tx.Rollback(); err != nil {
						t.Fatal(err)
					}
				}
			})
		}
	})
}

// Check refuses a released Lock without asking the server.
func TestLock_Check_released(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		c := e.newClient(t)
		ctx := testCtx(t)
		l := mustAcquire(t, c, "n", time.Minute)
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		tx, err := c.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		wantErrIs(t, l.Check(ctx, tx), ErrNotHeld)
	})
}

// The keep-alive renews past the ttl, does not depend on the context it was
// started with, and its goroutine has exited when Release returns.
func TestLock_KeepAlive(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		a, b := e.twoClients(t)
		// Renewals every 500 ms, each with 375 ms to answer, 1.35 s before
		// the keep-alive gives up: margins a loaded machine keeps.
		const ttl = 1500 * time.Millisecond
		acqCtx, cancelAcq := context.WithCancel(testCtx(t))
		l, err := a.TryAcquire(acqCtx, "k", ttl)
		if err != nil {
			t.Fatal(err)
		}
		short := l.KeepAlive(acqCtx)
		kctx := l.KeepAlive(context.Background())
		cancelAcq() // pglock's trap: this must not stop the renewals
		<-short.Done()

		time.Sleep(2 * ttl)
		if err := kctx.Err(); err != nil {
			t.Fatalf("KeepAlive's context ended while renewals could succeed: %v", context.Cause(kctx))
		}
		if got := inspect(t, b, "k"); !got.Held || got.Fence != l.Fence() {
			t.Fatalf("after 2 ttl: got %+v, want the lease renewed with fence %d", got, l.Fence())
		}
		if err := l.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		select {
		case <-l.ka.done:
		default:
			t.Fatal("Release returned with the keep-alive goroutine running")
		}
		<-kctx.Done()
		cause := context.Cause(kctx)
		wantErrIs(t, cause, ErrNotHeld)
		if errors.Is(cause, ErrLockLost) {
			t.Fatalf("cause after Release: got %v, want one that is not ErrLockLost", cause)
		}
		// A KeepAlive after Release gives a context that has ended.
		if err := l.KeepAlive(context.Background()).Err(); err == nil {
			t.Fatal("KeepAlive after Release: got a live context")
		}
	})
}

// Many Do calls leave no goroutine behind.
func TestDo_noGoroutineLeak(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		c := e.newClient(t)
		ctx := testCtx(t)
		run := func() {
			for range 20 {
				if err := c.Do(ctx, "g", time.Second, func(_ context.Context, _ *Lock) error { return nil }); err != nil {
					t.Fatal(err)
				}
			}
		}
		run() // warm the pool and the statements
		before := runtime.NumGoroutine()
		run()
		var after int
		waitFor(t, 5*time.Second, "goroutines to settle", func() bool {
			after = runtime.NumGoroutine()
			return after <= before
		})
	})
}

// (d) Eight callers on four Clients: fn succeeds once; a failure hands the
// run to another caller; later calls run nothing.
func TestClient_Once(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		cs := make([]*Client, 4)
		for i := range cs {
			cs[i] = e.client(t, e.openDB(t), table, WithRetry(LinearBackoff(10*time.Millisecond)))
		}
		ctx := testCtx(t)
		for _, failFirst := range []bool{false, true} {
			name := "seed"
			if failFirst {
				name = "seed-after-failure"
			}
			var runs, running, overlap atomic.Int32
			boom := errors.New("boom")
			fn := func(ctx context.Context, _ *Lock) error {
				if running.Add(1) > 1 {
					overlap.Add(1)
				}
				defer running.Add(-1)
				n := runs.Add(1)
				time.Sleep(50 * time.Millisecond)
				if failFirst && n == 1 {
					return boom
				}
				return nil
			}
			type result struct {
				ran bool
				err error
			}
			results := make(chan result, 8)
			var wg sync.WaitGroup
			for i := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ran, err := cs[i%len(cs)].Once(ctx, name, fn)
					results <- result{ran, err}
				}()
			}
			wg.Wait()
			close(results)
			var ranOK, ranFailed int
			for r := range results {
				switch {
				case r.ran && r.err == nil:
					ranOK++
				case r.ran && errors.Is(r.err, boom):
					ranFailed++
				case !r.ran && r.err == nil:
				default:
					t.Fatalf("%s: Once returned %v, %v", name, r.ran, r.err)
				}
			}
			wantFailed := 0
			if failFirst {
				wantFailed = 1
			}
			if ranOK != 1 || ranFailed != wantFailed || int(runs.Load()) != 1+wantFailed || overlap.Load() != 0 {
				t.Fatalf("%s: got %d successful and %d failed runs (fn called %d times, %d overlapping), want 1 and %d",
					name, ranOK, ranFailed, runs.Load(), overlap.Load(), wantFailed)
			}
			if ran, err := cs[0].Once(ctx, name, fn); ran || err != nil || runs.Load() != int32(1+wantFailed) {
				t.Fatalf("%s: Once after success: got %v, %v, want false, nil and no run", name, ran, err)
			}
		}
	})
}

// A runner that died (its lease left to expire) is taken over.
func TestClient_Once_runnerDied(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		a, b := e.twoClients(t)
		ctx := testCtx(t)
		dead := mustAcquire(t, a, "init", 200*time.Millisecond) // never released
		ran, err := b.Once(ctx, "init", func(_ context.Context, _ *Lock) error { return nil })
		if !ran || err != nil {
			t.Fatalf("Once after a dead runner: got %v, %v, want true, nil", ran, err)
		}
		wantErrIs(t, dead.Release(ctx), ErrNotHeld)
		if ran, err := a.Once(ctx, "init", func(_ context.Context, _ *Lock) error { return errors.New("ran twice") }); ran || err != nil {
			t.Fatalf("Once after success: got %v, %v, want false, nil", ran, err)
		}
	})
}

// isolationLevels are the levels a session may run at, as the server's
// isolation variable spells them.
var isolationLevels = []string{"READ-COMMITTED", "REPEATABLE-READ", "SERIALIZABLE"}

// isolated returns a *sql.DB on the environment's DSN whose sessions run at
// level (one of isolationLevels).
func (e *testEnv) isolated(t testing.TB, level string) *sql.DB {
	t.Helper()
	if level == "SERIALIZABLE" && e.server.TiDB {
		t.Skipf("%s is %s: TiDB refuses SERIALIZABLE (error 8048)", e.server.Label, e.server.Version)
	}
	return e.openDBWith(t, func(c *mysql.Config) { setParam(c, isolationVariable(e.server), "'"+level+"'") })
}

// waitForStatements waits until n statements that mention table are running
// on other sessions, stably: that many are waiting for a row lock. (On
// MariaDB an acquire starts with SET STATEMENT: queries.sql, lock_wait_mariadb.
// Through Vitess the server runs vttablet's rewriting, which does not quote
// the table's name; vttestserver's one mysqld serves every shard.)
func waitForStatements(t *testing.T, db *sql.DB, table string, n int) {
	t.Helper()
	ctx := testCtx(t)
	stable := 0
	waitFor(t, 30*time.Second, fmt.Sprintf("%d statements on %s waiting", n, table), func() bool {
		var got int
		err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.PROCESSLIST "+
			"WHERE ID <> CONNECTION_ID() AND INFO LIKE CONCAT('%INSERT %INTO %', ?, '%')", table).Scan(&got)
		if err != nil {
			t.Fatal(err)
		}
		if got >= n {
			stable++
		} else {
			stable = 0
		}
		time.Sleep(50 * time.Millisecond)
		return stable >= 3
	})
}

// Once writes its record only while the lease row is its own, at every
// isolation level: under READ COMMITTED a plain read of the lease row inside
// the record's INSERT ... SELECT takes no lock. Here the record's write
// waits (on a lock of the record's key, held by another session) after the
// lease lapsed, and another Client comes to take the name over: whatever the
// order, fn runs once and one call reports it.
func TestClient_Once_recordOnlyWhileLeaseHeld(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		if e.variant.isolation != "" {
			t.Skip("each isolation level is a subtest of every other variant")
		}
		for _, level := range isolationLevels {
			t.Run(level, func(t *testing.T) { onceRecordRace(t, e, level) })
		}
	})
}

// onceRecordRace runs TestClient_Once_recordOnlyWhileLeaseHeld's race with
// both Clients' sessions at level.
func onceRecordRace(t *testing.T, e *testEnv, level string) {
	table := e.newTable(t)
	a := e.client(t, e.isolated(t, level), table, WithHolder("a"))
	b := e.client(t, e.isolated(t, level), table, WithHolder("b"),
		WithRetry(LinearBackoff(10*time.Millisecond)))
	ctx := testCtx(t)

	// Another session holds the lock of the record's key until rollback (in
	// a pessimistic transaction on TiDB, whose optimistic ones lock nothing
	// before commit).
	blocker, err := e.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Close()
	begin := "START TRANSACTION" // BEGIN opens a block under MariaDB's sql_mode=ORACLE
	if e.server.TiDB {
		begin = "BEGIN PESSIMISTIC"
	}
	if _, err := blocker.ExecContext(ctx, begin); err != nil {
		t.Fatal(err)
	}
	defer blocker.ExecContext(context.WithoutCancel(ctx), "ROLLBACK")
	if _, err := blocker.ExecContext(ctx, "INSERT INTO `"+table+"` (name, kind, owner, holder, fence, acquired_at, expires_at) VALUES ('job', 'D', 'x', 'blocker', 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))"); err != nil {
		t.Fatal(err)
	}

	var runs atomic.Int32
	type result struct {
		who string
		ran bool
		err error
	}
	results := make(chan result, 2)
	go func() {
		ran, err := a.Once(ctx, "job", func(ctx context.Context, _ *Lock) error {
			runs.Add(1)
			// The lease lapses, as if this process had stalled.
			_, err := e.db.ExecContext(ctx, "UPDATE `"+table+"` SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE name = 'job' AND kind = 'L'")
			return err
		})
		results <- result{"a", ran, err}
	}()
	waitForStatements(t, e.db, table, 1) // a's record waits
	go func() {
		ran, err := b.Once(ctx, "job", func(_ context.Context, _ *Lock) error {
			runs.Add(1)
			return nil
		})
		results <- result{"b", ran, err}
	}()
	// b waits too: for the lease row, or for the record's key.
	waitForStatements(t, e.db, table, 2)
	if _, err := blocker.ExecContext(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	reported, ran := 0, 0
	for range 2 {
		r := <-results
		if r.ran {
			ran++
		}
		if r.ran && r.err == nil {
			reported++
		} else if r.ran && !errors.Is(r.err, ErrLockLost) || !r.ran && r.err != nil {
			t.Errorf("%s: Once returned %v, %v", r.who, r.ran, r.err)
		}
	}
	// MySQL and MariaDB lock the lease row when the record's statement reads
	// it, so the takeover waits, finds the record and does not run fn. TiDB
	// locks nothing before commit: the takeover goes ahead and runs fn, and
	// the first record's commit must then fail, so that its call reports the
	// lost lease (ErrLockLost) rather than a second success.
	wantRuns := 1
	if e.server.TiDB {
		wantRuns = 2
	}
	if reported != 1 || runs.Load() != int32(ran) || ran != wantRuns {
		t.Fatalf("got %d calls reporting a run, %d saying fn ran, and fn run %d times, want 1, %d and %d", reported, ran, runs.Load(), wantRuns, wantRuns)
	}
	var owners int
	if err := e.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+table+"` WHERE name = 'job' AND kind = 'D'").Scan(&owners); err != nil || owners != 1 {
		t.Fatalf("got %d records, %v, want 1", owners, err)
	}
}

// A record written already (an earlier attempt whose reply was lost) counts
// as written; a lease that is not ours writes none.
func TestClient_Once_recordRetried(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		a, b := e.twoClients(t)
		ctx := testCtx(t)
		l := mustAcquire(t, a, "job", time.Minute)
		for i := range 2 {
			if err := l.recordOnce(ctx); err != nil {
				t.Fatalf("record, attempt %d: got %v, want nil", i+1, err)
			}
		}
		if ran, err := b.Once(ctx, "job", func(_ context.Context, _ *Lock) error { return errors.New("ran again") }); ran || err != nil {
			t.Fatalf("Once after the record: got %v, %v, want false, nil", ran, err)
		}

		lost := mustAcquire(t, a, "lost", 20*time.Millisecond)
		time.Sleep(40 * time.Millisecond)
		mustAcquire(t, b, "lost", time.Minute)
		wantErrIs(t, lost.recordOnce(ctx), ErrLockLost)
		if done, err := b.onceDone(ctx, "lost"); done || err != nil {
			t.Fatalf("record of a lost lease: got %v, %v, want none", done, err)
		}
	})
}

// Every statement that writes is safe for statement-based replication: with
// binlog_format=STATEMENT the server raises no Note 1592 for any of them,
// but those that take or extend a lease, whose session guard reads
// @@autocommit and SYSDATE() on purpose (queries.sql): for them the Note
// names just those, and binlog_format=MIXED logs them as rows.
func TestQueries_statementBinlogSafe(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		if e.server.TiDB {
			t.Skip("TiDB writes no binary log of statements (it replicates through its own change feed)")
		}
		c := e.newClient(t)
		ctx := testCtx(t)
		if _, err := c.stmt(ctx, qAcquire); err != nil { // the first use: the server's forms
			t.Fatal(err)
		}
		conn, err := e.db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		var logBin bool
		if err := conn.QueryRowContext(ctx, "SELECT @@log_bin").Scan(&logBin); err != nil {
			t.Fatal(err)
		}
		if !logBin {
			t.Skip("the server writes no binary log, so it judges no statement unsafe")
		}
		if _, err := conn.ExecContext(ctx, "SET SESSION binlog_format = 'STATEMENT'"); err != nil {
			t.Skipf("cannot set binlog_format here: %v", err)
		}
		defer conn.ExecContext(context.WithoutCancel(ctx), "SET SESSION binlog_format = DEFAULT")
		const tok, us = "0123456789abcdef0123456789abcdef", int64(60_000_000)
		acquire := []any{"n", tok, "h", us, "n", tok, "h", tok, us}
		if e.oneRow() { // through Vitess: tidb_acquire's arguments
			acquire = []any{"n", tok, "h", us}
		}
		for _, s := range []struct {
			q       int
			args    []any
			guarded bool
		}{
			{qAcquire, acquire, true},
			{qAcquire, acquire, true}, // the same owner again
			{qRefresh, []any{us, "n", tok}, true},
			{qCheck, []any{"n", tok}, false},
			{qOnceRecord, []any{"n", tok}, false},
			{qReleaseAtLeast, []any{us, "n", tok}, true},
			{qRelease, []any{"n", tok}, false},
		} {
			if _, err := conn.ExecContext(ctx, c.learned().sql[s.q], s.args...); err != nil {
				t.Fatalf("%s: %v", stmtNames[s.q], err)
			}
			rows, err := conn.QueryContext(ctx, "SHOW WARNINGS")
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var level, msg string
				var code int
				if err := rows.Scan(&level, &code, &msg); err != nil {
					t.Fatal(err)
				}
				if code == 1592 && !(s.guarded && guardUnsafe(msg)) {
					t.Errorf("%s: got Note 1592 (%s), want none", stmtNames[s.q], msg)
				}
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			rows.Close()
		}
	})
}

// (e) When the leader's network stops, another candidate leads within about
// one ttl, and only after the leader was told to stop.
func TestClient_Elect_handover(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		a, p := e.proxiedClient(t, table, WithHolder("a"))
		b := e.client(t, e.openDB(t), table, WithHolder("b"))
		// Renewals at 2 s leases: a keep-alive a loaded machine keeps until the stall.
		const ttl = 2 * time.Second
		ctx, cancel := context.WithCancel(testCtx(t))
		defer cancel()

		type event struct {
			who, what string
			at        time.Time
		}
		events := make(chan event, 100)
		callbacks := func(who string) Callbacks {
			return Callbacks{
				OnStartedLeading: func(ctx context.Context, _ *Lock) error {
					events <- event{who, "started", time.Now()}
					<-ctx.Done()
					events <- event{who, "told", time.Now()}
					return nil
				},
				OnStoppedLeading: func() { events <- event{who, "stopped", time.Now()} },
				OnNewLeader:      func(h string) { events <- event{who, "leader " + h, time.Now()} },
			}
		}
		next := func(want event) event {
			t.Helper()
			select {
			case ev := <-events:
				if ev.who != want.who || ev.what != want.what {
					t.Fatalf("got event %s %q, want %s %q", ev.who, ev.what, want.who, want.what)
				}
				return ev
			case <-time.After(10 * time.Second):
				t.Fatalf("no event after 10s, want %s %q", want.who, want.what)
				return event{}
			}
		}
		electDone := make(chan error, 2)
		go func() { electDone <- a.Elect(ctx, "leader", ttl, callbacks("a")) }()
		next(event{"a", "leader a", time.Time{}})
		next(event{"a", "started", time.Time{}})
		go func() { electDone <- b.Elect(ctx, "leader", ttl, callbacks("b")) }()
		next(event{"b", "leader a", time.Time{}})

		p.Stall(true)
		stalled := time.Now()
		told := next(event{"a", "told", time.Time{}})
		next(event{"b", "leader b", time.Time{}})
		started := next(event{"b", "started", time.Time{}})
		// About one ttl and a poll; the bound leaves room for a loaded
		// machine's delays.
		if handover := started.at.Sub(stalled); handover > 4*ttl {
			t.Fatalf("b led %v after a's network stopped, want within about one ttl (%v)", handover, ttl)
		}
		t.Logf("a was told %v after the stall, b led %v after it", told.at.Sub(stalled), started.at.Sub(stalled))

		p.Stall(false)
		next(event{"a", "stopped", time.Time{}})
		next(event{"a", "leader b", time.Time{}})
		cancel()
		next(event{"b", "told", time.Time{}})
		next(event{"b", "stopped", time.Time{}})
		for range 2 {
			wantErrIs(t, <-electDone, context.Canceled)
		}
		if got := inspect(t, b, "leader"); got.Held {
			t.Fatalf("after Elect returned: got %+v, want the lease released", got)
		}
	})
}

// guardUnsafe reports whether a Note 1592's reason is one the session guard
// gives: a system variable (@@autocommit) or a system function (SYSDATE()).
func guardUnsafe(msg string) bool {
	return strings.Contains(msg, "system variable") || strings.Contains(msg, "system function")
}
