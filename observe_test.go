package sqllock

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock/internal/fault"
	"github.com/sqllock/sqllock/observe"
)

// eventRecorder is an Observer that counts its events by a key that says what
// each event was: "acquire n held attempts=1", "end n lost", ...
type eventRecorder struct {
	mu       sync.Mutex
	counts   map[string]int
	acquires []observe.AcquireEvent
	ends     []observe.HoldEvent
	refresh  []observe.RefreshEvent
}

func newEventRecorder() *eventRecorder { return &eventRecorder{counts: map[string]int{}} }

func (r *eventRecorder) add(key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.counts[key]++
}

func (r *eventRecorder) observer() observe.Observer {
	return observe.Observer{
		AcquireDone: func(ev observe.AcquireEvent) {
			r.add(fmt.Sprintf("acquire %s %s attempts=%d", ev.Name, ev.Outcome, ev.Attempts))
			r.mu.Lock()
			r.acquires = append(r.acquires, ev)
			r.mu.Unlock()
		},
		HoldStart: func(ev observe.HoldEvent) { r.add(fmt.Sprintf("start %s", ev.Name)) },
		HoldEnd: func(ev observe.HoldEvent) {
			r.add(fmt.Sprintf("end %s %s", ev.Name, ev.End))
			r.mu.Lock()
			r.ends = append(r.ends, ev)
			r.mu.Unlock()
		},
		Refreshed: func(ev observe.RefreshEvent) {
			r.add(fmt.Sprintf("refresh %s %s", ev.Name, ev.Outcome))
			r.mu.Lock()
			r.refresh = append(r.refresh, ev)
			r.mu.Unlock()
		},
		Released: func(ev observe.ReleaseEvent) { r.add(fmt.Sprintf("release %s err=%t", ev.Name, ev.Err != nil)) },
		Retried: func(ev observe.RetryEvent) {
			r.add(fmt.Sprintf("retry %s %s %s", ev.Statement, ev.Name, ev.Outcome))
		},
		Unknown: func(ev observe.UnknownEvent) { r.add(fmt.Sprintf("unknown %s settled=%t", ev.Name, ev.Settled)) },
		Wakeup:  func(ev observe.WakeupEvent) { r.add(fmt.Sprintf("wakeup %s %s", ev.Name, ev.State)) },
	}
}

// want checks that the events counted are exactly want.
func (r *eventRecorder) want(t *testing.T, want map[string]int) {
	t.Helper()
	r.mu.Lock()
	got := maps.Clone(r.counts)
	r.mu.Unlock()
	if !maps.Equal(got, want) {
		t.Errorf("events:\n got %s\nwant %s", showCounts(got), showCounts(want))
	}
}

func showCounts(m map[string]int) string {
	var lines []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		lines = append(lines, fmt.Sprintf("%s ×%d", k, m[k]))
	}
	return "[" + strings.Join(lines, "; ") + "]"
}

// An uncontended acquire and release: one attempt, the hold's start and
// end, and the release, with the fence and times the Lock has.
func TestWithObserver_uncontendedPair(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		r := newEventRecorder()
		c := e.newClient(t, WithObserver(r.observer()))
		ctx := testCtx(t)
		before := time.Now()
		l, err := c.TryAcquire(ctx, "n", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		r.want(t, map[string]int{"acquire n acquired attempts=1": 1, "start n": 1})
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		r.want(t, map[string]int{"acquire n acquired attempts=1": 1, "start n": 1, "release n err=false": 1, "end n released": 1})
		ev := r.acquires[0]
		if ev.Fence != l.Fence() || ev.Err != nil || ev.Start.Before(before) || ev.Wait <= 0 || ev.Wait > time.Since(before) || ev.Ctx != ctx {
			t.Errorf("AcquireEvent: got %+v, want fence %d, no error, a wait within the call", ev, l.Fence())
		}
		if end := r.ends[0]; end.Fence != l.Fence() || end.TTL != time.Minute || end.Held <= 0 || end.Held > time.Since(before) {
			t.Errorf("HoldEnd: got %+v, want fence %d, ttl 1m, held within the test", end, l.Fence())
		}
		// A second Release sends nothing and ends nothing.
		wantErrIs(t, l.Release(ctx), ErrNotHeld)
		r.want(t, map[string]int{"acquire n acquired attempts=1": 1, "start n": 1, "release n err=false": 1, "end n released": 1})
	})
}

