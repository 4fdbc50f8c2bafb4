package wait

import (
	"context"
	"errors"
	"testing"
	"time"
)

// every waits d after each attempt and gives up after n.
type every struct {
	d time.Duration
	n int
}

func (s every) Backoff(attempt int) (time.Duration, bool) { return s.d, attempt < s.n }

func newQueues() *Queues {
	qs, _ := closableQueues()
	return qs
}

// closableQueues returns Queues and the channel whose close is the Client's
// Close.
func closableQueues() (*Queues, chan struct{}) {
	closing := make(chan struct{})
	return &Queues{closing: closing, closed: errors.New("closed")}, closing
}

// The first caller is the head and tries at once; the others follow in
// the order they came, and the queue goes when its last caller leaves.
func TestQueues_Join_arrivalOrder(t *testing.T) {
	qs := newQueues()
	a, b, c := qs.Join("k"), qs.Join("k"), qs.Join("k")
	if _, head, due := a.Turn(); !head || due > 0 {
		t.Fatalf("first caller: head %v, due in %v; want the head, due now", head, due)
	}
	if _, head, _ := b.Turn(); head {
		t.Fatal("second caller is the head")
	}
	if n := qs.Waiting("k"); n != 3 {
		t.Fatalf("Waiting: got %d, want 3", n)
	}
	a.Leave()
	if _, head, _ := b.Turn(); !head {
		t.Fatal("after the head left, the second caller is not the head")
	}
	select {
	case <-b.wake:
	default:
		t.Error("the new head was not woken")
	}
	b.Leave()
	c.Leave()
	if qs.Len() != 0 || qs.Waiting("k") != 0 || qs.HeadAttempts("k") != -1 {
		t.Errorf("after every caller left: %d queues, %d waiting; want none", qs.Len(), qs.Waiting("k"))
	}
}

// A refusal counts for every caller in the queue; those whose strategy
// gives up leave it and are woken, each with its own count.
func TestTicket_Refused_countsForEveryCaller(t *testing.T) {
	qs := newQueues()
	s := every{d: time.Hour, n: 2}
	a := qs.Join("k")
	a.Refused(s) // a: 1
	b := qs.Join("k")
	if a.Refused(s) { // a: 2, gives up; b: 1, becomes the head
		t.Fatal("the head went on past its strategy's last attempt")
	}
	if gaveUp, _, _ := a.Turn(); !gaveUp {
		t.Error("a: want gave up")
	}
	gaveUp, head, due := b.Turn()
	if gaveUp || !head {
		t.Fatalf("b: gave up %v, head %v; want the head, waiting", gaveUp, head)
	}
	if due < 59*time.Minute {
		t.Errorf("b is due in %v; want the strategy's hour", due)
	}
	if qs.HeadAttempts("k") != 1 {
		t.Errorf("b's attempts: got %d, want 1", qs.HeadAttempts("k"))
	}
}

// A kick makes the head try at once, and a refusal that comes after it
// does not push the head's next try back: the refusal is stale.
func TestQueues_Kick_headTriesAtOnce(t *testing.T) {
	qs := newQueues()
	a := qs.Join("k")
	a.Refused(every{d: time.Hour, n: 10})
	if _, _, due := a.Turn(); due <= 0 {
		t.Fatal("after a refusal the head is due now")
	}
	qs.Kick("k")
	qs.Kick("other") // nobody waits: nothing happens
	if _, _, due := a.Turn(); due > 0 {
		t.Fatalf("after a kick the head is due in %v; want now", due)
	}
	a.Refused(every{d: time.Hour, n: 10}) // sent before the kick
	if _, _, due := a.Turn(); due > 0 {
		t.Errorf("a refusal after a kick delayed the head by %v", due)
	}
	if !a.TakeKick() || a.TakeKick() {
		t.Error("TakeKick: want true once, then false")
	}
}

// After the head took the key, the next head waits a step of its
// strategy (the key is held here, and its release kicks); for a shared key
// it tries at once.
func TestTicket_Acquired_nextHead(t *testing.T) {
	for _, shared := range []bool{false, true} {
		qs := newQueues()
		a, b := qs.Join("k"), qs.Join("k")
		a.Acquired(every{d: time.Hour, n: 10}, shared)
		_, head, due := b.Turn()
		if !head {
			t.Fatalf("shared %v: the next caller is not the head", shared)
		}
		if shared != (due <= 0) {
			t.Errorf("shared %v: the next head is due in %v", shared, due)
		}
	}
}

// The last refusal and the last held answer are the queue's, for every
// caller in it.
func TestTicket_Refusal_sharedByTheQueue(t *testing.T) {
	qs := newQueues()
	a, b := qs.Join("k"), qs.Join("k")
	failover := errors.New("read-only")
	a.SetRefusal(failover)
	if r, _ := b.Refusal(); r != failover {
		t.Errorf("b's refusal: got %v, want the head's", r)
	}
	held := errors.New("held")
	a.SetHeld(held)
	if r, h := b.Refusal(); r != nil || h != held {
		t.Errorf("after an answer: refusal %v, held %v; want none and the answer", r, h)
	}
}

// Sleep ends when the caller is woken, when the head's wait passes, when
// its context ends and when the Client closes.
func TestTicket_Sleep_ends(t *testing.T) {
	qs, closing := closableQueues()
	a, b := qs.Join("k"), qs.Join("k")
	if err := a.Sleep(context.Background(), true, time.Millisecond); err != nil {
		t.Errorf("head's wait: %v", err)
	}
	go a.Leave() // wakes b
	if err := b.Sleep(context.Background(), false, 0); err != nil {
		t.Errorf("woken: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.Sleep(ctx, false, 0); !errors.Is(err, context.Canceled) {
		t.Errorf("ended context: got %v", err)
	}
	close(closing)
	if err := b.Sleep(context.Background(), false, 0); err != qs.closed {
		t.Errorf("closed: got %v, want the closed error", err)
	}
}
