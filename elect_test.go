package sqllock

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock/observe"
)

// Elect whose server is down the whole time returns its context's error
// wrapping the last error it met: the caller learns why it never led.
func TestClient_Elect_serverDown_returnsLastError(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		db := e.openDBWith(t, func(c *mysql.Config) { c.Addr = closedAddr(t) })
		c := e.client(t, db, "sqllock")
		ctx, cancel := context.WithTimeout(testCtx(t), 2*time.Second)
		defer cancel()
		err := c.Elect(ctx, "leader", time.Second, Callbacks{OnStartedLeading: func(_ context.Context, _ *Lock) error { return nil }})
		if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("Elect with no server: got %v, want DeadlineExceeded wrapping the refused connection", err)
		}
	})
}

// A candidate whose server is read-only (a replica during a failover) keeps
// campaigning, and leads once the server takes writes: on the tests' own
// server, which may be made read-only.
func TestClient_Elect_readOnlyServer_leadsAfter(t *testing.T) {
	if os.Getenv(ownServerEnv) == "" {
		t.Skipf("set %s when the test server is the tests' own, to make it read-only", ownServerEnv)
	}
	soleServer(t, "makes the server read-only under "+ownServerEnv)
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		c := e.client(t, limitedUser(t, e, table), table)
		setGlobal(t, e, "read_only", "ON", "OFF")
		ctx, cancel := context.WithCancel(testCtx(t))
		defer cancel()
		led := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- c.Elect(ctx, "leader", 200*time.Millisecond, Callbacks{
				OnStartedLeading: func(_ context.Context, _ *Lock) error { close(led); return nil },
			})
		}()
		time.Sleep(500 * time.Millisecond) // several refused attempts
		select {
		case <-led:
			t.Fatalf("led while the server was read-only")
		case err := <-done:
			t.Fatalf("Elect returned while the server was read-only: %v", err)
		default:
		}
		if _, err := e.db.Exec("SET GLOBAL read_only = OFF"); err != nil {
			t.Fatal(err)
		}
		select {
		case <-led:
		case err := <-done:
			t.Fatalf("Elect returned instead of leading: %v", err)
		case <-time.After(10 * time.Second):
			t.Fatalf("no lead 10s after the server took writes again")
		}
		cancel()
		wantErrIs(t, <-done, context.Canceled)
	})
}

// A candidate whose server turns read-only during a failover keeps
// campaigning, and leads once the server takes writes again.
func TestClient_Elect_readOnlyServer_campaignGoesOn(t *testing.T) {
	for _, tc := range passableErrors {
		t.Run(tc.name, func(t *testing.T) {
			e := newMockEnv(t)
			tok := &tokenArg{}
			// A ttl long enough that no renewal comes before the lead ends.
			args := acquireArgs("leader", mockHolder, 1_000_000, tok)
			e.expectExec("acquire", args, errReply(tc.err))
			e.expectInspect("leader", emptyInspect())
			e.expectExec("acquire", args, errReply(tc.err))
			e.expectInspect("leader", emptyInspect())
			e.expectExec("acquire", args, okReply(42, 1))
			e.expectExec("release", releaseArgs("leader", tok), okReply(0, 1))
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			led := false
			err := e.c.Elect(ctx, "leader", time.Second, Callbacks{
				OnStartedLeading: func(_ context.Context, _ *Lock) error { led = true; cancel(); return nil },
			})
			if !led {
				t.Fatalf("Elect: returned %v without leading", err)
			}
			assertErrIs(t, err, context.Canceled)
			e.done()
		})
	}
	t.Run("final error ends it", func(t *testing.T) {
		e := newMockEnv(t)
		e.expectExec("acquire", acquireArgs("leader", mockHolder, 40_000, &tokenArg{}), errReply(errNoSuchTable))
		err := e.c.Elect(t.Context(), "leader", 40*time.Millisecond, Callbacks{OnStartedLeading: func(_ context.Context, _ *Lock) error { return nil }})
		assertErrIs(t, err, errNoSuchTable)
		e.done()
	})
}

