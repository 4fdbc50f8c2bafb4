package sqllocktest_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/sqllocktest"
)

// Attempts to break the fake: faults in the middle of a Check transaction,
// and Clients racing Acquire, Release and Close on one fake under faults.

// A fault on the check, inside the user's transaction, must leave no row
// locked behind: the transaction is rolled back and a takeover need not wait.
func TestServer_faultMidCheck(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault sqllocktest.Fault
	}{
		{"lost before", sqllocktest.Fault{Statement: "check", Err: sqllocktest.ErrLostConnection}},
		{"lost after", sqllocktest.Fault{Statement: "check", Err: sqllocktest.ErrLostConnection, Applied: true}},
		{"deadlock", sqllocktest.Fault{Statement: "check", Err: sqllocktest.Deadlock}},
		{"down", sqllocktest.Fault{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := sqllocktest.New(t, sqllocktest.WithLockWaitTimeout(5*time.Second))
			holder, other := newClient(t, srv), newClient(t, srv)
			ctx := ctxFor(t)
			l, err := holder.TryAcquire(ctx, "job", time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			db := srv.DB()
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			if tc.fault.Err != nil {
				if err := srv.Inject(tc.fault); err != nil {
					t.Fatal(err)
				}
				if err := l.Check(ctx, tx); err == nil {
					t.Fatal("Check: got nil, want the injected error")
				}
			} else {
				if err := l.Check(ctx, tx); err != nil {
					t.Fatal(err)
				}
				srv.Down()
				srv.Up()
			}
			if err := tx.Commit(); err == nil && tc.name != "deadlock" {
				t.Fatal("Commit after the connection broke: got nil, want an error")
			}
			if err := srv.Expire("job"); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			if _, err := other.TryAcquire(ctx, "job", time.Minute); err != nil {
				t.Fatalf("takeover: %v", err)
			}
			if d := time.Since(start); d > time.Second {
				t.Fatalf("takeover waited %v for a row the broken transaction held", d)
			}
		})
	}
}

// A statement waiting for a Check transaction's row fails with 1205 after
// the lock wait timeout, and one whose context ends gives up at once.
func TestServer_lockWait(t *testing.T) {
	srv := sqllocktest.New(t, sqllocktest.WithLockWaitTimeout(100*time.Millisecond))
	holder := newClient(t, srv)
	ctx := ctxFor(t)
	l, err := holder.TryAcquire(ctx, "job", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	db := srv.DB()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := l.Check(ctx, tx); err != nil {
		t.Fatal(err)
	}
	// The holder's own refresh waits for its Check's transaction too: the
	// lock wait times out (1205), and the library sends it again until its
	// context ends.
	before := srv.Count("refresh")
	short, cancel := context.WithTimeout(ctx, 350*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := l.Refresh(short, time.Minute); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Refresh under an open Check: got %v, want DeadlineExceeded", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("the refresh's wait outlived its context by %v", d)
	}
	if n := srv.Count("refresh") - before; n < 2 {
		t.Fatalf("refreshes sent: got %d, want 2 or more (each timed out after 100ms)", n)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := l.Refresh(ctx, time.Minute); err != nil {
		t.Fatalf("Refresh after the commit: %v", err)
	}
}

// Clients racing for two names, waiting with and without wake-up channels,
// while faults fire, the server crashes and Clients close: never two holders
// of a name, and a name's fences grow.
func TestServer_raceUnderFaults(t *testing.T) {
	srv := sqllocktest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	names := []string{"a", "b"}
	var mu sync.Mutex
	holders := map[string]int{}
	last := map[string]uint64{}
	var acquired atomic.Int64

	stop := make(chan struct{})
	var faults sync.WaitGroup
	faults.Add(1)
	go func() {
		defer faults.Done()
		all := []sqllocktest.Fault{
			{Statement: "acquire", Err: sqllocktest.Deadlock},
			{Statement: "acquire", Err: sqllocktest.ErrLostConnection, Applied: true},
			{Statement: "acquire", Err: sqllocktest.ErrLostConnection},
			{Statement: "release", Err: sqllocktest.ErrLostConnection, Applied: true},
			{Statement: "refresh", Err: sqllocktest.LockWaitTimeout},
			{Statement: "wake_wait", Err: sqllocktest.ErrLostConnection},
		}
		for i := 1; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(3 * time.Millisecond):
			}
			if i%50 == 0 { // a crash now and then: every connection breaks
				srv.Down()
				time.Sleep(5 * time.Millisecond)
				srv.Up()
			}
			if err := srv.Inject(all[rand.IntN(len(all))]); err != nil {
				t.Error(err)
				return
			}
		}
	}()

	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := 0; ctx.Err() == nil; round++ {
				c := newClient(t, srv, sqllock.WithWakeups(4*(i%2)))
				for j := 0; j < 4 && ctx.Err() == nil; j++ {
					name := names[(i+j)%len(names)]
					l, err := c.Acquire(ctx, name, time.Second)
					if err != nil {
						if !errors.Is(err, context.DeadlineExceeded) {
							t.Errorf("Acquire: %v", err)
						}
						break
					}
					acquired.Add(1)
					mu.Lock()
					holders[name]++
					if holders[name] != 1 || l.Fence() <= last[name] {
						t.Errorf("%s: %d holders, fence %d after %d", name, holders[name], l.Fence(), last[name])
					}
					last[name] = l.Fence()
					mu.Unlock()
					time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
					mu.Lock()
					holders[name]--
					mu.Unlock()
					if j == 3 || rand.IntN(4) == 0 {
						c.Close() // releases what it holds; races the others' Acquires
						break
					}
					_ = l.Release(ctx) // a lost release leaves the lease to expire
				}
				c.Close()
			}
		}()
	}
	wg.Wait()
	close(stop)
	faults.Wait()
	if acquired.Load() < 20 {
		t.Fatalf("only %d acquisitions in 3 s", acquired.Load())
	}
	t.Logf("%d acquisitions", acquired.Load())
}

