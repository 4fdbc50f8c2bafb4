package sqllock

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/fault"
)

// wantToldAtOnce fails t unless kctx ended before l's lease could expire,
// for the renewal's answer, not for want of one in time: a deadline's loss
// says "no renewal of". (The time left once said so, two thirds of the
// ttl, until a loaded CI machine answered the mock's refresh 1.7 s late.)
func wantToldAtOnce(t *testing.T, l *Lock, kctx context.Context) {
	t.Helper()
	if left := time.Until(l.ValidUntil()); left <= 0 {
		t.Errorf("told %v after the lease could expire, want before", -left)
	}
	if cause := context.Cause(kctx); cause == nil || strings.Contains(cause.Error(), "no renewal of") {
		t.Errorf("cause: got %v, want the renewal's own answer, not the deadline's", cause)
	}
}

// keepAliveTTL is the lease of the keep-alive tests through the mock: each
// renewal has a quarter of it, and the retry after a failed one comes well
// before the deadline. Under -race on a loaded two-core machine a 3 s
// lease's 750 ms was too little for the mock to answer a prepare.
const keepAliveTTL = 9 * time.Second

// A renewal that fails with a final error (the table is gone) ends the
// keep-alive at once: no renewal can succeed before the deadline.
func TestLock_KeepAlive_finalErrorIsLoss(t *testing.T) {
	t.Parallel() // waits a third of a keepAliveTTL lease
	e := newMockEnv(t)
	tok := &tokenArg{}
	e.expectExec("acquire", acquireArgs("job", mockHolder, keepAliveTTL.Microseconds(), tok), okReply(42, 1))
	e.expectExec("refresh", refreshArgs(keepAliveTTL.Microseconds(), "job", tok), errReply(errNoSuchTable))
	l, err := e.c.TryAcquire(t.Context(), "job", keepAliveTTL)
	if err != nil {
		t.Fatal(err)
	}
	kctx := l.KeepAlive(t.Context())
	<-kctx.Done()
	wantToldAtOnce(t, l, kctx)
	assertErrIs(t, context.Cause(kctx), ErrLockLost, errNoSuchTable)
	e.done()
}

// The keep-alive's context is exact: once its deadline has passed it
// reports done, whether or not the keep-alive's timer has fired. These
// tests pass the deadline without letting the timer run, by moving the
// Lock's ValidUntil into the past behind the renewer's back, as a pause
// (SIGSTOP) longer than the lease does to a process's clock; pause_test.go
// stops a real process.

// Whichever of Err, Done, Cause and Value the work calls first after the
// deadline has passed, the context has ended before it returns, although
// the keep-alive's timer has not fired.
func TestLock_KeepAlive_contextExactAfterPause(t *testing.T) {
	for _, first := range []string{"Err", "Done", "Cause", "Value"} {
		t.Run(first, func(t *testing.T) {
			e := newMockEnv(t)
			l, kctx, derived, pause := pausedLease(t, e)
			if err := kctx.Err(); err != nil {
				t.Fatalf("Err before the deadline: got %v, want nil", err)
			}
			pause()
			switch first {
			case "Err":
				if kctx.Err() == nil {
					t.Fatal("Err: got nil, want the context ended")
				}
			case "Done":
				select {
				case <-kctx.Done():
				default:
					t.Fatal("Done: not closed")
				}
			case "Cause":
				if context.Cause(kctx) == nil {
					t.Fatal("Cause: got nil, want the loss")
				}
			case "Value":
				_ = kctx.Value(ctxKey{})
				// Value checks for the Go releases whose Cause reads through
				// Value alone: read the cancel context's state directly.
				if kctx.(*leaseContext).Context.Err() == nil {
					t.Fatal("after Value: the context has not ended")
				}
			}
			wantLostAtOnce(t, l, kctx, derived)
			e.done()
		})
	}
}

// A deadline a minute away ends nothing, however often the context is read.
func TestLock_KeepAlive_contextNotEarly(t *testing.T) {
	e := newMockEnv(t)
	_, kctx, derived, _ := pausedLease(t, e)
	for range 1000 {
		if err := context.Cause(kctx); err != nil {
			t.Fatalf("Cause with a minute of lease left: got %v, want nil", err)
		}
	}
	select {
	case <-kctx.Done():
		t.Fatal("Done: closed with a minute of lease left")
	case <-derived.Done():
		t.Fatal("derived Done: closed with a minute of lease left")
	default:
	}
	e.done()
}

