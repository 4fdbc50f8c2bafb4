package sqllock

import (
	"context"
	"database/sql/driver"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/sqllock/sqllock/sqllocktest"
)

// The default lock-delay outlasts the evicted holder's next renewal and
// the safety margin its work has to stop, whatever the lease had left
// between two renewals (2ttl/3 to ttl), with time to spare for the round
// trips; and it never keeps the name longer than the lease would have.
func TestDefaultLockDelay_outlastsTheNextRenewal(t *testing.T) {
	for _, ttl := range []time.Duration{time.Second, 3 * time.Second, 10 * time.Second, 30 * time.Second,
		45 * time.Second, 50 * time.Second, time.Minute, 10 * time.Minute, time.Hour} {
		for i := 0; i <= 10; i++ {
			left := 2*ttl/3 + time.Duration(i)*(ttl/3)/10
			renewal := left - 2*ttl/3 // the next renewal reaches the server
			delay := defaultLockDelay(left)
			spare := delay - renewal - defaultSafetyMargin(ttl)
			if want := min(ttl/10, time.Second) - time.Microsecond; spare < want { // within rounding
				t.Errorf("ttl %v, %v left: delay %v, renewal in %v, margin %v: got %v to spare, want at least %v",
					ttl, left, delay, renewal, defaultSafetyMargin(ttl), spare, want)
			}
			if delay >= left {
				t.Errorf("ttl %v, %v left: got delay %v, want less than the lease left", ttl, left, delay)
			}
		}
	}
	if got := defaultLockDelay(-time.Second); got != 0 {
		t.Errorf("defaultLockDelay(-1s): got %v, want 0", got)
	}
}

func TestWithLockDelay_bad(t *testing.T) {
	db, _, err := sqlmock.New()
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, d := range []time.Duration{-time.Nanosecond, MaxTTL + 1} {
		if c, err := New(db, WithLockDelay(d)); c != nil || err == nil {
			t.Errorf("WithLockDelay(%v): got %v, %v, want an error", d, c, err)
		}
	}
}

// Issue 32: the holder evicted by a forced release, working under Do with
// its renewals, sees the loss before a second Client, trying all the while,
// gets the name, or the semaphore's slot; and the second Client's fence is
// higher.
func TestClient_ForceRelease_lockDelayStopsTheHolderFirst(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		for _, kind := range []string{"lock", "slot"} {
			t.Run(kind, func(t *testing.T) {
				if kind == "slot" {
					slotServer(t, e)
				}
				table := e.newTable(t)
				a := e.client(t, e.db, table, WithHolder("a"))
				b := e.client(t, e.openDB(t), table, WithHolder("b"))
				ops := e.client(t, e.openDB(t), table, WithHolder("ops"))
				evictedFirst(t, kind, a, b, ops)
			})
		}
	})
}

