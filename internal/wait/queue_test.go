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

func newQueues() *queueSet {
	qs, _ := closableQueues()
	return qs
}

// closableQueues returns queueSet and the channel whose close is the Client's
// close.
func closableQueues() (*queueSet, chan struct{}) {
	closing := make(chan struct{})
	return &queueSet{closing: closing, closed: errors.New("closed")}, closing
}

// The first caller is the head and tries at once; the others follow in
// the order they came, and the queue goes when its last caller leaves.
func TestQueues_Join_arrivalOrder(t *testing.T) {
	qs := newQueues()
	a, b, c := qs.join("k"), qs.join("k"), qs.join("k")
	if _, head, due := a.turn(); !head || due > 0 {
		t.Fatalf("first caller: head %v, due in %v; want the head, due now", head, due)
	}
	if _, head, _ := b.turn(); head {
		t.Fatal("second caller is the head")
	}
	if n := qs.waiting("k"); n != 3 {
		t.Fatalf("Waiting: got %d, want 3", n)
	}
	a.leave()
	if _, head, _ := b.turn(); !head {
		t.Fatal("after the head left, the second caller is not the head")
	}
	select {
	case <-b.wake:
	default:
		t.Error("the new head was not woken")
	}
	b.leave()
	c.leave()
	if qs.keys() != 0 || qs.waiting("k") != 0 || qs.headAttempts("k") != -1 {
		t.Errorf("after every caller left: %d queues, %d waiting; want none", qs.keys(), qs.waiting("k"))
	}
}

// A refusal counts for every caller in the queue; those whose strategy
// gives up leave it and are woken, each with its own count.
func TestTicket_Refused_countsForEveryCaller(t *testing.T) {
	qs := newQueues()
	s := every{d: time.Hour, n: 2}
	a := qs.join("k")
	a.refused(s) // a: 1
	b := qs.join("k")
	if a.refused(s) { // a: 2, gives up; b: 1, becomes the head
		t.Fatal("the head went on past its strategy's last attempt")
	}
	if gaveUp, _, _ := a.turn(); !gaveUp {
		t.Error("a: want gave up")
	}
	gaveUp, head, due := b.turn()
	if gaveUp || !head {
		t.Fatalf("b: gave up %v, head %v; want the head, waiting", gaveUp, head)
	}
	if due < 59*time.Minute {
		t.Errorf("b is due in %v; want the strategy's hour", due)
	}
	if qs.headAttempts("k") != 1 {
		t.Errorf("b's attempts: got %d, want 1", qs.headAttempts("k"))
	}
}

// A kick makes the head try at once, and a refusal that comes after it
// does not push the head's next try back: the refusal is stale.
func TestQueues_Kick_headTriesAtOnce(t *testing.T) {
	qs := newQueues()
	a := qs.join("k")
	a.refused(every{d: time.Hour, n: 10})
	if _, _, due := a.turn(); due <= 0 {
		t.Fatal("after a refusal the head is due now")
	}
	qs.kick("k")
	qs.kick("other") // nobody waits: nothing happens
	if _, _, due := a.turn(); due > 0 {
		t.Fatalf("after a kick the head is due in %v; want now", due)
	}
	a.refused(every{d: time.Hour, n: 10}) // sent before the kick
	if _, _, due := a.turn(); due > 0 {
		t.Errorf("a refusal after a kick delayed the head by %v", due)
	}
	if !a.takeKick() || a.takeKick() {
		t.Error("TakeKick: want true once, then false")
	}
}

// After the head took the key, the next head waits a step of its
// strategy (the key is held here, and its release kicks); for a shared key
// it tries at once.
func TestTicket_Acquired_nextHead(t *testing.T) {
	for _, shared := range []bool{false, true} {
		qs := newQueues()
		a, b := qs.join("k"), qs.join("k")
		a.acquired(every{d: time.Hour, n: 10}, shared)
		_, head, due := b.turn()
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
	a, b := qs.join("k"), qs.join("k")
	failover := errors.New("read-only")
	a.setRefusal(failover)
	if r, _ := b.refusal(); r != failover {
		t.Errorf("b's refusal: got %v, want the head's", r)
	}
	held := errors.New("held")
	a.setHeld(held)
	if r, h := b.refusal(); r != nil || h != held {
		t.Errorf("after an answer: refusal %v, held %v; want none and the answer", r, h)
	}
}

// sleep ends when the caller is woken, when the head's wait passes, when
// its context ends and when the Client closes.
func TestTicket_Sleep_ends(t *testing.T) {
	qs, closing := closableQueues()
	a, b := qs.join("k"), qs.join("k")
	if err := a.sleep(context.Background(), true, time.Millisecond); err != nil {
		t.Errorf("head's wait: %v", err)
	}
	go a.leave() // wakes b
	if err := b.sleep(context.Background(), false, 0); err != nil {
		t.Errorf("woken: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.sleep(ctx, false, 0); !errors.Is(err, context.Canceled) {
		t.Errorf("ended context: got %v", err)
	}
	close(closing)
	if err := b.sleep(context.Background(), false, 0); err != qs.closed {
		t.Errorf("closed: got %v, want the closed error", err)
	}
}