// The context's check and the keep-alive's timer end the contexts with the
// same cause, but for the durations in it.
func TestLock_KeepAlive_contextCauseAsTimers(t *testing.T) {
	e := newMockEnv(t)
	causes := map[string]string{}
	for _, path := range []string{"context", "timer"} {
		l, kctx, _, pause := pausedLease(t, e)
		pause()
		if path == "timer" {
			l.ka.moved <- struct{}{} // the renewer moves its timer to the past deadline
			<-l.ka.done
		}
		// Read once the renewer has exited: through the check for "context".
		causes[path] = context.Cause(kctx).Error()
	}
	digits := regexp.MustCompile(`[0-9.]+(ms|s)`)
	ctxCause, timerCause := digits.ReplaceAllString(causes["context"], "D"), digits.ReplaceAllString(causes["timer"], "D")
	if ctxCause != timerCause {
		t.Errorf("cause by the context's check: %q\nby the timer: %q\nwant the same", causes["context"], causes["timer"])
	}
	e.done()
}

// BenchmarkLeaseContext_Err measures what the exact check adds to a
// context's Err, next to the cancel context it wraps.
func BenchmarkLeaseContext_Err(b *testing.B) {
	b.Run("plain", func(b *testing.B) {
		ctx, cancel := context.WithCancelCause(context.Background())
		defer cancel(nil)
		b.ReportAllocs()
		for b.Loop() {
			if ctx.Err() != nil {
				b.Fatal("ended")
			}
		}
	})
	b.Run("lease", func(b *testing.B) {
		l := newLock(&Client{}, "n", strings.Repeat("a", 32), 1, time.Hour, time.Now().Add(time.Hour))
		ctx := l.keepAlive(context.Background(), time.Second)
		defer l.stopKeepAlive(l.ka)
		b.ReportAllocs()
		for b.Loop() {
			if ctx.Err() != nil {
				b.Fatal("ended")
			}
		}
	})
}

// KeepAlive on a Lock whose release has started, that was released, or
// whose lease was lost returns a context that has ended, and ends it
// without calling its parent under the Lock's mutex: ending a child calls
// its parent's Done, and a parent that is the Lock's own context (one fn
// passes back to KeepAlive) takes that mutex in its check.
func TestLock_KeepAlive_endedCallsParentOutsideMutex(t *testing.T) {
	for _, state := range []string{"releasing", "released", "lost"} {
		t.Run(state, func(t *testing.T) {
			e := newMockEnv(t)
			l, _, _, pause := pausedLease(t, e)
			switch state {
			case "releasing":
				l.mu.Lock()
				l.endCause = l.releasedCause()
				l.mu.Unlock()
			case "released":
				l.mu.Lock()
				l.released = true
				l.mu.Unlock()
			case "lost":
				pause()
				l.expire(l.ka)
			}
			parent, cancel := context.WithCancel(context.Background())
			defer cancel()
			probe := &probeCtx{Context: parent, l: l}
			ctx := l.KeepAlive(probe)
			if ctx.Err() == nil {
				t.Fatal("Err: got nil, want the context ended")
			}
			if probe.underMutex.Load() {
				t.Error("the parent's Done was called under the Lock's mutex")
			}
		})
	}
}

