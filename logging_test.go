package sqllock

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

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
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []slog.Record
	for _, r := range h.recs {
		if r.Level == level && strings.Contains(r.Message, msg) && attr(r, "name") == name {
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
		if len(got) > 0 {
			t.Fatalf("got records %q, want none at Info or above", got)
		}
	})
}

// A renewal that fails is a warning; giving the lease up is an error.
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
		rec.waitFor(t, slog.LevelWarn, "renewal failed", "ka")
		r := rec.waitFor(t, slog.LevelError, "lease lost", "ka")
		if got := attr(r, "err"); !strings.Contains(got, "lock lost") {
			t.Errorf("loss record's err: got %q, want the cause", got)
		}
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
