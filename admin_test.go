package sqllock

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock/internal/sqltext"
	"github.com/sqllock/sqllock/sqllocktest"
)

// ForceRelease takes a live lease from another Client and says whose it
// was; by default the name stays taken by a lock-delay, which Inspect shows
// and a second forced release leaves as it is; the evicted holder's next
// renewal fails, and the next holder's fence is still higher.
func TestClient_ForceRelease(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		a := e.client(t, e.db, table, WithHolder("a"))
		b := e.client(t, e.openDB(t), table, WithHolder("b"))
		now := e.client(t, e.openDB(t), table, WithHolder("ops"), WithLockDelay(0))
		ctx := testCtx(t)
		la := mustAcquire(t, a, "stuck", time.Minute)

		got, err := b.ForceRelease(ctx, "stuck")
		if err != nil {
			t.Fatalf("ForceRelease: %v", err)
		}
		if got.Name != "stuck" || got.Holder != "a" || got.Fence != la.Fence() || !got.Held || got.TTL <= 30*time.Second {
			t.Fatalf("got %+v, want a's live lease with fence %d", got, la.Fence())
		}
		// About a minute left: a third of it, and 6 s.
		if want := defaultLockDelay(got.TTL); got.LockDelay > want || got.LockDelay < want-time.Second {
			t.Fatalf("LockDelay: got %v, want the default %v for %v left", got.LockDelay, want, got.TTL)
		}
		info := inspect(t, b, "stuck")
		if !info.Held || info.Holder != "lock-delay after a forced release of a" || info.Fence != la.Fence() ||
			info.TTL > got.LockDelay || info.TTL < got.LockDelay-10*time.Second {
			t.Fatalf("after: got %+v, want the lock-delay held, its %v left, and the fence kept", info, got.LockDelay)
		}
		wantErrIs(t, la.Refresh(ctx, time.Minute), ErrNotHeld)
		_, err = b.TryAcquire(ctx, "stuck", time.Minute)
		wantErrIs(t, err, ErrNotAcquired)

		again, err := b.ForceRelease(ctx, "stuck")
		if err != nil || again.Holder != info.Holder || !again.Held || again.LockDelay != again.TTL || again.TTL > info.TTL {
			t.Fatalf("a second ForceRelease: got %+v, %v, want the lock-delay left as it is", again, err)
		}
		freed, err := now.ForceRelease(ctx, "stuck")
		if err != nil || freed.Holder != info.Holder || !freed.Held || freed.LockDelay != 0 {
			t.Fatalf("ForceRelease with WithLockDelay(0): got %+v, %v, want the lock-delay released", freed, err)
		}
		lb := mustAcquire(t, b, "stuck", time.Minute)
		if lb.Fence() <= la.Fence() {
			t.Fatalf("next fence: got %d, want above %d", lb.Fence(), la.Fence())
		}

		_, err = b.ForceRelease(ctx, "never-taken")
		wantErrIs(t, err, ErrNotHeld)
		wantErrIs(t, lb.Release(ctx), nil)
		_, err = a.ForceRelease(ctx, "stuck")
		wantErrIs(t, err, ErrNotHeld)
	})
}

// An expired lease that nobody took over is released at once, reported as
// not live, with no lock-delay; the next holder's fence is higher.
func TestClient_ForceRelease_expired(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		c := e.newClient(t, WithHolder("gone"))
		l := mustAcquire(t, c, "lapsed", 20*time.Millisecond)
		time.Sleep(50 * time.Millisecond)
		got, err := c.ForceRelease(testCtx(t), "lapsed")
		if err != nil {
			t.Fatalf("ForceRelease: %v", err)
		}
		if got.Holder != "gone" || got.Held || got.TTL != 0 || got.Fence != l.Fence() || got.LockDelay != 0 {
			t.Fatalf("got %+v, want gone's expired lease, no lock-delay", got)
		}
		if info := inspect(t, c, "lapsed"); info.Held || info.Holder != "" {
			t.Fatalf("after: got %+v, want no lease", info)
		}
		if next := mustAcquire(t, c, "lapsed", time.Minute); next.Fence() <= l.Fence() {
			t.Fatalf("next fence: got %d, want above %d", next.Fence(), l.Fence())
		}
	})
}