// A TryAcquire refused, an Acquire that waits out its context, then a
// TryAcquire that succeeds after the holder's Release.
func TestWithObserver_refusedThenAcquired(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		ctx := testCtx(t)
		holder := e.client(t, e.db, table)
		r := newEventRecorder()
		// One attempt, then a wait the context cuts.
		c := e.client(t, e.db, table, WithObserver(r.observer()), WithWakeups(0),
			WithRetry(LinearBackoff(time.Second)))
		h := mustAcquire(t, holder, "n", time.Minute)
		_, err := c.TryAcquire(ctx, "n", time.Minute)
		wantErrIs(t, err, ErrNotAcquired)
		made := time.Now()
		wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		_, err = c.Acquire(wctx, "n", time.Minute)
		cancel()
		wantErrIs(t, err, ErrNotAcquired)
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
		l := mustAcquire(t, c, "n", time.Minute)
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		r.mu.Lock()
		waited := r.acquires[1]
		r.mu.Unlock()
		// It waited until its context ended, 300 ms after it was made: the
		// call starts a little after that, so its Wait alone may fall a
		// fraction of a millisecond short of 300 ms (a CI run: 299.9 ms).
		if end := waited.Start.Add(waited.Wait); waited.Outcome != observe.OutcomeHeld || end.Before(made.Add(300*time.Millisecond)) || waited.Attempts != 1 {
			t.Errorf("the Acquire that waited: got %+v, want held until its context ended, 300ms after it was made, with 1 attempt", waited)
		}
		r.want(t, map[string]int{
			"acquire n held attempts=1":     2,
			"acquire n acquired attempts=1": 1,
			"start n":                       1, "release n err=false": 1, "end n released": 1,
		})
	})
}

// A lease taken over under KeepAlive: the renewal that finds it gone, one
// end (lost), and a Release after that which ends nothing more.
func TestWithObserver_leaseLostUnderKeepAlive(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		ctx := testCtx(t)
		skipFakeFor(t, e, "it changes the lease row by hand")
		// Each renewal has ttl/4 to answer: long enough on a loaded
		// machine, where one renewal that timed out ends as canceled. At a
		// load average of 20 none answered before the deadline: the lease
		// is then lost, rightly, and the test makes it again, on a fresh
		// Client, with the ttl doubled.
		var (
			r     *eventRecorder
			l     *Lock
			kctx  context.Context
			table string
			ttl   = 3 * time.Second
		)
		for {
			table, r = e.newTable(t), newEventRecorder()
			c := e.client(t, e.db, table, WithObserver(r.observer()))
			l = mustAcquire(t, c, "n", ttl)
			kctx = l.KeepAlive(ctx)
			// A renewal that succeeded, not any renewal: one that timed
			// out is an event too, and the takeover must come after a
			// success.
			renewed := func() bool {
				r.mu.Lock()
				defer r.mu.Unlock()
				return r.counts["refresh n acquired"] > 0
			}
			waitFor(t, 3*ttl, "a renewal, or the keep-alive's end", func() bool { return renewed() || kctx.Err() != nil })
			if renewed() {
				break
			}
			cause := context.Cause(kctx)
			if !errors.Is(cause, ErrLockLost) || errors.Is(cause, ErrNotHeld) || !strings.Contains(cause.Error(), "no renewal of") || ttl >= 12*time.Second {
				t.Fatalf("the keep-alive ended before any renewal succeeded: %v", cause)
			}
			t.Logf("no renewal of the %v lease answered in time under load (%v); made again with a longer one", ttl, cause)
			ttl *= 2
		}
		// Another owner takes the lease over, as after an expiry.
		if _, err := e.db.ExecContext(ctx, "UPDATE `"+table+"` SET owner = 'someone else' WHERE name = 'n' AND kind = 'L'"); err != nil {
			t.Fatal(err)
		}
		select {
		case <-kctx.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("the keep-alive's context is live 10s after the takeover")
		}
		wantErrIs(t, context.Cause(kctx), ErrLockLost)
		wantErrIs(t, l.Release(ctx), ErrNotHeld)
		r.mu.Lock()
		renewed := r.counts["refresh n acquired"]
		timedOut := r.counts["refresh n canceled"]
		first := r.refresh[slices.IndexFunc(r.refresh, func(ev observe.RefreshEvent) bool { return ev.Err == nil })]
		end := r.ends[0]
		r.mu.Unlock()
		if renewed < 1 {
			t.Fatalf("renewals: got %d, want at least 1", renewed)
		}
		// A keep-alive renews every ttl/3: about 2/3 of the lease is left.
		if first.Left <= 0 || first.Left > ttl || first.Took <= 0 || first.Err != nil {
			t.Errorf("first renewal: got %+v, want lease left in (0, %v]", first, ttl)
		}
		if first.TTL != ttl {
			t.Errorf("first renewal's TTL: got %v, want %v", first.TTL, ttl)
		}
		if !errors.Is(end.Err, ErrNotHeld) {
			t.Errorf("the end's error: got %v, want ErrNotHeld", end.Err)
		}
		want := map[string]int{
			"acquire n acquired attempts=1": 1, "start n": 1,
			"refresh n acquired": renewed, "refresh n held": 1,
			"end n lost":         1,
			"release n err=true": 1, // Release found it taken over
		}
		if timedOut > 0 {
			// A renewal starved past its attempt's time on a loaded
			// machine: retried, not a loss.
			want["refresh n canceled"] = timedOut
		}
		r.want(t, want)
	})
}