// The keep-alive renews past the ttl, does not depend on the context it was
// started with, and its goroutine has exited when Release returns.
func TestLock_KeepAlive(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		a, b := e.twoClients(t)
		warm(t, a, b)
		// Renewals every 500 ms, each with 375 ms to answer, 1.35 s before
		// the keep-alive gives up. A loaded machine (load average 15) may
		// answer none in time: the lease is then lost, rightly, and made
		// again with the ttl doubled.
		var (
			l    *Lock
			kctx context.Context
			name string
		)
		for ttl := 1500 * time.Millisecond; ; ttl *= 2 {
			name = fmt.Sprint("k", ttl)
			acqCtx, cancelAcq := context.WithCancel(testCtx(t))
			var err error
			l, err = a.TryAcquire(acqCtx, name, ttl)
			if err != nil {
				t.Fatal(err)
			}
			short := l.KeepAlive(acqCtx)
			kctx = l.KeepAlive(context.Background())
			cancelAcq() // pglock's trap: this must not stop the renewals
			<-short.Done()

			time.Sleep(2 * ttl)
			err = kctx.Err()
			if err == nil {
				break
			}
			if cause := context.Cause(kctx); !lostForNoRenewal(cause) || ttl >= 6*time.Second {
				t.Fatalf("KeepAlive's context ended while renewals could succeed: %v", cause)
			}
			t.Logf("no renewal of the %v lease answered in time under load; made again with a longer one", ttl)
		}
		if got := inspect(t, b, name); !got.Held || got.Fence != l.Fence() {
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

// A renewal that finds the lease gone ends the keep-alive's contexts with
// ErrLockLost at once, well before the deadline.
func TestLock_KeepAlive_notHeldIsLoss(t *testing.T) {
	t.Parallel() // waits a third of a keepAliveTTL lease
	e := newMockEnv(t)
	tok := &tokenArg{}
	e.expectExec("acquire", acquireArgs("job", mockHolder, keepAliveTTL.Microseconds(), tok), okReply(42, 1))
	e.expectExec("refresh", refreshArgs(keepAliveTTL.Microseconds(), "job", tok), okReply(0, 0))
	l, err := e.c.TryAcquire(t.Context(), "job", keepAliveTTL)
	if err != nil {
		t.Fatal(err)
	}
	kctx := l.KeepAlive(t.Context())
	<-kctx.Done()
	wantToldAtOnce(t, l, kctx)
	assertErrIs(t, context.Cause(kctx), ErrLockLost, ErrNotHeld)
	if got := e.c.Held(); len(got) != 0 {
		t.Errorf("Held after loss: got %v, want none", got)
	}
	e.done()
}

// Failed renewals are retried; one that succeeds keeps the contexts alive.
func TestLock_KeepAlive_failureIsNotLoss(t *testing.T) {
	t.Parallel() // waits a third of a keepAliveTTL lease
	e := newMockEnv(t)
	tok := &tokenArg{}
	e.expectExec("acquire", acquireArgs("job", mockHolder, keepAliveTTL.Microseconds(), tok), okReply(42, 1))
	// The first renewal fails after its in-statement retries; the second
	// succeeds.
	e.expectExec("refresh", refreshArgs(keepAliveTTL.Microseconds(), "job", tok), append(repeatReply(errReply(errDeadlock), fault.MaxTransientAttempts), okReply(1, 1))...)
	e.expectExec("release", releaseArgs("job", tok), okReply(0, 1))
	l, err := e.c.TryAcquire(t.Context(), "job", keepAliveTTL)
	if err != nil {
		t.Fatal(err)
	}
	first := l.ValidUntil()
	kctx := l.KeepAlive(t.Context())
	deadline := time.Now().Add(2 * keepAliveTTL)
	for !l.ValidUntil().After(first) {
		if time.Now().After(deadline) || kctx.Err() != nil {
			t.Fatalf("no successful renewal; context: %v", context.Cause(kctx))
		}
		time.Sleep(time.Millisecond)
	}
	if err := l.Release(t.Context()); err != nil {
		t.Fatalf("Release: got %v, want nil", err)
	}
	if cause := context.Cause(kctx); errors.Is(cause, ErrLockLost) {
		t.Errorf("cause: got %v, want no loss", cause)
	}
	e.done()
}

func TestRenewBackoff(t *testing.T) {
	for _, tt := range []struct {
		ttl      time.Duration
		failures int
		want     time.Duration
	}{
		{time.Minute, 1, 10 * time.Millisecond},
		{time.Minute, 3, 40 * time.Millisecond},
		{time.Minute, 40, 6 * time.Second},
		{time.Second, 5, 100 * time.Millisecond},
		{MinTTL, 1, minBackoff},
	} {
		if got := renewBackoff(tt.ttl, tt.failures); got != tt.want {
			t.Errorf("renewBackoff(%v, %d): got %v, want %v", tt.ttl, tt.failures, got, tt.want)
		}
	}
}

func TestDefaultSafetyMargin(t *testing.T) {
	for ttl, want := range map[time.Duration]time.Duration{
		time.Second: 100 * time.Millisecond,
		time.Minute: 5 * time.Second,
		time.Hour:   maxDefaultSafetyMargin,
	} {
		if got := defaultSafetyMargin(ttl); got != want {
			t.Errorf("defaultSafetyMargin(%v): got %v, want %v", ttl, got, want)
		}
	}
}

// A keep-alive whose deadline fires after the lease's end (the process was
// stopped past it, as scripts/nemesis's pause does) says the lease may
// have expired already, not that it expires soon.
func TestLock_KeepAlive_lateDeadlineSaysExpired(t *testing.T) {
	for _, tt := range []struct {
		left time.Duration
		want string
	}{
		{300 * time.Millisecond, "may expire 100ms from now"},
		{-1500 * time.Millisecond, "may have expired 1.5"},
	} {
		l := &Lock{name: "n", kind: nameKind{}, validUntil: time.Now().Add(tt.left)}
		err := l.expiringErr(100*time.Millisecond, nil)
		if !errors.Is(err, ErrLockLost) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("lease ending in %v: got %v, want ErrLockLost saying %q", tt.left, err, tt.want)
		}
	}
}

// A Refresh whose reply is read after a pause longer than the lease (sent
// before SIGSTOP, answered after SIGCONT) ends the keep-alive saying the
// lease may have expired already; one that leaves the lease inside the
// margin says it may expire within it.
func TestLock_setValidUntil_lateReplySaysExpired(t *testing.T) {
	for _, tt := range []struct {
		until time.Duration
		want  string
	}{
		{50 * time.Millisecond, "may expire within the safety margin 100ms"},
		{-2 * time.Second, "may have expired 2"},
	} {
		e := newMockEnv(t)
		l := newLock(e.c, "n", strings.Repeat("a", 32), 1, time.Minute, time.Now().Add(time.Minute))
		kctx := l.keepAlive(context.Background(), 100*time.Millisecond)
		l.mu.Lock()
		l.setValidUntil(time.Now().Add(tt.until))
		l.mu.Unlock()
		<-kctx.Done()
		if err := context.Cause(kctx); !errors.Is(err, ErrLockLost) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("a Refresh leaving %v: got %v, want ErrLockLost saying %q", tt.until, err, tt.want)
		}
		l.stopKeepAlive(l.ka)
	}
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

// After a Release, a KeepAlive's context ends with the cause a call on the
// released Lock returns: the same words, wrapping ErrNotHeld.
func TestLock_KeepAlive_afterReleaseCause(t *testing.T) {
	e := newMockEnv(t)
	l, tok := e.acquired("job")
	e.expectExec("release", releaseArgs("job", tok), okReply(0, 1))
	if err := l.Release(t.Context()); err != nil {
		t.Fatalf("Release: got %v, want nil", err)
	}
	cause := context.Cause(l.KeepAlive(t.Context()))
	assertErrIs(t, cause, ErrNotHeld)
	if got, want := fmt.Sprint(cause), fmt.Sprint(l.releasedErr()); got != want {
		t.Errorf("cause: got %q, want %q", got, want)
	}
	e.done()
}

// pausedLease returns a Lock of e's Client whose keep-alive (margin 100ms)
// runs, with its context kctx, a derived context derived, and a function
// that makes the keep-alive's deadline a second past, as a pause would,
// without telling the renewer: its timer stays a minute away.
func pausedLease(t *testing.T, e *mockEnv) (l *Lock, kctx, derived context.Context, pause func()) {
	t.Helper()
	l = newLock(e.c, "n", strings.Repeat("a", 32), 1, time.Minute, time.Now().Add(time.Minute))
	kctx = l.keepAlive(context.WithValue(context.Background(), ctxKey{}, "v"), 100*time.Millisecond)
	derived, cancel := context.WithTimeout(kctx, time.Hour)
	t.Cleanup(cancel)
	t.Cleanup(func() { l.stopKeepAlive(l.ka) })
	pause = func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.validUntil = time.Now().Add(-time.Second)
		l.ka.setDeadline(l.validUntil)
	}
	return l, kctx, derived, pause
}