// ResetOnce lets Once run its function again.
func TestClient_ResetOnce(t *testing.T) {
	eachEnv(t, func(t *testing.T, e *testEnv) {
		c := e.newClient(t)
		ctx := testCtx(t)
		runs := 0
		fn := func(context.Context, *Lock) error { runs++; return nil }
		once := func() bool {
			t.Helper()
			ran, err := c.Once(ctx, "seed", fn)
			if err != nil {
				t.Fatalf("Once: %v", err)
			}
			return ran
		}
		if reset, err := c.ResetOnce(ctx, "seed"); err != nil || reset {
			t.Fatalf("before any run: got %v, %v, want false, nil", reset, err)
		}
		if !once() || once() {
			t.Fatalf("Once twice: want it to run the first time only")
		}
		if reset, err := c.ResetOnce(ctx, "seed"); err != nil || !reset {
			t.Fatalf("after a run: got %v, %v, want true, nil", reset, err)
		}
		if !once() || runs != 2 {
			t.Fatalf("after reset: got %d runs, want 2", runs)
		}
	})
}

// A delete whose reply is lost, then retried with nothing left to delete,
// still reports the lease it released.
func TestClient_ForceRelease_lostReply(t *testing.T) {
	e := newMockEnv(t, WithLockDelay(0))
	ctx := context.Background()
	cols := []string{"owner", "holder", "fence", "live", "us", "attached"}
	e.expectPrepare("lease")
	e.mock.ExpectQuery(e.sql("lease")).WithArgs("n").
		WillReturnRows(sqlmock.NewRows(cols).AddRow([]byte("tok"), "x:1", 77, true, 5_000_000, false))
	// A live lease, not attached: force_release, sent as text.
	text := withTable(sqltext.Bind(queries["force_release"], sqltext.Hex("n"), sqltext.Hex("tok")), e.table)
	e.mock.ExpectExec(text).WillReturnError(mysql.ErrInvalidConn)
	e.mock.ExpectExec(text).WillReturnResult(sqlmock.NewResult(0, 0))
	e.mock.ExpectQuery(e.sql("lease")).WithArgs("n").WillReturnRows(sqlmock.NewRows(cols))
	got, err := e.c.ForceRelease(ctx, "n")
	if err != nil || got.Holder != "x:1" || got.Fence != 77 || !got.Held {
		t.Fatalf("got %+v, %v, want x:1's lease, nil", got, err)
	}
	e.done()
}

// Bad input is refused before anything is sent.
func TestClient_admin_badName(t *testing.T) {
	e := newMockEnv(t)
	ctx := context.Background()
	if _, err := e.c.ForceRelease(ctx, ""); err == nil || errors.Is(err, ErrNotHeld) {
		t.Fatalf("ForceRelease(\"\"): got %v, want a bad-name error", err)
	}
	if _, err := e.c.ResetOnce(ctx, string(make([]byte, MaxNameLen+1))); err == nil {
		t.Fatalf("ResetOnce(long name): got nil, want an error")
	}
	e.assertNothingPrepared()
}