// Close with three leases held: each is released, and ends as closed.
func TestWithObserver_closeWithHeldLocks(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		r := newEventRecorder()
		c := e.newClient(t, WithObserver(r.observer()))
		names := []string{"a", "b", "c"}
		for _, n := range names {
			mustAcquire(t, c, n, time.Minute)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		want := map[string]int{}
		for _, n := range names {
			want["acquire "+n+" acquired attempts=1"] = 1
			want["start "+n] = 1
			want["release "+n+" err=false"] = 1
			want["end "+n+" closed"] = 1
		}
		r.want(t, want)
		// An acquire after Close sends nothing: it is reported, and takes
		// no lease.
		_, err := c.TryAcquire(testCtx(t), "d", time.Minute)
		wantErrIs(t, err, ErrClosed)
		want["acquire d closed attempts=0"] = 1
		r.want(t, want)
	})
}

// A release of one Client hands the name to another's Acquire waiting on
// the wake-up channel: the waiter's wait ends granted.
func TestWithObserver_wakeupHandoff(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipChannelsOnTiDB(t, e)
		table := e.newTable(t)
		ctx := testCtx(t)
		r := newEventRecorder()
		w := e.client(t, e.openDB(t), table, WithObserver(r.observer()))
		_, held, got := channelQueue(t, e, table, "n", w)
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
		l := mustGet(t, got)
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		r.want(t, map[string]int{
			"wakeup n granted":              1,
			"acquire n acquired attempts=2": 1, // refused once, then granted
			"start n":                       1, "release n err=false": 1, "end n released": 1,
		})
	})
}

// A deadlock rolls the acquire back twice; the third send takes the lease.
// sqlmock, since a real server deadlocks only by chance.
func TestWithObserver_retriedRollback(t *testing.T) {
	r := newEventRecorder()
	e := newMockEnv(t, WithObserver(r.observer()))
	tok := &tokenArg{}
	e.expectExec("acquire", acquireArgs("job", mockHolder, 60_000_000, tok),
		errReply(errDeadlock), errReply(errDeadlock), okReply(42, 1))
	l, err := e.c.TryAcquire(t.Context(), "job", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	e.done()
	if l.Fence() != 42 {
		t.Errorf("fence: got %d, want 42", l.Fence())
	}
	r.want(t, map[string]int{
		"retry acquire job rolled_back":   2,
		"acquire job acquired attempts=1": 1, "start job": 1,
	})
}

// A broken connection leaves an acquire's outcome unknown: the Client
// retires its token and deletes its lease, which settles it.
func TestWithObserver_unknownOutcomeSettled(t *testing.T) {
	r := newEventRecorder()
	e := newMockEnv(t, WithObserver(r.observer()))
	tok := &tokenArg{}
	// One send of unknown outcome (the resend is refused): the DELETE that
	// removes its lease settles it.
	e.expectExec("acquire", acquireArgs("job", mockHolder, 60_000_000, tok),
		errReply(mysql.ErrInvalidConn), errReply(errReadOnly))
	e.expectExec("release", releaseArgs("job", tok), okReply(0, 1))
	_, err := e.c.TryAcquire(t.Context(), "job", time.Minute)
	if err == nil {
		t.Fatal("TryAcquire: got nil, want the refusal")
	}
	e.done()
	r.want(t, map[string]int{
		"retry acquire job broken":       1,
		"unknown job settled=true":       1,
		"acquire job refused attempts=1": 1,
	})
}

// Several sends of unknown outcome: the DELETE that removes what one wrote
// does not settle the token, which is remembered.
func TestWithObserver_unknownOutcomeResent_notSettled(t *testing.T) {
	r := newEventRecorder()
	e := newMockEnv(t, WithObserver(r.observer()))
	tok := &tokenArg{}
	e.expectExec("acquire", acquireArgs("job", mockHolder, 60_000_000, tok),
		repeatReply(errReply(mysql.ErrInvalidConn), fault.MaxTransientAttempts)...)
	e.expectExec("release", releaseArgs("job", tok), okReply(0, 1))
	_, err := e.c.TryAcquire(t.Context(), "job", time.Minute)
	if err == nil {
		t.Fatal("TryAcquire: got nil, want the broken connection's error")
	}
	e.done()
	r.want(t, map[string]int{
		"retry acquire job broken":      fault.MaxTransientAttempts,
		"unknown job settled=false":     1,
		"acquire job broken attempts=1": 1,
	})
}

// An observer that panics in every func: each call goes on, the lease is
// taken and given back, and the panics are logged.
func TestWithObserver_panicking(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		var logs bytes.Buffer
		var mu sync.Mutex
		log := slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))
		boom := func(string) { panic("observer bug") }
		o := observe.Observer{
			AcquireDone: func(observe.AcquireEvent) { boom("") }, HoldStart: func(observe.HoldEvent) { boom("") },
			HoldEnd: func(observe.HoldEvent) { boom("") }, Released: func(observe.ReleaseEvent) { boom("") },
			Refreshed: func(observe.RefreshEvent) { boom("") },
		}
		c := e.newClient(t, WithObserver(o), WithLogger(log))
		ctx := testCtx(t)
		l := mustAcquire(t, c, "n", time.Minute)
		if err := l.Refresh(ctx, time.Minute); err != nil {
			t.Fatalf("Refresh: %v", err)
		}
		if got := c.Held(); !slices.Equal(got, []string{"n"}) {
			t.Errorf("Held: got %v, want [n]", got)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
		if got := c.Held(); len(got) != 0 {
			t.Errorf("Held after Release: got %v, want none", got)
		}
		l = mustAcquire(t, c, "n", time.Minute) // the name is free
		if err := c.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		mu.Lock()
		n := strings.Count(logs.String(), "an Observer func panicked")
		mu.Unlock()
		// acquire, start, refresh, release, end; acquire, start, release, end.
		if n != 9 {
			t.Errorf("panics logged: got %d, want 9", n)
		}
	})
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(p)
}

