package wait

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
)

// asking waits until lk has n questions waiting for the next statement.
func asking(t *testing.T, lk *looker, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		lk.mu.Lock()
		got := len(lk.asks)
		lk.mu.Unlock()
		if got == n {
			return
		}
	}
	t.Fatalf("the look never had %d questions waiting", n)
}

// Heads that ask while a look statement runs are answered together by the
// next one: three names, two statements.
func TestLooks_Held_batchesWaitingHeads(t *testing.T) {
	e, mock, _, _ := mockEngine(t)
	lk := &e.looks
	mock.ExpectQuery("SELECT name FROM t WHERE name IN (X'61')").WillDelayFor(500 * time.Millisecond).
		WillReturnRows(sqlmock.NewRows([]string{"name"}).AddRow([]byte("a")))
	mock.ExpectQuery("SELECT name FROM t WHERE name IN (X'62', X'63')").
		WillReturnRows(sqlmock.NewRows([]string{"name"}).AddRow([]byte("b")))
	type answer struct {
		held bool
		err  error
	}
	answers := map[string]chan answer{"a": make(chan answer, 1), "b": make(chan answer, 1), "c": make(chan answer, 1)}
	ask := func(name string) {
		held, err := lk.held(context.Background(), name)
		answers[name] <- answer{held, err}
	}
	go ask("a")
	for !lk.sending() {
		time.Sleep(time.Millisecond)
	}
	asking(t, lk, 0) // a's question is in the statement under way
	go ask("b")
	asking(t, lk, 1)
	go ask("c")
	asking(t, lk, 2)
	for name, want := range map[string]bool{"a": true, "b": true, "c": false} {
		if got := <-answers[name]; got.err != nil || got.held != want {
			t.Errorf("%s: got %v, %v; want held %v", name, got.held, got.err, want)
		}
	}
	if err := mock.ExpectationsWereMet(); err != nil {
		t.Error(err)
	}
	for deadline := time.Now().Add(5 * time.Second); lk.sending(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the sender still runs with nobody asking")
		}
	}
}

// A look that fails answers its error, after which the caller sends its
// acquire; a caller whose context ends gets its context's error.
func TestLooks_Held_errors(t *testing.T) {
	e, mock, _, _ := mockEngine(t)
	lk := &e.looks
	boom := errors.New("boom")
	mock.ExpectQuery("SELECT name FROM t WHERE name IN (X'61')").WillReturnError(boom)
	if _, err := lk.held(context.Background(), "a"); !errors.Is(err, boom) {
		t.Errorf("failed look: got %v, want %v", err, boom)
	}
	mock.ExpectQuery("SELECT name FROM t WHERE name IN (X'61')").WillDelayFor(time.Second).
		WillReturnRows(sqlmock.NewRows([]string{"name"}))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := lk.held(ctx, "a"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("ended context: got %v, want %v", err, context.DeadlineExceeded)
	}
}

// holders returns the names a live lease holds, from one statement of the
// literals given.
func TestLooks_Holders(t *testing.T) {
	e, mock, _, _ := mockEngine(t)
	mock.ExpectQuery("SELECT name FROM t WHERE name IN (X'61', X'62')").
		WillReturnRows(sqlmock.NewRows([]string{"name"}).AddRow([]byte("b")))
	got, err := e.looks.holders(context.Background(), "X'61', X'62'")
	if err != nil || len(got) != 1 || got[0] != "b" {
		t.Errorf("got %q, %v; want [b]", got, err)
	}
}

// At most maxWaitingAttempts acquire statements of waiting calls run at
// once: the next waits for one to exit, for its context, or for Close.
func TestEngine_EnterAttempt_bounded(t *testing.T) {
	e, _, closing, closed := mockEngine(t)
	ctx := context.Background()
	for i := range maxWaitingAttempts {
		if err := e.enterAttempt(ctx); err != nil {
			t.Fatalf("attempt %d: %v", i+1, err)
		}
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := e.enterAttempt(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("one more than the bound: got %v, want it to wait until its context ends", err)
	}
	e.exitAttempt()
	if err := e.enterAttempt(ctx); err != nil {
		t.Fatalf("after one exited: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- e.enterAttempt(ctx) }()
	select {
	case err := <-done:
		t.Fatalf("full again: got %v, want it to wait", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(closing)
	if err := <-done; err != closed {
		t.Errorf("Close: got %v, want the closed error", err)
	}
}