// evictedFirst is TestClient_ForceRelease_lockDelayStopsTheHolderFirst for
// a lock or a slot of a semaphore of one slot: a holds it, ops forces it
// free, b takes it.
func evictedFirst(t *testing.T, kind string, a, b, ops *Client) {
	ctx := testCtx(t)
	acquire := func(c *Client, ttl time.Duration) (*Lock, error) {
		if kind == "slot" {
			return c.Semaphore("job", 1).TryAcquire(ctx, ttl)
		}
		return c.TryAcquire(ctx, "job", ttl)
	}
	force := func() (Info, error) {
		if kind == "slot" {
			return ops.Semaphore("job", 1).ForceRelease(ctx, 1)
		}
		return ops.ForceRelease(ctx, "job")
	}
	// Renewals every 2 s: the forced release comes 1 s after one.
	const ttl = 6 * time.Second
	evicted, err := acquire(a, ttl)
	if err != nil {
		t.Fatal(err)
	}
	lost, done := make(chan time.Time, 1), make(chan error, 1)
	go func() {
		done <- evicted.Do(ctx, func(ctx context.Context, l *Lock) error {
			<-ctx.Done()
			lost <- time.Now()
			return context.Cause(ctx)
		})
	}()
	time.Sleep(ttl / 2)
	forced := time.Now()
	was, err := force()
	if err != nil {
		t.Fatalf("ForceRelease: %v", err)
	}
	// The lease left when the lock-delay was written: what the read saw,
	// less the time since (the first write's proof comes between).
	if hi, lo := defaultLockDelay(was.TTL), defaultLockDelay(was.TTL-time.Since(forced)); was.LockDelay > hi || was.LockDelay < lo {
		t.Errorf("LockDelay: got %v, want the default, %v to %v, for %v left at the read", was.LockDelay, lo, hi, was.TTL)
	}
	var next *Lock
	for next == nil {
		next, err = acquire(b, time.Minute)
		if err != nil && !errors.Is(err, ErrNotAcquired) {
			t.Fatalf("acquire: %v", err)
		}
		time.Sleep(2 * time.Millisecond)
	}
	taken := time.Now()
	var lostAt time.Time
	select {
	case lostAt = <-lost:
	default:
		t.Fatalf("the second Client took the %s %v after the forced release (lock-delay %v), while the evicted holder still worked",
			kind, taken.Sub(forced), was.LockDelay)
	}
	t.Logf("%s: lock-delay %v (%v left): the evicted holder saw the loss %v after the forced release, the next holder started %v after it",
		kind, was.LockDelay, was.TTL, lostAt.Sub(forced).Round(time.Millisecond), taken.Sub(forced).Round(time.Millisecond))
	if err := <-done; !errors.Is(err, ErrLockLost) || !errors.Is(err, ErrNotHeld) {
		t.Errorf("Do: got %v, want ErrLockLost from a renewal that found the lease not held", err)
	}
	if was.Fence != evicted.Fence() || next.Fence() <= was.Fence || next.Slot() != evicted.Slot() {
		t.Errorf("fences: got %d forced out (the Lock's %d), %d next (slot %d), want the next above, on the same slot", was.Fence, evicted.Fence(), next.Fence(), next.Slot())
	}
}

// WithLockDelay(0) frees a live lease at once, as a delete; WithLockDelay(d)
// keeps it taken exactly d, whatever the lease had left.
func TestClient_ForceRelease_WithLockDelay(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		a := e.client(t, e.db, table, WithHolder("a"))
		b := e.client(t, e.openDB(t), table, WithHolder("b"))
		ctx := testCtx(t)
		for _, d := range []time.Duration{0, 1500 * time.Millisecond, 3 * time.Minute} {
			ops := e.client(t, e.openDB(t), table, WithHolder("ops"), WithLockDelay(d))
			la := mustAcquire(t, a, "job", time.Minute)
			forced := time.Now()
			was, err := ops.ForceRelease(ctx, "job")
			if err != nil || !was.Held || was.Holder != "a" || was.LockDelay != d {
				t.Fatalf("WithLockDelay(%v): got %+v, %v, want a's live lease and a lock-delay of %[1]v", d, was, err)
			}
			if d == 0 {
				if info := inspect(t, b, "job"); info.Held || info.Holder != "" {
					t.Fatalf("WithLockDelay(0): got %+v, want no lease", info)
				}
			} else if info := inspect(t, b, "job"); !info.Held || info.TTL > d || info.TTL < d-5*time.Second {
				t.Fatalf("WithLockDelay(%v): got %+v, want the lock-delay with %[1]v left", d, info)
			}
			if d > time.Minute {
				// Longer than the lease had left: free it at once after all.
				if _, err := e.client(t, e.db, table, WithLockDelay(0)).ForceRelease(ctx, "job"); err != nil {
					t.Fatal(err)
				}
			}
			lb, err := b.Acquire(ctx, "job", time.Minute)
			if err != nil {
				t.Fatalf("Acquire after WithLockDelay(%v): %v", d, err)
			}
			if waited := time.Since(forced); d > 0 && d < time.Minute && waited < d {
				t.Errorf("WithLockDelay(%v): taken %v after the forced release, want %[1]v or more", d, waited)
			}
			if lb.Fence() <= la.Fence() {
				t.Errorf("next fence: got %d, want above %d", lb.Fence(), la.Fence())
			}
			wantErrIs(t, la.Release(ctx), ErrNotHeld)
			wantErrIs(t, lb.Release(ctx), nil)
		}
	})
}