// An acquire's error is read as the Outcome its event reports.
func TestWithObserver_outcomeOfError(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want observe.Outcome
	}{
		{nil, observe.OutcomeAcquired},
		{fmt.Errorf("x: %w", ErrNotAcquired), observe.OutcomeHeld},
		{errors.Join(ErrNotAcquired, context.DeadlineExceeded), observe.OutcomeHeld},
		{context.Canceled, observe.OutcomeCanceled},
		{ErrClosed, observe.OutcomeClosed},
		{errDeadlock, observe.OutcomeRolledBack},
		{mysql.ErrInvalidConn, observe.OutcomeBroken},
		{errSyntax, observe.OutcomeFailed},
	} {
		if got := acquireOutcome(tc.err); got != tc.want {
			t.Errorf("acquireOutcome(%v): got %v, want %v", tc.err, got, tc.want)
		}
	}
}

// A lease left to lapse, which nobody took, ends as lapsed at its Release.
func TestWithObserver_lapsed(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		r := newEventRecorder()
		c := e.newClient(t, WithObserver(r.observer()))
		l := mustAcquire(t, c, "n", 50*time.Millisecond)
		time.Sleep(100 * time.Millisecond)
		if err := l.Release(testCtx(t)); err != nil {
			t.Fatal(err)
		}
		r.want(t, map[string]int{"acquire n acquired attempts=1": 1, "start n": 1, "release n err=false": 1, "end n lapsed": 1})
	})
}

// Observing costs no allocation: an acquire and release allocate as much
// with an Observer whose funcs do nothing as with none (BenchmarkObserver
// measures the time).
func TestWithObserver_noAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts vary under the race detector, which drops sync.Pool's items at random")
	}
	eachServerInTurn(t, func(t *testing.T, e *testEnv) {
		noop := observe.Observer{
			AcquireDone: func(observe.AcquireEvent) {}, HoldStart: func(observe.HoldEvent) {}, HoldEnd: func(observe.HoldEvent) {},
			Refreshed: func(observe.RefreshEvent) {}, Released: func(observe.ReleaseEvent) {}, Retried: func(observe.RetryEvent) {},
			Unknown: func(observe.UnknownEvent) {}, Wakeup: func(observe.WakeupEvent) {},
		}
		ctx := testCtx(t)
		// The least of three runs: one run in which the pool opens a
		// connection (a handshake is about 150 allocations) reads 3 more
		// per call on a loaded machine, observed or not.
		allocs := func(c *Client) float64 {
			mustAcquire(t, c, "warm", time.Second).Release(ctx)
			least := math.Inf(1)
			for range 3 {
				least = min(least, testing.AllocsPerRun(50, func() {
					l, err := c.TryAcquire(ctx, "n", time.Minute)
					if err != nil {
						t.Fatal(err)
					}
					if err := l.Release(ctx); err != nil {
						t.Fatal(err)
					}
				}))
			}
			return least
		}
		plain := allocs(e.newClient(t))
		observed := allocs(e.newClient(t, WithObserver(noop)))
		t.Logf("allocations per acquire and release: %v without an Observer, %v with a no-op one", plain, observed)
		if observed > plain {
			t.Errorf("allocations per acquire and release: got %v with a no-op Observer, want at most %v as without one", observed, plain)
		}
	})
}

