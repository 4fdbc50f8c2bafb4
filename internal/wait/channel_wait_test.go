package wait

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock/internal/faultproxy"
	"github.com/sqllock/sqllock/internal/testdsn"
)

// What channel_wait.go promises: a wait on a key's channel, the let-go that
// wakes the next process, the hand-over to a lease, the probe, and the
// waits' cap when the connections' read timeout cuts them. The real-server
// tests use channel_test.go's twoProcesses.

func TestChannels_Wait_handsOverInOrder(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		a, b, _ := twoProcesses(t, s)
		ctx := context.Background()

		// Nobody holds it: granted at once, not queued; a's queue keeps it.
		st, queued, err := a.channels.wait(ctx, "k", time.Second)
		if err != nil || st != stGranted || queued {
			t.Fatalf("a: got %v, queued %v, %v; want granted at once", st, queued, err)
		}
		if !a.channels.holds("k") || a.channels.inUse() != 1 {
			t.Fatalf("a holds %v, %d in use; want the channel, one connection", a.channels.holds("k"), a.channels.inUse())
		}
		// a's queue holds it already: a second wait of a's does not block.
		if st, _, err := a.channels.wait(ctx, "k", time.Second); err != nil || st != stQueueHeld {
			t.Errorf("a again: got %v, %v; want stQueueHeld", st, err)
		}
		// b waits behind a: its wait times out after the second it asked,
		// queued; then a lets go, and b's next wait is granted.
		began := time.Now()
		st, queued, err = b.channels.wait(ctx, "k", time.Second)
		if err != nil || st != stTimedOut || !queued {
			t.Fatalf("b behind a: got %v, queued %v, %v; want timed out, queued", st, queued, err)
		}
		if d := time.Since(began); d < 900*time.Millisecond {
			t.Errorf("b's wait ended after %v; want the second it asked", d)
		}
		done := make(chan error, 1)
		go func() {
			// queued: a held the channel when b's wait began, so a
			// grant within the 3 s below, before the 5 s timeout, is
			// a's let-go waking b.
			st, queued, err := b.channels.wait(ctx, "k", 5*time.Second)
			if err == nil && (st != stGranted || !queued) {
				err = fmt.Errorf("got %v, queued %v; want granted after waiting", st, queued)
			}
			done <- err
		}()
		time.Sleep(200 * time.Millisecond)         // b is in GET_LOCK, or about to be
		a.channels.letGo(ctx, "k", "someone else") // not the holder: nothing
		if !a.channels.holds("k") {
			t.Fatal("a let go for a holder that does not hold it")
		}
		a.channels.letGo(ctx, "k", nil) // the queue's: wakes b
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("b after a let go: %v", err)
			}
		case <-time.After(3 * time.Second):
			t.Fatal("b was not woken by a's let-go")
		}
		if a.channels.holds("k") || a.channels.inUse() != 0 {
			t.Error("a still holds the channel it let go of")
		}
	})
}

// handTo gives the queue's channel to a holder, running adopt while it is
// still taken; the holder's let-go frees it. In a bounded pool the channel
// is let go of at once instead.
func TestChannels_HandTo(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		a, _, _ := twoProcesses(t, s)
		ctx := context.Background()
		if st, _, err := a.channels.wait(ctx, "k", time.Second); err != nil || st != stGranted {
			t.Fatalf("wait: %v, %v", st, err)
		}
		holder, adopted := new(int), false
		a.channels.handTo(ctx, "k", holder, func() { adopted = true })
		if !adopted || !a.channels.holds("k") {
			t.Fatalf("adopted %v, held %v; want both", adopted, a.channels.holds("k"))
		}
		a.channels.letGo(ctx, "k", nil) // the queue's no more: nothing
		if !a.channels.holds("k") {
			t.Fatal("the queue let go of the holder's channel")
		}
		a.channels.letGo(ctx, "k", holder)
		if a.channels.holds("k") || used(t, a) {
			t.Fatal("the holder's let-go left the channel held")
		}

		a.channels.db.SetMaxOpenConns(3)
		if st, _, err := a.channels.wait(ctx, "k", time.Second); err != nil || st != stGranted {
			t.Fatalf("wait in a bounded pool: %v, %v", st, err)
		}
		adopted = false
		a.channels.handTo(ctx, "k", holder, func() { adopted = true })
		if adopted || a.channels.holds("k") || used(t, a) {
			t.Errorf("bounded pool: adopted %v, held %v; want the channel let go of", adopted, a.channels.holds("k"))
		}
	})
}