type ctxKey struct{}

// wantLostAtOnce fails t unless kctx and derived have ended with a cause
// wrapping ErrLockLost that says the lease may have expired, and the
// renewer has exited.
func wantLostAtOnce(t *testing.T, l *Lock, kctx, derived context.Context) {
	t.Helper()
	select {
	case <-kctx.Done():
	default:
		t.Fatal("Done: not closed, want closed once the deadline has passed")
	}
	if err := kctx.Err(); !errors.Is(err, context.Canceled) {
		t.Errorf("Err: got %v, want context.Canceled", err)
	}
	cause := context.Cause(kctx)
	if !errors.Is(cause, ErrLockLost) || !strings.Contains(cause.Error(), "may have expired 1") {
		t.Errorf("Cause: got %v, want ErrLockLost saying the lease may have expired 1s ago", cause)
	}
	// derived is a child of kctx's cancel context, which the check ended.
	if err := context.Cause(derived); err != cause {
		t.Errorf("derived context's cause: got %v, want %v", err, cause)
	}
	if got := kctx.Value(ctxKey{}); got != "v" {
		t.Errorf("Value: got %v, want the parent's value", got)
	}
	select {
	case <-l.ka.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the renewer did not exit after the context ended")
	}
}

// A probeCtx records whether its Done was called while its Lock's mutex
// was held by the caller. A TryLock could not tell: the Lock's renewer and
// timers take the mutex for a moment at any time, and CI's run of the
// fake's suite met one. So Done waits up to a second for the mutex on
// another goroutine: others let it go within that; a caller that holds it
// across the call cannot, until Done has returned.
type probeCtx struct {
	context.Context
	l          *Lock
	underMutex atomic.Bool
}

func (c *probeCtx) Done() <-chan struct{} {
	got := make(chan struct{})
	go func() {
		c.l.mu.Lock()
		c.l.mu.Unlock()
		close(got)
	}()
	select {
	case <-got:
	case <-time.After(time.Second):
		c.underMutex.Store(true)
	}
	return c.Context.Done()
}