// BenchmarkObserver_calls is the library's side of the events of one
// acquire and release (AcquireDone, HoldStart, Released, HoldEnd), without
// a server: with no Observer each costs a nil check.
func BenchmarkObserver_calls(b *testing.B) {
	noop := observe.Observer{
		AcquireDone: func(observe.AcquireEvent) {}, HoldStart: func(observe.HoldEvent) {}, HoldEnd: func(observe.HoldEvent) {},
		Released: func(observe.ReleaseEvent) {},
	}
	for _, v := range []struct {
		name string
		o    observe.Observer
	}{{"none", observe.Observer{}}, {"noop", noop}} {
		b.Run(v.name, func(b *testing.B) {
			c, err := New(&sql.DB{}, WithObserver(v.o))
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			a := acquireCall{c: c, name: "n", ttl: time.Minute, attempts: 1}
			l := newLock(c, "n", "t", 1, time.Minute, time.Now().Add(time.Minute))
			b.ReportAllocs()
			for b.Loop() {
				l.endObserved = false
				start := c.obsNow(c.obs.AcquireDone != nil)
				l.holdStarted()
				c.acquireDone(ctx, &a, start, l, nil)
				sent := c.obsNow(c.obs.Released != nil || c.obs.HoldEnd != nil)
				l.releaseDone(sent, nil)
			}
		})
	}
}

// A lease left to lapse ends as lapsed when the Client's registry of Locks
// grows to its sweep.
func TestWithObserver_lapsedSwept(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		r := newEventRecorder()
		c := e.newClient(t, WithObserver(r.observer()))
		mustAcquire(t, c, "lapses", 20*time.Millisecond) // the first add sweeps; the next sweep is at 64
		time.Sleep(50 * time.Millisecond)
		for i := range 63 {
			mustAcquire(t, c, fmt.Sprint("n", i), time.Minute)
		}
		r.mu.Lock()
		got := r.counts["end lapses lapsed"]
		r.mu.Unlock()
		if got != 1 {
			t.Errorf("ends of the lapsed lease: got %d, want 1", got)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		r.mu.Lock()
		starts, ends := 0, 0
		for k, n := range r.counts {
			switch {
			case strings.HasPrefix(k, "start "):
				starts += n
			case strings.HasPrefix(k, "end "):
				ends += n
			}
		}
		r.mu.Unlock()
		if starts != 64 || ends != 64 {
			t.Errorf("starts and ends: got %d and %d, want 64 of each", starts, ends)
		}
	})
}

// Goroutines acquire, keep alive and release while Close runs: every lease
// whose start was told has its end told once, whichever call ends it
// (run with -race).
func TestWithObserver_racingClose(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		var mu sync.Mutex
		held := map[uint64]int{} // fence: starts minus ends
		o := observe.Observer{
			HoldStart: func(ev observe.HoldEvent) { mu.Lock(); held[ev.Fence]++; mu.Unlock() },
			HoldEnd:   func(ev observe.HoldEvent) { mu.Lock(); held[ev.Fence]--; mu.Unlock() },
		}
		c := e.newClient(t, WithObserver(o), WithRetry(LinearBackoff(time.Millisecond)))
		ctx := testCtx(t)
		// The first use's proof first, under the test's context: on TiDB it
		// takes longer than the loop's 50 ms, so no Acquire there would
		// ever end it.
		l, err := c.TryAcquire(ctx, "first", time.Second)
		if err != nil {
			t.Fatalf("TryAcquire: %v", err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
		mu.Lock()
		clear(held)
		mu.Unlock()
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					actx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
					l, err := c.Acquire(actx, fmt.Sprint("n", (g+i)%3), time.Second)
					cancel()
					if errors.Is(err, ErrClosed) {
						return
					}
					if err != nil {
						continue
					}
					if i%2 == 0 {
						l.KeepAlive(ctx)
					}
					if i%3 != 0 { // the others are left for Close
						_ = l.Release(ctx)
					}
				}
			}()
		}
		// Close while they run, once a lease was taken (a loaded machine
		// can take none in the first 300 ms), and 300 ms on.
		waitFor(t, time.Minute, "a lease taken", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(held) > 0
		})
		time.Sleep(300 * time.Millisecond)
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		if len(held) == 0 {
			t.Fatal("no lease was taken")
		}
		for fence, n := range held {
			if n != 0 {
				t.Errorf("lease with fence %d: starts minus ends %d, want 0", fence, n)
			}
		}
	})
}

// The Observer's fields in a Lock keep it in its allocation size class, so
// that a Client without an Observer allocates no more bytes per acquire.
func TestWithObserver_lockSize(t *testing.T) {
	if got := unsafe.Sizeof(Lock{}); got > 208 {
		t.Errorf("size of a Lock: got %d bytes, want at most 208 (its size class)", got)
	}
}