// Two waits cut after the same time are the connections' read timeout:
// waits are capped a second below it; below a second, the channels turn
// off, and the Observer is told once.
func TestChannels_cut_capsWaits(t *testing.T) {
	var told []state
	ws := &channelSet{log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		told: func(_ string, st state, _ time.Duration) { told = append(told, st) }}
	ctx := context.Background()
	if got := ws.maxWait(); got != wakeRecheckMax {
		t.Fatalf("uncut: got %v, want %v", got, wakeRecheckMax)
	}
	ws.cut(ctx, 4500*time.Millisecond, wakeRecheckMax)
	if got := ws.maxWait(); got != wakeRecheckMax {
		t.Errorf("one cut: got %v, want %v (one cut proves nothing)", got, wakeRecheckMax)
	}
	ws.cut(ctx, 4400*time.Millisecond, wakeRecheckMax)
	if got := ws.maxWait(); got != 3*time.Second {
		t.Errorf("two cuts at 4.4-4.5s: got %v, want 3s", got)
	}
	ws.cut(ctx, 1200*time.Millisecond, 3*time.Second)
	ws.cut(ctx, 1250*time.Millisecond, 3*time.Second)
	if !ws.refused.Load() || len(told) != 1 || told[0] != stOff {
		t.Errorf("two cuts at 1.2s: refused %v, told %v; want the channels off, told stOff once", ws.refused.Load(), told)
	}
	ws.cut(ctx, 1200*time.Millisecond, 3*time.Second)
	if len(told) != 1 {
		t.Errorf("told %v; want stOff once", told)
	}
}

// probe asks whether another process waits on the key's channel, at most
// once every probeEvery, and when one does, the next Acquire of the key
// queues behind it (Contended).
func TestChannels_Probe(t *testing.T) {
	e, mock, _, _ := mockEngine(t)
	ws := &e.channels
	ctx := context.Background()
	mock.ExpectQuery("SELECT IS_USED_LOCK(X'6b')").WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow(nil))
	ws.probe(ctx, "k")
	if ws.contended("k") {
		t.Fatal("nobody waits: got contended")
	}
	ws.probe(ctx, "k") // within probeEvery: sends nothing
	time.Sleep(probeEvery)
	mock.ExpectQuery("SELECT IS_USED_LOCK(X'6b')").WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow(7))
	ws.probe(ctx, "k")
	if !ws.contended("k") {
		t.Error("another process waits: got not contended")
	}
	if err := mock.ExpectationsWereMet(); err != nil {
		t.Error(err)
	}
}