// Two Check transactions that wait for each other's rows: the second to
// wait is told 1213 and rolled back, as InnoDB's deadlock detector does.
func TestServer_deadlock(t *testing.T) {
	srv := sqllocktest.New(t)
	c := newClient(t, srv)
	ctx := ctxFor(t)
	la, err := c.TryAcquire(ctx, "a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	lb, err := c.TryAcquire(ctx, "b", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	db := srv.DB()
	tx1, _ := db.BeginTx(ctx, nil)
	defer tx1.Rollback()
	tx2, _ := db.BeginTx(ctx, nil)
	defer tx2.Rollback()
	if err := la.Check(ctx, tx1); err != nil {
		t.Fatal(err)
	}
	if err := lb.Check(ctx, tx2); err != nil {
		t.Fatal(err)
	}
	waiting := make(chan error, 1)
	go func() { waiting <- lb.Check(ctx, tx1) }()
	time.Sleep(20 * time.Millisecond) // tx1 waits for tx2's row
	if err := la.Check(ctx, tx2); err == nil || !strings.Contains(err.Error(), "1213") {
		t.Fatalf("the second wait: got %v, want error 1213", err)
	}
	if err := <-waiting; err != nil {
		t.Fatalf("the first wait, after the other was rolled back: %v", err)
	}
	if err := tx1.Commit(); err != nil {
		t.Fatal(err)
	}
}

// A server that refuses GET_LOCK (1235) leaves waiting Acquires to poll.
func TestServer_withoutGetLock(t *testing.T) {
	srv := sqllocktest.New(t, sqllocktest.WithoutGetLock())
	a, b := newClient(t, srv, sqllock.WithWakeups(4)), newClient(t, srv, sqllock.WithWakeups(4))
	ctx := ctxFor(t)
	l, err := a.TryAcquire(ctx, "job", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		_, err := b.Acquire(ctx, "job", time.Minute)
		got <- err
	}()
	// Release only once the waiter has been refused GET_LOCK: under load
	// its first attempt can come after a fixed sleep, find the name free
	// and never wait.
	for srv.Count("wake_wait") == 0 {
		if ctx.Err() != nil {
			t.Fatal("no wake_wait was sent: the refusal was not exercised")
		}
		time.Sleep(time.Millisecond)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("Acquire after the release, with GET_LOCK refused: %v", err)
	}
}

// Expire reaches a lease row that an open Check transaction holds: a
// rollback does not bring the lease back.
func TestServer_expireUnderCheck(t *testing.T) {
	srv := sqllocktest.New(t, sqllocktest.WithFrozenClock(time.Time{}))
	c := newClient(t, srv)
	ctx := ctxFor(t)
	l, err := c.TryAcquire(ctx, "job", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	db := srv.DB()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Check(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if err := srv.Expire("job"); err != nil {
		t.Fatal(err)
	}
	if info, err := c.Inspect(ctx, "job"); err != nil || info.Held {
		t.Fatalf("Inspect beside the open transaction: got %+v, %v; want the lease expired", info, err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if info, err := c.Inspect(ctx, "job"); err != nil || info.Held {
		t.Fatalf("Inspect after the rollback: got %+v, %v; want the lease expired", info, err)
	}
}

// A statement that fails after it waited inside the fake (a GET_LOCK whose
// context ended) undoes nothing: the writes committed while it waited stay.
// The fake once undid the last writing statement's rows then, and a release
// came back as a live lease.
func TestServer_failedWaitUndoesNoOtherWrite(t *testing.T) {
	srv := sqllocktest.New(t)
	ctx := ctxFor(t)
	p, h, w, o := newClient(t, srv), newClient(t, srv), newClient(t, srv), newClient(t, srv)
	// h takes "n" after waiting for p, so its Lock holds the channel.
	first, err := p.TryAcquire(ctx, "n", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *sqllock.Lock, 1)
	go func() {
		l, err := h.Acquire(ctx, "n", time.Minute)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	for srv.Count("wake_wait") < 1 {
		time.Sleep(time.Millisecond)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	<-got
	// w waits in GET_LOCK behind h's Lock, until its context ends.
	wctx, cancel := context.WithCancel(ctx)
	waited := make(chan error, 1)
	go func() {
		_, err := w.Acquire(wctx, "n", time.Minute)
		waited <- err
	}()
	for srv.Count("wake_wait") < 2 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	// Meanwhile a lease is taken and released.
	l, err := o.TryAcquire(ctx, "other", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-waited; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled wait: got %v, want context.Canceled", err)
	}
	info, err := o.Inspect(ctx, "other")
	if err != nil || info.Held {
		t.Errorf("Inspect of the released name after the failed wait: got %+v, %v; want not held", info, err)
	}
}