// A server that refuses GET_LOCK turns the channels off, which is told
// once; the waiter's polls after it tell nothing of the channels.
func TestWithObserver_wakeupsOff(t *testing.T) {
	r := newEventRecorder()
	e := newMockEnv(t, WithRetry(LinearBackoff(time.Millisecond)), WithWakeups(defaultWakeups), WithObserver(r.observer()))
	e.wakeupConns()
	tok := &tokenArg{}
	args := acquireArgs("job", mockHolder, 1_000_000, tok)
	e.expectExec("acquire", args, okReply(0, 1))
	wait := withTable(strings.ReplaceAll(queries["wake_wait"], "'sqllock'", "'"+DefaultTable+"'"), DefaultTable)
	wait = strings.Replace(strings.Replace(wait, "?", "X'6a6f62'", 2), "?", "1", 1)
	e.mock.ExpectQuery(wait).WithoutArgs().WillReturnError(mysqlErr(fault.NotSupportedYet, "42000", "This version of MariaDB doesn't yet support 'GET_LOCK in cluster (WSREP_ON=ON)'"))
	e.expectExec("acquire", args, okReply(0, 1), okReply(0, 1), okReply(7, 1))
	if _, err := e.c.Acquire(t.Context(), "job", time.Second); err != nil {
		t.Fatal(err)
	}
	e.done()
	r.want(t, map[string]int{
		"wakeup  off":                     1,
		"acquire job acquired attempts=4": 1, "start job": 1,
	})
}

// recorder is a slog.Handler that keeps every record, for tests.
type recorder struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (h *recorder) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *recorder) WithGroup(string) slog.Handler            { return h }

func (h *recorder) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recs = append(h.recs, r.Clone())
	return nil
}

// newRecorder returns a recorder and a logger writing to it.
func newRecorder() (*recorder, Option) {
	h := &recorder{}
	return h, WithLogger(slog.New(h))
}

// find returns the records at level whose message contains msg and whose
// "name" attribute is name.
func (h *recorder) find(level slog.Level, msg, name string) []slog.Record {
	return slices.DeleteFunc(h.matching(level, msg), func(r slog.Record) bool { return attr(r, "name") != name })
}

// matching returns the records at level whose message contains msg,
// whatever their name.
func (h *recorder) matching(level slog.Level, msg string) []slog.Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []slog.Record
	for _, r := range h.recs {
		if r.Level == level && strings.Contains(r.Message, msg) {
			out = append(out, r)
		}
	}
	return out
}

// atLeast returns the records at level or above.
func (h *recorder) atLeast(level slog.Level) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, r := range h.recs {
		if r.Level >= level {
			out = append(out, r.Level.String()+" "+r.Message)
		}
	}
	return out
}

func attr(r slog.Record, key string) string {
	var v string
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v = a.Value.String()
			return false
		}
		return true
	})
	return v
}

func (h *recorder) waitFor(t *testing.T, level slog.Level, msg, name string) slog.Record {
	t.Helper()
	waitFor(t, 10*time.Second, level.String()+" "+msg, func() bool { return len(h.find(level, msg, name)) > 0 })
	return h.find(level, msg, name)[0]
}

// Operations that succeed log nothing at Info or above, so a service can
// leave Info on.
func TestWithLogger_quietOnSuccess(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		rec, opt := newRecorder()
		c := e.newClient(t, opt)
		ctx := testCtx(t)
		l := mustAcquire(t, c, "q", time.Minute)
		if err := l.Refresh(ctx, time.Minute); err != nil {
			t.Fatal(err)
		}
		inspect(t, c, "q")
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := c.Do(ctx, "q", time.Second, func(_ context.Context, _ *Lock) error { return nil }); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Once(ctx, "o", func(_ context.Context, _ *Lock) error { return nil }); err != nil {
			t.Fatal(err)
		}
		got := rec.atLeast(slog.LevelInfo)
		if e.oneRow() {
			// The one line that says, once, that this server's frozen
			// holders are not ended (internal/engine/tablecheck.go, chooseForms).
			got = slices.DeleteFunc(got, func(m string) bool { return strings.Contains(m, "frozen inside Lock.Check is not ended") })
		}
		// And the one line that says, once, that this server keeps no
		// session (session.go, noSessions): the Do's keep-alive may have
		// begun its first round.
		got = withoutNoSession(t, c, got)
		if len(got) > 0 {
			t.Fatalf("got records %q, want none at Info or above", got)
		}
	})
}

// withoutNoSession returns lines without the one that says the server
// keeps no session, failing t if there are more than one, or one where
// c keeps sessions.
func withoutNoSession(t *testing.T, c *Client, lines []string) []string {
	t.Helper()
	n := len(lines)
	lines = slices.DeleteFunc(lines, func(m string) bool { return strings.Contains(m, noSessionLine) })
	switch said := n - len(lines); {
	case said > 1:
		t.Fatalf("the line %q said %d times, want once at most", noSessionLine, said)
	case said == 1 && c.eng.Sessions():
		t.Fatalf("the line %q said on a server that keeps sessions", noSessionLine)
	}
	return lines
}

