package settle

import (
	"context"
	"errors"
	"testing"
	"time"
)

// One rule settles an orphan's token, for every kind of lease: a DELETE that
// removed rows settles it when only one send may have committed; one sent
// after the acquire could commit settles it whatever it found.
func TestToken_Settles(t *testing.T) {
	last := time.Now()
	for _, tc := range []struct {
		n    int64
		once bool
		sent time.Time
		want bool
	}{
		{1, true, last, true},
		{3, true, last, true}, // a set's rows, or a semaphore's
		{1, false, last, false},
		{0, true, last, false},
		{0, false, last.Add(Wait + time.Millisecond), true},
		{1, false, last.Add(Wait + time.Millisecond), true},
		{0, false, last.Add(Wait), false},
	} {
		x := NewToken("tok", time.Minute, last, tc.once)
		if got := x.Settles(tc.n, tc.sent); got != tc.want {
			t.Errorf("n %d, once %t, sent %v after the last send: got %t, want %t", tc.n, tc.once, tc.sent.Sub(last), got, tc.want)
		}
	}
}

// A Book remembers MaxTokens tokens at most, forgetting first those whose
// leases expire first; a token remembered again is merged, not added.
func TestBook_Remember_bounded(t *testing.T) {
	var o Book
	now := time.Now()
	for i := range MaxTokens + 10 {
		o.Remember("n", NewToken(string(rune('a'+i%26))+time.Duration(i).String(), time.Duration(i+1)*time.Second, now, false))
	}
	if got := int(o.n.Load()); got != MaxTokens {
		t.Errorf("remembered: got %d, want %d", got, MaxTokens)
	}
	// The ones whose leases expire first went first.
	for _, x := range o.byKey["n"] {
		if x.Expires.Before(now.Add(Wait + 11*time.Second)) {
			t.Fatalf("kept a token whose lease expires at +%v, want the first 10 gone", x.Expires.Sub(now))
		}
	}
	o.Remember("n", NewToken(o.byKey["n"][0].Value, time.Hour, now, false))
	if got := int(o.n.Load()); got != MaxTokens {
		t.Errorf("remembered after a repeat: got %d, want %d", got, MaxTokens)
	}
	if got := o.Take("n", now.Add(Wait+time.Duration(MaxTokens+11)*time.Second)); len(got) != 1 {
		t.Errorf("take after every lease but one expired: got %d tokens, want 1", len(got))
	}
	if got := int(o.n.Load()); got != 0 {
		t.Errorf("remembered after take: got %d, want 0", got)
	}
}

// Claim hands every live token of the key to settle and remembers again
// those it did not settle, and no other key's.
func TestBook_Claim_keepsUnsettled(t *testing.T) {
	var b Book
	now := time.Now()
	b.Remember("k", NewToken("a", time.Minute, now, true), NewToken("b", time.Minute, now, false))
	b.Remember("other", NewToken("c", time.Minute, now, true))
	var seen []string
	b.Claim("k", func(x Token) bool {
		seen = append(seen, x.Value)
		return x.Value == "a"
	})
	if len(seen) != 2 {
		t.Fatalf("settle saw %v, want both of the key's tokens", seen)
	}
	if got := b.Take("k", now); len(got) != 1 || got[0].Value != "b" {
		t.Errorf("after Claim: got %v, want only b remembered", got)
	}
	if !b.Has("other") || b.Len() != 1 {
		t.Errorf("another key's token: Has %t, Len %d, want it kept alone", b.Has("other"), b.Len())
	}
}

// A token remembered twice is one token, with the later times, and Once
// only when both sends said so.
func TestBook_Remember_merges(t *testing.T) {
	var b Book
	now := time.Now()
	b.Remember("k", NewToken("a", time.Second, now, true))
	b.Remember("k", NewToken("a", time.Minute, now.Add(time.Second), false))
	xs := b.Take("k", now)
	if len(xs) != 1 {
		t.Fatalf("got %d tokens, want 1", len(xs))
	}
	if x := xs[0]; x.Once || !x.Settled.Equal(now.Add(time.Second+Wait)) || !x.Expires.Equal(now.Add(time.Second+Wait+time.Minute)) {
		t.Errorf("merged: got %+v, want Once false and the second's times", x)
	}
}

// Delete sends nothing while a minimum hold keeps the token's lease, and
// judges the DELETE by the rule once it may send it.
func TestDelete_keptAndSettled(t *testing.T) {
	x := NewToken("a", time.Minute, time.Now(), true)
	x.Kept = time.Now().Add(time.Hour)
	sent := 0
	del := func(context.Context, string) (int64, error) { sent++; return 1, nil }
	if Delete(t.Context(), x, del) || sent != 0 {
		t.Errorf("kept: settled or sent (%d sends), want neither", sent)
	}
	x.Kept = time.Time{}
	if !Delete(t.Context(), x, del) || sent != 1 {
		t.Errorf("a DELETE that removed the one send's lease: want it settled after one send (%d sends)", sent)
	}
	if Delete(t.Context(), x, func(context.Context, string) (int64, error) { return 0, errors.New("lost") }) {
		t.Error("a failed DELETE: got settled, want not")
	}
}