// Issue 20, point 4. Close lets go of every channel its Client holds, even a
// free one it reaches after its own time is up: the server named lock would
// otherwise stay held, on a connection checked out of the pool, until the
// server drops the idle session. Ten channels, so that a pass that skipped
// each with even odds would leave some.
func TestEngine_Close_afterItsTimeFreesEveryChannel(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		a, b, _ := twoProcesses(t, s)
		ctx := context.Background()
		var keys []string
		for i := range 10 {
			key := fmt.Sprintf("n%d", i)
			// Nobody holds the channel: the wait is granted at once, and
			// the key's queue keeps it, idle.
			if st, _, err := a.channels.wait(ctx, key, time.Second); err != nil || st != stGranted {
				t.Fatalf("wait on %s: got %v, %v, want granted", key, st, err)
			}
			keys = append(keys, key)
		}
		ended, cancel := context.WithCancel(ctx)
		cancel()
		a.Stop()
		a.Close(ended)
		// A lock of a connection Close discarded is freed when the server
		// has ended the session, which a loaded server does a moment later.
		for _, key := range keys {
			deadline := time.Now().Add(10 * time.Second)
			for usedKey(t, b, key) {
				if time.Now().After(deadline) {
					t.Errorf("%s: the channel is held 10 s after Close", key)
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	})
}

// Issue 20, point 5. A wait on a channel whose connection went silent (a
// NAT or a load balancer dropped it; here a proxy that holds all traffic)
// ends on the client a little after the server's GET_LOCK timeout, not when
// TCP gives up minutes later.
func TestChannels_wait_silentConnectionEnds(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		cfg, err := mysql.ParseDSN(s.DSN)
		if err != nil {
			t.Fatal(err)
		}
		p, err := faultproxy.Start(cfg.Addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		cfg.Addr = p.Addr()
		db := openDB(t, cfg.FormatDSN())
		a := engineOn(t, db, fmt.Sprintf("%s_%d", t.Name(), time.Now().UnixNano()), errors.New("closed"), slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err := db.Ping(); err != nil { // a connection in the pool, made before the stall
			t.Fatal(err)
		}
		p.Stall(faultproxy.Both)
		t.Cleanup(func() { p.Stall(0) })
		done := make(chan state, 1)
		go func() {
			st, _, _ := a.channels.wait(context.Background(), "silent", time.Second)
			done <- st
		}()
		// The bound: GET_LOCK's second plus wakeWaitSlack; a minute is
		// what TCP would take, at the least.
		select {
		case st := <-done:
			if st != stFailed {
				t.Errorf("wait on a silent connection: got state %v, want failed (poll)", st)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the wait on a silent connection did not end within 30s")
		}
	})
}

// Issue 20, point 5. A DSN readTimeout shorter than a channel's wait cuts
// every wait: the Engine notices after two cut alike, says so once, and
// waits less from then on.
func TestChannels_wait_readTimeoutShortensWaits(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		cfg, err := mysql.ParseDSN(s.DSN)
		if err != nil {
			t.Fatal(err)
		}
		cfg.ReadTimeout = 3 * time.Second
		table := fmt.Sprintf("%s_%d", t.Name(), time.Now().UnixNano())
		closed := errors.New("closed")
		var logged syncBuffer
		a := engineOn(t, openDB(t, cfg.FormatDSN()), table, closed, slog.New(slog.NewTextHandler(&logged, nil)))
		holder := newEngine(t, s, table, closed)
		ctx := context.Background()
		if st, _, err := holder.channels.wait(ctx, "n", time.Second); err != nil || st != stGranted {
			t.Fatalf("holder: got %v, %v, want granted", st, err)
		}
		for i := range 2 {
			st, _, err := a.channels.wait(ctx, "n", time.Minute)
			if err != nil || st != stFailed {
				t.Fatalf("wait %d: got %v, %v, want failed (cut by the read timeout)", i, st, err)
			}
		}
		if got := a.channels.maxWait(); got != 2*time.Second {
			t.Errorf("longest wait after two cut at 3s: got %v, want 2s", got)
		}
		if !strings.Contains(logged.String(), "readTimeout") {
			t.Errorf("no warning about readTimeout; logged: %s", logged.String())
		}
		// Now shorter than the read timeout, a wait times out on the server.
		if st, _, err := a.channels.wait(ctx, "n", time.Minute); err != nil || st != stTimedOut {
			t.Errorf("wait after the change: got %v, %v, want timed out", st, err)
		}
	})
}

// A syncBuffer is a bytes.Buffer safe for a logger's goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