// A renewal that fails is a warning; giving the lease up is an error. The
// renewal is the Client's shared one first, whose failed statement is
// said once for all its leases, then the lease's own, said for the lease;
// which of them fails before the deadline depends on the machine's speed.
func TestWithLogger_keepAliveFailureAndLoss(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		rec, opt := newRecorder()
		c, p := e.proxiedClient(t, e.newTable(t), opt)
		// Renewals at 2 s, each with 1.5 s, the deadline at 5.4 s: a
		// stalled renewal fails, and is logged, before the deadline, also
		// at a load average of 13, where a 3 s lease let the deadline come
		// first (the tests run in parallel: the wait costs little).
		l := mustAcquire(t, c, "ka", 6*time.Second)
		kctx := l.KeepAlive(testCtx(t))
		p.Stall(true)
		defer p.Stall(false)
		<-kctx.Done()
		waitFor(t, 10*time.Second, "a warning that the renewal failed", func() bool {
			return len(rec.find(slog.LevelWarn, "lease renewal failed", "ka"))+len(rec.find(slog.LevelWarn, "shared renewal of leases failed", "")) > 0
		})
		r := rec.waitFor(t, slog.LevelError, "lease lost", "ka")
		if got := attr(r, "err"); !strings.Contains(got, "lock lost") {
			t.Errorf("loss record's err: got %q, want the cause", got)
		}
	})
}

// In an outage every lease renewing on its own fails each renewal: a
// Client logs at most one such line a second, and the next line written
// counts those left out (not_logged). Without the bound, 30 leases whose
// shared renewal failed wrote a line each within a second of each other.
func TestWithLogger_renewalFailuresAtMostOneASecond(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		rec, opt := newRecorder()
		c, p := e.proxiedClient(t, e.newTable(t), opt)
		// As in the test above: renewals at 2 s, each with 1.5 s, the
		// deadline at 5.4 s, so the leases' own renewals fail first.
		ctxs := make([]context.Context, 30)
		for i := range ctxs {
			ctxs[i] = mustAcquire(t, c, fmt.Sprintf("rl%02d", i), 6*time.Second).KeepAlive(testCtx(t))
		}
		stalled := time.Now()
		p.Stall(true)
		defer p.Stall(false)
		for _, ctx := range ctxs {
			<-ctx.Done()
		}
		took := time.Since(stalled)
		lines, notLogged := 0, 0
		for _, r := range rec.matching(slog.LevelWarn, "lease renewal failed") {
			lines++
			k, _ := strconv.Atoi(attr(r, "not_logged"))
			notLogged += k
		}
		if most := int(took/renewFailedEvery) + 1; lines > most {
			t.Fatalf("%d lines for leases' failed renewals in %v, want at most %d (one a second)", lines, took.Round(time.Millisecond), most)
		}
		if len(rec.find(slog.LevelError, "lease lost", "rl00")) != 1 {
			t.Errorf("lease rl00's loss: want one line of its own")
		}
		t.Logf("%d lines for failed renewals in %v, %d more left out", lines, took.Round(time.Millisecond), notLogged)
	})
}

// A lease taken from under its keep-alive is logged as lost.
func TestWithLogger_lossNotHeld(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		// Long enough that the renewal finds the lease gone before the
		// keep-alive's deadline, also on a loaded machine. At a load
		// average of 20 no renewal answered before a 3 s lease's deadline:
		// the loss was then, rightly, for that; the test makes it again,
		// with a fresh Client and the ttl doubled.
		for ttl := 3 * time.Second; ; ttl *= 2 {
			rec, opt := newRecorder()
			c := e.newClient(t, opt)
			l := mustAcquire(t, c, "evicted", ttl)
			kctx := l.KeepAlive(testCtx(t))
			if _, err := c.ForceRelease(testCtx(t), "evicted"); err != nil {
				t.Fatal(err)
			}
			<-kctx.Done()
			r := rec.waitFor(t, slog.LevelError, "lease lost", "evicted")
			got := attr(r, "err")
			if cause := context.Cause(kctx); !errors.Is(cause, ErrNotHeld) && strings.Contains(got, "no renewal of") && ttl < 12*time.Second {
				t.Logf("no renewal of the %v lease answered in time under load (%s); made again with a longer one", ttl, got)
				continue
			}
			if !strings.Contains(got, "not held") {
				t.Errorf("loss record's err: got %q, want not held", got)
			}
			return
		}
	})
}