// A lease released with a minimum hold, under which nothing works any more,
// is deleted by a forced release: no lock-delay.
func TestClient_ForceRelease_minHoldNoDelay(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		a, b := e.twoClients(t)
		ctx := testCtx(t)
		err := a.Do(ctx, "nightly", time.Minute, func(context.Context, *Lock) error { return nil }, WithMinHold(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		was, err := b.ForceRelease(ctx, "nightly")
		if err != nil || !was.Held || was.Holder != "a" || was.LockDelay != 0 {
			t.Fatalf("got %+v, %v, want a's held lease deleted, no lock-delay", was, err)
		}
		mustAcquire(t, b, "nightly", time.Minute)
	})
}

// A forced release never touches a lease someone took over between its
// read and its write: it reads again, and puts the lock-delay on that one.
func TestClient_ForceRelease_takenOverBetween(t *testing.T) {
	e := newMockEnv(t)
	ctx := context.Background()
	cols := []string{"owner", "holder", "fence", "live", "us"}
	tok, tok2 := strings.Repeat("a1", tokenBytes), strings.Repeat("b2", tokenBytes)
	e.expectPrepare("lease")
	e.mock.ExpectQuery(e.sql("lease")).WithArgs("n").
		WillReturnRows(sqlmock.NewRows(cols).AddRow([]byte(tok), "x:1", 77, true, 5_000_000))
	e.expectExec("lock_delay", []driver.Value{nil, sqlmock.AnyArg(), "lock-delay after a forced release of x:1", "n", tok}, okReply(0, 0))
	e.mock.ExpectQuery(e.sql("lease")).WithArgs("n").
		WillReturnRows(sqlmock.NewRows(cols).AddRow([]byte(tok2), "y:2", 78, true, 9_000_000))
	e.expectExec("lock_delay", []driver.Value{nil, sqlmock.AnyArg(), "lock-delay after a forced release of y:2", "n", tok2}, okReply(3_000_000, 1))
	got, err := e.c.ForceRelease(ctx, "n")
	if err != nil || got.Holder != "y:2" || got.Fence != 78 || !got.Held || got.LockDelay != 3*time.Second {
		t.Fatalf("got %+v, %v, want y:2's lease under a 3s lock-delay", got, err)
	}
	e.done()
}

// A lock-delay whose reply is lost, sent again and then finding the lease
// not the evicted holder's any more, is known by its owner: the forced
// release reports the lease it took and the lock-delay it left.
func TestClient_ForceRelease_lockDelayReplyLost(t *testing.T) {
	srv, err := sqllocktest.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if err := srv.CreateTable("t_lost"); err != nil {
		t.Fatal(err)
	}
	db := srv.DB()
	defer db.Close()
	ctx := testCtx(t)
	a, err := New(db, WithTable("t_lost"), WithHolder("a"))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ops, err := New(db, WithTable("t_lost"), WithHolder("ops"))
	if err != nil {
		t.Fatal(err)
	}
	defer ops.Close()
	la := mustAcquire(t, a, "job", time.Minute)
	if err := srv.Inject(sqllocktest.Fault{Statement: "lock_delay", Err: sqllocktest.ErrLostConnection, Applied: true}); err != nil {
		t.Fatal(err)
	}
	was, err := ops.ForceRelease(ctx, "job")
	if err != nil || was.Holder != "a" || was.Fence != la.Fence() || was.LockDelay < 20*time.Second || was.LockDelay > 27*time.Second {
		t.Fatalf("got %+v, %v, want a's lease and the default lock-delay of about 26s", was, err)
	}
	if info := inspect(t, ops, "job"); !info.Held || info.Holder != "lock-delay after a forced release of a" {
		t.Fatalf("after: got %+v, want the lock-delay", info)
	}
}
