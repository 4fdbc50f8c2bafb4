package faultproxy

import (
	"testing"
	"time"
)

// sleepUntil returns at once for a zero or past time, not before t for a
// later one, and early, reporting false, once done is closed.
func TestSleepUntil(t *testing.T) {
	open := make(chan struct{})
	start := time.Now()
	if !sleepUntil(time.Time{}, open) || !sleepUntil(start.Add(-time.Second), open) {
		t.Fatal("a zero or past time: got false, want true")
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("a zero or past time took %v, want at once", took)
	}
	due := time.Now().Add(20 * time.Millisecond)
	if !sleepUntil(due, open) {
		t.Fatal("got false with done open, want true")
	}
	if now := time.Now(); now.Before(due) {
		t.Errorf("returned %v before its time", due.Sub(now))
	}

	done := make(chan struct{})
	time.AfterFunc(20*time.Millisecond, func() { close(done) })
	start = time.Now()
	if sleepUntil(start.Add(time.Minute), done) {
		t.Fatal("got true after done was closed, want false")
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("took %v to see done closed, want about 20ms", took)
	}
}