// Elect logs changes of lead at Info, and its failed attempts as warnings.
func TestWithLogger_Elect(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		recA, optA := newRecorder()
		recB, optB := newRecorder()
		a := e.client(t, e.db, table, WithHolder("a"), optA)
		b, p := e.proxiedClient(t, table, WithHolder("b"), optB)
		ctx, cancel := context.WithCancel(testCtx(t))
		defer cancel()
		done := make(chan error, 2)
		lead := func(ctx context.Context, _ *Lock) error { <-ctx.Done(); return nil }
		go func() { done <- a.Elect(ctx, "boss", time.Second, Callbacks{OnStartedLeading: lead}) }()
		recA.waitFor(t, slog.LevelInfo, "took the lead", "boss")
		go func() { done <- b.Elect(ctx, "boss", time.Second, Callbacks{OnStartedLeading: lead}) }()
		if r := recB.waitFor(t, slog.LevelInfo, "new leader", "boss"); attr(r, "holder") != "a" {
			t.Errorf("b's new leader: got %q, want a", attr(r, "holder"))
		}
		p.Refuse(true)
		p.CutAll()
		recB.waitFor(t, slog.LevelWarn, "campaign attempt failed", "boss")
		p.Refuse(false)
		cancel()
		for range 2 {
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Errorf("Elect: got %v, want context.Canceled", err)
			}
		}
		recA.waitFor(t, slog.LevelInfo, "stepped down", "boss")
	})
}

// Close says which leases it released.
func TestWithLogger_Close(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		rec, opt := newRecorder()
		c := e.newClient(t, opt)
		mustAcquire(t, c, "c1", time.Minute)
		mustAcquire(t, c, "c2", time.Minute)
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"c1", "c2"} {
			if len(rec.find(slog.LevelInfo, "Close released", name)) != 1 {
				t.Errorf("%s: got no Info record of its release, want one", name)
			}
		}
	})
}

// A statement retried after a deadlock is logged at Debug.
func TestWithLogger_retry(t *testing.T) {
	rec, opt := newRecorder()
	e := newMockEnv(t, opt)
	tok := &tokenArg{}
	e.expectExec("acquire", acquireArgs("job", mockHolder, 60_000_000, tok), errReply(errDeadlock), okReply(42, 1))
	if _, err := e.c.TryAcquire(t.Context(), "job", time.Minute); err != nil {
		t.Fatal(err)
	}
	recs := rec.find(slog.LevelDebug, "retrying", "job")
	if len(recs) != 1 || attr(recs[0], "statement") != "acquire" {
		t.Fatalf("got %d Debug records, want one naming the acquire", len(recs))
	}
	// sqlmock's pool of one cannot prove the row lock: one line says so.
	if got := rec.atLeast(slog.LevelInfo); len(got) != len(notProven(rec)) {
		t.Errorf("got %q, want nothing at Info or above but what was not proven", got)
	}
	e.done()
}

// A lease written by a node whose clock runs ahead carries an acquired_at
// in the reading node's future: Inspect and List warn of it, at most once a
// minute per Client, and not of a lease whose acquired_at is its age. The
// lease is moved into the future by hand, as a node 2 s ahead would have
// written it (docs/faults-clusters.md measured the same signal on a
// Galera node under libfaketime).
func TestClient_warnsOfClockAhead(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		table := e.newTable(t)
		rec, logOpt := newRecorder()
		c := e.client(t, e.db, table, logOpt)
		ctx := testCtx(t)
		mustAcquire(t, c, "now", time.Minute)
		mustAcquire(t, c, "ahead", time.Minute)
		if _, err := c.Inspect(ctx, "now"); err != nil {
			t.Fatal(err)
		}
		if _, err := c.List(ctx); err != nil {
			t.Fatal(err)
		}
		warned := func(r *recorder) int {
			return len(r.find(slog.LevelWarn, "acquired ahead", "now")) + len(r.find(slog.LevelWarn, "acquired ahead", "ahead"))
		}
		if got := warned(rec); got != 0 {
			t.Fatalf("warnings for leases of this server's own clock: got %d, want 0", got)
		}

		if _, err := e.db.Exec("UPDATE `" + table + "` SET acquired_at = UTC_TIMESTAMP(6) + INTERVAL 2 SECOND WHERE name = 'ahead' AND kind = 'L'"); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Inspect(ctx, "ahead"); err != nil {
			t.Fatal(err)
		}
		got := rec.find(slog.LevelWarn, "acquired ahead", "ahead")
		if len(got) != 1 {
			t.Fatalf("warnings after Inspect of a lease 2 s ahead: got %d, want 1", len(got))
		}
		if d, err := time.ParseDuration(attr(got[0], "ahead")); err != nil || d < time.Second || d > 2*time.Second {
			t.Fatalf("the warning's ahead: got %q, want between 1s and 2s", attr(got[0], "ahead"))
		}
		if _, err := c.List(ctx); err != nil {
			t.Fatal(err)
		}
		if got := warned(rec); got != 1 {
			t.Fatalf("warnings after a List within the minute: got %d, want still 1", got)
		}

		// Another Client (another process) warns on its own, through List.
		rec2, logOpt2 := newRecorder()
		c2 := e.client(t, e.openDB(t), table, logOpt2)
		if _, err := c2.List(ctx); err != nil {
			t.Fatal(err)
		}
		if got := warned(rec2); got != 1 {
			t.Fatalf("warnings after List: got %d, want 1", got)
		}
	})
}