// Elect whose server never answered returns its context's error wrapping
// the last error it met, so the caller learns why it never led.
func TestClient_Elect_returnsLastError(t *testing.T) {
	// The context ends once an attempt was refused (the Observer hears
	// it), not after a fixed time: under -race beside other test groups
	// the mock's first answer took over a second.
	refused := make(chan struct{}, 1)
	e := newMockEnv(t, WithObserver(observe.Observer{AcquireDone: func(ev observe.AcquireEvent) {
		if errors.Is(ev.Err, errReadOnly) {
			select {
			case refused <- struct{}{}:
			default:
			}
		}
	}}))
	// The proof taken as made: its thirty statements through the mock's
	// unordered matching, under -race on a loaded machine, could use up
	// the 200ms below, and its cut would be the last error.
	e.c.markProven()
	e.proven = true
	e.expectPrepareError("acquire", errReadOnly)
	e.mock.MatchExpectationsInOrder(false)
	for range 1000 { // more than a second of campaigning sends
		e.mock.ExpectPrepare(e.sql("acquire")).WillReturnError(errReadOnly)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() {
		select {
		case <-refused:
		case <-ctx.Done():
		}
		cancel()
	}()
	err := e.c.Elect(ctx, "leader", 40*time.Millisecond, Callbacks{OnStartedLeading: func(_ context.Context, _ *Lock) error { return nil }})
	assertErrIs(t, err, context.Canceled, errReadOnly)
}

// Issue 20, point 7. An Elect whose attempt fails as its deadline passes,
// before the context says it ended, still returns the attempt's error, with
// the last refusal: the campaign reads the context once, as Acquire does,
// and the refusal is not mistaken for another leader's lease.
func TestClient_Elect_deadlinePassingMidAttempt_keepsLastError(t *testing.T) {
	e := newMockEnv(t)
	// The proof taken as made, as in TestClient_Elect_returnsLastError: under
	// load its statements could use up the 300ms, and its cut would be
	// the last error.
	e.c.markProven()
	e.proven = true
	e.expectPrepareError("acquire", errReadOnly)
	e.mock.MatchExpectationsInOrder(false)
	for range 200 {
		e.mock.ExpectPrepare(e.sql("acquire")).WillReturnError(errReadOnly)
		e.mock.ExpectPrepare(e.sql("inspect")).WillReturnError(errReadOnly)
	}
	parent, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	err := e.c.Elect(passedDeadline{parent}, "leader", 40*time.Millisecond, Callbacks{OnStartedLeading: func(_ context.Context, _ *Lock) error { return nil }})
	assertErrIs(t, err, context.DeadlineExceeded, errReadOnly)
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

// During the lock-delay a forced release leaves, a candidate sees no
// leader: OnNewLeader is not called with the lock-delay's holder, and one
// Info line says "no leader: lock-delay for N s after a forced release of
// X". Whoever leads after it is a new leader.
func TestClient_Elect_lockDelayIsNoLeader(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		a := e.client(t, e.db, table, WithHolder("a"))
		rec, opt := newRecorder()
		var delays atomic.Int32
		obs := WithObserver(observe.Observer{Retried: func(ev observe.RetryEvent) {
			if ev.Statement == "lock_delay" && ev.Outcome == observe.OutcomeHeld && strings.Contains(ev.Err.Error(), "no leader: lock-delay for") {
				delays.Add(1)
			}
		}})
		b := e.client(t, e.openDB(t), table, WithHolder("b"), opt, obs)
		ops := e.client(t, e.openDB(t), table, WithHolder("ops"), WithLockDelay(time.Minute))
		free := e.client(t, e.openDB(t), table, WithHolder("ops"), WithLockDelay(0))
		ctx, cancel := context.WithCancel(testCtx(t))
		defer cancel()
		mustAcquire(t, a, "boss", time.Minute)

		leaders := make(chan string, 10)
		done := make(chan error, 1)
		go func() {
			done <- b.Elect(ctx, "boss", time.Second, Callbacks{
				OnStartedLeading: func(ctx context.Context, _ *Lock) error { <-ctx.Done(); return nil },
				OnNewLeader:      func(h string) { leaders <- h },
			})
		}()
		next := func() string {
			t.Helper()
			select {
			case h := <-leaders:
				return h
			case <-ctx.Done():
				t.Fatal("no new leader before the test's deadline")
				return ""
			}
		}
		if h := next(); h != "a" {
			t.Fatalf("first leader: got %q, want a", h)
		}
		if _, err := ops.ForceRelease(ctx, "boss"); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "the lock-delay's log line", func() bool {
			select {
			case h := <-leaders:
				t.Fatalf("OnNewLeader(%q) during the lock-delay, want no call", h)
			default:
			}
			return len(rec.find(slog.LevelInfo, "no leader: lock-delay", "boss")) > 0
		})
		r := rec.find(slog.LevelInfo, "no leader: lock-delay", "boss")[0]
		if !regexp.MustCompile(`^sqllock: no leader: lock-delay for [1-6]?[0-9] s after a forced release of a$`).MatchString(r.Message) {
			t.Errorf("log: got %q, want no leader: lock-delay for about 60 s after a forced release of a", r.Message)
		}
		if delays.Load() != 1 {
			t.Errorf("Observer: got %d lock-delay events, want 1 (the metric's statement=lock_delay, outcome=held)", delays.Load())
		}
		if _, err := free.ForceRelease(ctx, "boss"); err != nil { // the lock-delay ends
			t.Fatal(err)
		}
		if h := next(); h != "b" {
			t.Errorf("leader after the lock-delay: got %q, want b", h)
		}
		cancel()
		<-done
		close(leaders)
		for h := range leaders {
			t.Errorf("OnNewLeader(%q) after b led, want no more", h)
		}
		if got := len(rec.find(slog.LevelInfo, "no leader: lock-delay", "boss")); got != 1 {
			t.Errorf("got %d lock-delay lines, want 1", got)
		}
	})
}
