package wait

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/testdsn"
)

// A fakeLease is what Hold reads of a lease: when it could expire, and
// whether its release started.
type fakeLease struct {
	mu    sync.Mutex
	until time.Time
	ended bool
}

func (f *fakeLease) state() (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.until, f.ended
}

func (f *fakeLease) set(until time.Time, ended bool) {
	f.mu.Lock()
	f.until, f.ended = until, ended
	f.mu.Unlock()
}

// holding returns a Hold of key's channel in e, which e's queue held: as
// Acquire leaves it to the lease it took after waiting.
func holding(t *testing.T, e *Engine, ctx context.Context, key string, lease *fakeLease) *Hold {
	t.Helper()
	if st, _, err := e.channels.wait(context.Background(), key, time.Second); err != nil || st != stGranted {
		t.Fatalf("wait on %s: got %v, %v; want granted", key, st, err)
	}
	h := &Hold{e: e, key: key, lease: lease.state, contended: true}
	e.channels.handTo(ctx, key, h, h.adopt)
	return h
}

// Issue 22, point 6. The hand-over of the queue's channel to the lease
// does not depend on the caller's context: one that ended just as the
// acquire succeeded still gives the Hold the channel, and its Release lets
// go of it. Ten keys: a hand-over that depended on the context would fail
// about half of them.
func TestHold_handOverAfterContextEnded(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		a, b, _ := twoProcesses(t, s)
		ctx := context.Background()
		ended, cancel := context.WithCancel(ctx)
		cancel()
		for i := range 10 {
			key := fmt.Sprintf("h%d", i)
			h := holding(t, a, ended, key, &fakeLease{until: time.Now().Add(time.Minute)})
			h.mu.Lock()
			wake := h.wake
			h.mu.Unlock()
			if !wake || !a.channels.holds(key) {
				t.Errorf("%s: the Hold did not get the channel", key)
			}
			h.Release(ctx, true)
			if a.channels.holds(key) || usedKey(t, b, key) {
				t.Errorf("%s: the channel is held after the Hold's Release", key)
			}
		}
	})
}

// A Hold whose lease lapses unreleased lets go of the channel once the
// lease could have expired; a renewal puts that off, and a release that
// started leaves the let-go to the release.
func TestHold_lapse(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		a, b, _ := twoProcesses(t, s)
		ctx := context.Background()
		began := time.Now()
		lease := &fakeLease{until: began.Add(500 * time.Millisecond)}
		h := holding(t, a, ctx, "k", lease)
		lease.set(began.Add(1500*time.Millisecond), false) // renewed
		time.Sleep(time.Until(began.Add(time.Second)))     // past the first expiry and its slack
		if !a.channels.holds("k") {
			t.Fatal("let go of before the renewed lease could expire")
		}
		for deadline := time.Now().Add(5 * time.Second); a.channels.holds("k") || used(t, b); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the lapsed lease's channel is still held")
			}
		}
		h.Release(ctx, true) // after the lapse: nothing more to let go of

		lease = &fakeLease{until: time.Now().Add(500 * time.Millisecond)}
		holding(t, a, ctx, "k", lease)
		lease.set(time.Time{}, true) // its release started, and lets go
		time.Sleep(time.Second)
		if !a.channels.holds("k") {
			t.Error("the lapse let go of a channel whose lease's release had started")
		}
	})
}

// A nil Hold (a lease whose acquire did not wait, or channels off) does
// nothing.
func TestHold_nil(t *testing.T) {
	var h *Hold
	h.Release(context.Background(), true)
	if h.Contended() {
		t.Error("a nil Hold is contended")
	}
}
