package wait

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
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
		st, queued, err := a.Channels.Wait(ctx, "k", time.Second)
		if err != nil || st != Granted || queued {
			t.Fatalf("a: got %v, queued %v, %v; want granted at once", st, queued, err)
		}
		if !a.Channels.Holds("k") || a.Channels.InUse() != 1 {
			t.Fatalf("a holds %v, %d in use; want the channel, one connection", a.Channels.Holds("k"), a.Channels.InUse())
		}
		// a's queue holds it already: a second wait of a's does not block.
		if st, _, err := a.Channels.Wait(ctx, "k", time.Second); err != nil || st != QueueHeld {
			t.Errorf("a again: got %v, %v; want QueueHeld", st, err)
		}
		// b waits behind a: its wait times out after the second it asked,
		// queued; then a lets go, and b's next wait is granted.
		began := time.Now()
		st, queued, err = b.Channels.Wait(ctx, "k", time.Second)
		if err != nil || st != TimedOut || !queued {
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
			st, queued, err := b.Channels.Wait(ctx, "k", 5*time.Second)
			if err == nil && (st != Granted || !queued) {
				err = fmt.Errorf("got %v, queued %v; want granted after waiting", st, queued)
			}
			done <- err
		}()
		time.Sleep(200 * time.Millisecond)         // b is in GET_LOCK, or about to be
		a.Channels.LetGo(ctx, "k", "someone else") // not the holder: nothing
		if !a.Channels.Holds("k") {
			t.Fatal("a let go for a holder that does not hold it")
		}
		a.Channels.LetGo(ctx, "k", nil) // the queue's: wakes b
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("b after a let go: %v", err)
			}
		case <-time.After(3 * time.Second):
			t.Fatal("b was not woken by a's let-go")
		}
		if a.Channels.Holds("k") || a.Channels.InUse() != 0 {
			t.Error("a still holds the channel it let go of")
		}
	})
}

// HandTo gives the queue's channel to a holder, running adopt while it is
// still taken; the holder's let-go frees it. In a bounded pool the channel
// is let go of at once instead.
func TestChannels_HandTo(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		a, _, _ := twoProcesses(t, s)
		ctx := context.Background()
		if st, _, err := a.Channels.Wait(ctx, "k", time.Second); err != nil || st != Granted {
			t.Fatalf("wait: %v, %v", st, err)
		}
		holder, adopted := new(int), false
		a.Channels.HandTo(ctx, "k", holder, func() { adopted = true })
		if !adopted || !a.Channels.Holds("k") {
			t.Fatalf("adopted %v, held %v; want both", adopted, a.Channels.Holds("k"))
		}
		a.Channels.LetGo(ctx, "k", nil) // the queue's no more: nothing
		if !a.Channels.Holds("k") {
			t.Fatal("the queue let go of the holder's channel")
		}
		a.Channels.LetGo(ctx, "k", holder)
		if a.Channels.Holds("k") || used(t, a) {
			t.Fatal("the holder's let-go left the channel held")
		}

		a.Channels.db.SetMaxOpenConns(3)
		if st, _, err := a.Channels.Wait(ctx, "k", time.Second); err != nil || st != Granted {
			t.Fatalf("wait in a bounded pool: %v, %v", st, err)
		}
		adopted = false
		a.Channels.HandTo(ctx, "k", holder, func() { adopted = true })
		if adopted || a.Channels.Holds("k") || used(t, a) {
			t.Errorf("bounded pool: adopted %v, held %v; want the channel let go of", adopted, a.Channels.Holds("k"))
		}
	})
}

// Two waits cut after the same time are the connections' read timeout:
// waits are capped a second below it; below a second, the channels turn
// off, and the Observer is told once.
func TestChannels_cut_capsWaits(t *testing.T) {
	var told []State
	ws := &Channels{log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		told: func(_ string, st State, _ time.Duration) { told = append(told, st) }}
	ctx := context.Background()
	if got := ws.MaxWait(); got != wakeRecheckMax {
		t.Fatalf("uncut: got %v, want %v", got, wakeRecheckMax)
	}
	ws.cut(ctx, 4500*time.Millisecond, wakeRecheckMax)
	if got := ws.MaxWait(); got != wakeRecheckMax {
		t.Errorf("one cut: got %v, want %v (one cut proves nothing)", got, wakeRecheckMax)
	}
	ws.cut(ctx, 4400*time.Millisecond, wakeRecheckMax)
	if got := ws.MaxWait(); got != 3*time.Second {
		t.Errorf("two cuts at 4.4-4.5s: got %v, want 3s", got)
	}
	ws.cut(ctx, 1200*time.Millisecond, 3*time.Second)
	ws.cut(ctx, 1250*time.Millisecond, 3*time.Second)
	if !ws.Refused() || len(told) != 1 || told[0] != Off {
		t.Errorf("two cuts at 1.2s: refused %v, told %v; want the channels off, told Off once", ws.Refused(), told)
	}
	ws.cut(ctx, 1200*time.Millisecond, 3*time.Second)
	if len(told) != 1 {
		t.Errorf("told %v; want Off once", told)
	}
}

// Probe asks whether another process waits on the key's channel, at most
// once every probeEvery, and when one does, the next Acquire of the key
// queues behind it (Contended).
func TestChannels_Probe(t *testing.T) {
	e, mock, _, _ := mockEngine(t)
	ws := &e.Channels
	ctx := context.Background()
	mock.ExpectQuery("SELECT IS_USED_LOCK(X'6b')").WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow(nil))
	ws.Probe(ctx, "k")
	if ws.Contended("k") {
		t.Fatal("nobody waits: got contended")
	}
	ws.Probe(ctx, "k") // within probeEvery: sends nothing
	time.Sleep(probeEvery)
	mock.ExpectQuery("SELECT IS_USED_LOCK(X'6b')").WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow(7))
	ws.Probe(ctx, "k")
	if !ws.Contended("k") {
		t.Error("another process waits: got not contended")
	}
	if err := mock.ExpectationsWereMet(); err != nil {
		t.Error(err)
	}
}