// Inspect and List give a live lease's age by the server's clock, since its
// acquire: a renewal does not reset it.
func TestClient_leaseAge(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipFakeFor(t, e, "it moves acquired_at by hand")
		table := e.newTable(t)
		ctx := testCtx(t)
		c := e.client(t, e.db, table)
		l := mustAcquire(t, c, "aged", time.Minute)
		// As if acquired an hour ago.
		if _, err := e.db.ExecContext(ctx, "UPDATE `"+table+"` SET acquired_at = acquired_at - INTERVAL 1 HOUR WHERE name = 'aged' AND kind = 'L'"); err != nil {
			t.Fatal(err)
		}
		if err := l.Refresh(ctx, time.Minute); err != nil {
			t.Fatal(err)
		}
		info, err := c.Inspect(ctx, "aged")
		if err != nil {
			t.Fatal(err)
		}
		if info.Age < time.Hour || info.Age > time.Hour+time.Minute {
			t.Errorf("Inspect's Age: got %v, want about 1h", info.Age)
		}
		infos, err := c.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(infos) != 1 || infos[0].Age < time.Hour || infos[0].Age > time.Hour+time.Minute {
			t.Errorf("List: got %+v, want one lease about 1h old", infos)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if info, err := c.Inspect(ctx, "aged"); err != nil || info.Age != 0 {
			t.Errorf("Inspect after the release: got %+v, %v; want Age 0", info, err)
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

func TestClient_List(t *testing.T) {
	eachMockTable(t, func(t *testing.T, e *mockEnv) {
		e.expectQuery("list", nil, sqlmock.NewRows([]string{"name", "holder", "fence", "us", "ahead"}).
			AddRow("a", "h1", 7, 1_500_000, -500_000).
			AddRow("b", "h2", 0, 1, -1))
		got, err := e.c.List(t.Context())
		if err != nil {
			t.Fatalf("List: got %v, want nil", err)
		}
		want := []Info{
			{Name: "a", Holder: "h1", Fence: 7, Held: true, TTL: 1500 * time.Millisecond, Age: 500 * time.Millisecond},
			{Name: "b", Holder: "h2", Fence: 0, Held: true, TTL: time.Microsecond, Age: time.Microsecond},
		}
		if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
			t.Errorf("List: got %+v, want %+v", got, want)
		}
	})
}

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

// The evicted holder's release for a minimum hold, under the lock-delay
// that replaced its lease, finds the lease no longer its own: on MariaDB,
// whose strict mode failed FROM_BASE64 of the lock-delay's owner with 1958,
// it failed with that error instead, and a set's release too.
func TestClient_ForceRelease_evictedMinHoldRelease(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		a, b := e.twoClients(t)
		ctx := testCtx(t)
		err := a.Do(ctx, "nightly", time.Minute, func(context.Context, *Lock) error {
			_, err := b.ForceRelease(ctx, "nightly") // the lock-delay takes the lease's place
			return err
		}, WithMinHold(time.Hour))
		if !errors.Is(err, ErrNotHeld) && !errors.Is(err, ErrLockLost) {
			t.Fatalf("Do whose lease was forced away: got %v, want the lease no longer held", err)
		}
		if info, err := b.Inspect(ctx, "nightly"); err != nil || !info.Held || !strings.HasPrefix(info.Holder, lockDelayHolder) {
			t.Fatalf("after the evicted release: %+v, %v; want the lock-delay kept", info, err)
		}
	})
}

