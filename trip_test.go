package sqllock

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// The files of the library a public call's context passes through, traced
// as the call runs: the context records, each time anything asks it (Done,
// Err, Deadline, Value: database/sql and the driver ask at every statement,
// and a context made from it asks it as it is made), the library's files on
// the stack at that moment. A file whose function only hands the context
// on to one that never asks it is not counted; a goroutine started with it
// counts from its own stack.

// tripCtx is a context that records the library's files on the stack of
// whatever asks it.
type tripCtx struct {
	context.Context
	mu    *sync.Mutex
	files map[string]bool
}

func newTripCtx(parent context.Context) tripCtx {
	return tripCtx{Context: parent, mu: new(sync.Mutex), files: map[string]bool{}}
}

// libraryFrame reports whether fn, a frame's function, is the library's: the
// root package or internal/, not the fake server (sqllocktest) or a test.
func libraryFrame(fn, file string) bool {
	const mod = "github.com/sqllock/sqllock"
	return (strings.HasPrefix(fn, mod+".") || strings.HasPrefix(fn, mod+"/internal/")) && !strings.HasSuffix(strings.TrimSuffix(file, ".go"), "_test")
}

func (c tripCtx) note() {
	pcs := make([]uintptr, 128)
	n := runtime.Callers(3, pcs)
	frames := runtime.CallersFrames(pcs[:n])
	wd, _ := os.Getwd()
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		f, more := frames.Next()
		if libraryFrame(f.Function, f.File) {
			if rel, err := filepath.Rel(wd, f.File); err == nil {
				c.files[rel] = true
			}
		}
		if !more {
			return
		}
	}
}

func (c tripCtx) Done() <-chan struct{}       { c.note(); return c.Context.Done() }
func (c tripCtx) Err() error                  { c.note(); return c.Context.Err() }
func (c tripCtx) Deadline() (time.Time, bool) { c.note(); return c.Context.Deadline() }
func (c tripCtx) Value(key any) any           { c.note(); return c.Context.Value(key) }

// list returns the files recorded, sorted.
func (c tripCtx) list() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var fs []string
	for f := range c.files {
		fs = append(fs, f)
	}
	slices.Sort(fs)
	return fs
}

// wantTrip fails t when ctx passed through more than most files.
func wantTrip(t *testing.T, what string, ctx tripCtx, most int) {
	t.Helper()
	files := ctx.list()
	t.Logf("%s: the context passed through %d files: %s", what, len(files), strings.Join(files, " "))
	if len(files) > most {
		t.Errorf("%s: the context passed through %d files (%s), want at most %d", what, len(files), strings.Join(files, " "), most)
	}
	if len(files) == 0 {
		t.Errorf("%s: nothing asked the context: the trace records nothing", what)
	}
}

// A warm TryAcquire's context passes through at most 8 of the library's
// files (a set's and a semaphore's too), a blocking Acquire's, after the
// first use, at most 6, woken by the wake-up channel or polling without
// one, and a Refresh's and a Release's at most 6 (the model libraries take
// 2 or 3).
func TestTrip_contextFiles(t *testing.T) {
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		if e.server.Fake {
			// Beside the whole package under -race, this test on the
			// MariaDB fake left other tests counting two waiters on the
			// fake's channels for a minute (the fake is the process's, and
			// they count its waiters, not their table's); the files are
			// the library's, which the real servers show.
			t.Skip("the fakes: see the comment")
		}
		table := e.newTable(t)
		ctx := testCtx(t)
		for _, wakeups := range []int{defaultWakeups, 0} {
			c := e.client(t, e.openDB(t), table, WithWakeups(wakeups), WithRetry(LinearBackoff(10*time.Millisecond)))
			if err := mustAcquire(t, c, "warm", time.Minute).Release(ctx); err != nil {
				t.Fatal(err) // the first use, and every statement prepared
			}
			if wakeups > 0 {
				try := newTripCtx(ctx)
				l, err := c.TryAcquire(try, "try", time.Minute)
				if err != nil {
					t.Fatal(err)
				}
				wantTrip(t, "a warm TryAcquire", try, 8)
				refresh, release := newTripCtx(ctx), newTripCtx(ctx)
				if err := l.Refresh(refresh, time.Minute); err != nil {
					t.Fatal(err)
				}
				wantTrip(t, "Lock.Refresh", refresh, 6)
				if err := l.Release(release); err != nil {
					t.Fatal(err)
				}
				wantTrip(t, "Lock.Release", release, 6)
				if !e.oneRow() {
					// Sets and semaphores, warm too.
					if err := mustAcquireSet(t, c, time.Minute, "s1", "s2").Release(ctx); err != nil {
						t.Fatal(err)
					}
					set := newTripCtx(ctx)
					l, err := c.TryAcquireSet(set, []string{"s1", "s2"}, time.Minute)
					if err != nil {
						t.Fatal(err)
					}
					wantTrip(t, "a warm TryAcquireSet", set, 8)
					if err := l.Release(ctx); err != nil {
						t.Fatal(err)
					}
					sem := c.Semaphore("sem", 3)
					if l, err = sem.TryAcquire(ctx, time.Minute); err != nil {
						t.Fatal(err)
					}
					if err := l.Release(ctx); err != nil {
						t.Fatal(err)
					}
					slot := newTripCtx(ctx)
					if l, err = sem.TryAcquire(slot, time.Minute); err != nil {
						t.Fatal(err)
					}
					wantTrip(t, "a warm Semaphore.TryAcquire", slot, 8)
					if err := l.Release(ctx); err != nil {
						t.Fatal(err)
					}
				}
			}

			name := "n" + string(rune('0'+wakeups))
			var held *Lock
			if wakeups > 0 && !e.oneRow() {
				held = holdAfterWaiting(t, e, e.client(t, e.openDB(t), table), table, name) // it holds the channel
			} else {
				held = mustAcquire(t, e.client(t, e.openDB(t), table), name, time.Minute)
			}
			// The table's check, due every second (internal/engine/tablecheck.go), is put
			// off: with it due, and the frozen-holder watch started by a
			// statement that waited for the row the release was deleting
			// (internal/engine/frozen.go), a loaded run counted 7 files.
			noRecheck(c)
			blocking := newTripCtx(ctx)
			got := acquireAsync(blocking, c, name)
			waitFor(t, time.Minute, "the Acquire waits", func() bool { return headAttempts(c, name) > 0 })
			if err := held.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if err := mustGet(t, got).Release(ctx); err != nil {
				t.Fatal(err)
			}
			what := "a blocking Acquire, polling"
			if wakeups > 0 {
				what = "a blocking Acquire, with wake-up channels"
			}
			wantTrip(t, what, blocking, 6)
		}
	})
}
