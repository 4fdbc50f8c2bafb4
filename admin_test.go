package sqllock

import (
	"context"
	"database/sql/driver"
	"errors"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/go-sql-driver/mysql"
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
	cols := []string{"owner", "holder", "fence", "live", "us"}
	e.expectPrepare("lease")
	e.mock.ExpectQuery(e.sql("lease")).WithArgs("n").
		WillReturnRows(sqlmock.NewRows(cols).AddRow([]byte("tok"), "x:1", 77, true, 5_000_000))
	e.expectExec("release", []driver.Value{"n", "tok"}, errReply(mysql.ErrInvalidConn), okReply(0, 0))
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