// A forced release never touches a lease someone took over between its
// read and its write: it reads again, and puts the lock-delay on that one.
func TestClient_ForceRelease_takenOverBetween(t *testing.T) {
	e := newMockEnv(t)
	ctx := context.Background()
	cols := []string{"owner", "holder", "fence", "live", "us", "attached"}
	tok, tok2 := strings.Repeat("a1", tokenBytes), strings.Repeat("b2", tokenBytes)
	e.expectPrepare("lease")
	e.mock.ExpectQuery(e.sql("lease")).WithArgs("n").
		WillReturnRows(sqlmock.NewRows(cols).AddRow([]byte(tok), "x:1", 77, true, 5_000_000, false))
	e.expectExec("lock_delay", []driver.Value{nil, sqlmock.AnyArg(), "lock-delay after a forced release of x:1", "n", tok}, okReply(0, 0))
	e.mock.ExpectQuery(e.sql("lease")).WithArgs("n").
		WillReturnRows(sqlmock.NewRows(cols).AddRow([]byte(tok2), "y:2", 78, true, 9_000_000, false))
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

func TestClient_Inspect_args(t *testing.T) {
	eachMockTable(t, func(t *testing.T, e *mockEnv) {
		e.expectInspect("job", sqlmock.NewRows([]string{"holder", "fence", "held", "ttl", "ahead", "min_hold"}))
		if _, err := e.c.Inspect(t.Context(), "job"); err != nil {
			t.Errorf("Inspect: got %v, want nil", err)
		}
	})
}

func TestClient_Inspect_result(t *testing.T) {
	cols := []string{"holder", "fence", "held", "ttl", "ahead", "min_hold"}
	tests := []struct {
		name string
		rows *sqlmock.Rows
		want Info
	}{
		{
			"held",
			sqlmock.NewRows(cols).AddRow([]byte("worker-1"), int64(42), int64(1), int64(1_500_000), int64(-500_000), int64(0)),
			Info{Name: "job", Holder: "worker-1", Fence: 42, Held: true, TTL: 1500 * time.Millisecond, Age: 500 * time.Millisecond},
		},
		{
			"kept by a minimum hold",
			sqlmock.NewRows(cols).AddRow([]byte("worker-1"), int64(42), int64(1), int64(1_500_000), int64(-500_000), int64(1)),
			Info{Name: "job", Holder: "worker-1", Fence: 42, Held: true, TTL: 1500 * time.Millisecond, Age: 500 * time.Millisecond, MinHold: true},
		},
		{
			"expired",
			sqlmock.NewRows(cols).AddRow([]byte("worker-1"), int64(42), int64(0), int64(-2_000_000), int64(-4_000_000), int64(1)),
			Info{Name: "job", Holder: "worker-1", Fence: 42},
		},
		{
			"released",
			sqlmock.NewRows(cols).AddRow(nil, int64(42), nil, nil, nil, nil),
			Info{Name: "job", Fence: 42},
		},
		{"never taken", sqlmock.NewRows(cols), Info{Name: "job"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newMockEnv(t)
			e.expectInspect("job", tt.rows)
			got, err := e.c.Inspect(t.Context(), "job")
			if err != nil || got != tt.want {
				t.Errorf("Inspect: got %+v, %v, want %+v, nil", got, err, tt.want)
			}
			e.done()
		})
	}
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
	// The first uses (and a slot's later proof) before the timed part: a
	// proof between the forced release's read and its write let a renewal
	// in between through vtgate, and the lock-delay then followed a longer
	// lease than the read saw.
	for i, c := range []*Client{a, b, ops} {
		if kind == "slot" {
			name := fmt.Sprint("warm-up", i)
			if _, err := c.Semaphore(name, 1).TryAcquire(ctx, time.Minute); err != nil {
				t.Fatal(err)
			}
			if _, err := ops.Semaphore(name, 1).ForceRelease(ctx, 1); err != nil {
				t.Fatal(err)
			}
			continue
		}
		warm(t, c)
	}
	if kind == "lock" {
		mustAcquire(t, a, "warm-up-force", time.Minute)
		if _, err := ops.ForceRelease(ctx, "warm-up-force"); err != nil {
			t.Fatal(err)
		}
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
	// The shared renewal's rounds fall on the process's own instants, not
	// the acquire's: the first renewal is awaited, so that the forced
	// release's read and write fall between two renewals. Slept ttl/2 from
	// the acquire, a round landed between them (CI, MySQL 9.7: a
	// lock-delay of 3.2 s for 4.0 s left at the read).
	first := evicted.ValidUntil()
	waitFor(t, 2*ttl, "a renewal of the evicted holder's lease", func() bool { return evicted.ValidUntil().After(first) })
	time.Sleep(ttl / 6)
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
