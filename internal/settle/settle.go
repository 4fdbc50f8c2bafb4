// Package settle is a Client's memory of the tokens whose leases may be
// left on the server: the tokens of acquires whose outcome stays unknown,
// and of Locks whose acquire was sent more than once, and the one rule that
// says when a DELETE by such a token proves that nothing of it is left.
// Every kind of lease (a name, a set's names, a semaphore's slot) is
// remembered and settled here, by the key its caller gives (the name, or
// the semaphore's rows). It sends nothing itself: the caller hands it the
// DELETE to send.
//
// An acquire whose outcome is unknown (its connection broke after it was
// sent, or its caller's context cut it) may have taken the lease under a
// token nobody holds. The caller deletes that lease at once, but a DELETE
// proves it gone only when it deletes it: when it fails (the server is
// away) or finds no row (the acquire may still wait for a row lock on the
// server, and commit later), the token is remembered, and every later
// acquire of the key first deletes the lease it may hold (Book.Claim), so
// the key does not stay blocked for the whole ttl. A token is forgotten
// once such a DELETE removes its lease while only one send of it may have
// committed (a statement resent after a broken connection may have several
// in flight, and removing what one wrote proves nothing of the others), or
// once it can no longer hold one: its statements can have committed no
// later than Wait after the last was sent, and their lease lasted ttl from
// then. A lease a release with a minimum hold keeps under the token on
// purpose is left alone until the hold ends (Token.Kept).
//
// The bound assumes the server's lock wait timeout is at most its default,
// and that no proxy or server queue holds a send back longer than the rest
// of Wait before the server starts it: otherwise a send that commits later
// still leaves a lease that only expires.
package settle

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Wait bounds how long after it was sent a cut acquire may still commit on
// the server: longer than InnoDB's default lock wait timeout
// (innodb_lock_wait_timeout, 50 s), after which a waiting statement gives
// up.
const Wait = time.Minute

// MaxTokens bounds how many tokens a Book remembers; past it, the one whose
// lease expires first is forgotten, and that lease, if any, expires by
// itself.
const MaxTokens = 1024

// A Token is one token whose lease may be left on the server.
type Token struct {
	Value string
	// Settled is when the acquire can no longer commit: from then on a
	// DELETE that finds no row proves that no lease is left.
	Settled time.Time
	// Once: only one send of the token may have committed (the others
	// failed for sure), so a DELETE that removes its lease settles it.
	Once bool
	// Expires is when a lease the acquire took has expired for sure.
	Expires time.Time
	// Kept: a release with a minimum hold kept the lease under the token on
	// purpose until then at the latest; no DELETE by the token is sent
	// before, or the job would run again at once.
	Kept time.Time
}

// NewToken returns value, the token of an acquire for ttl whose last send
// was at last at the latest; once says that only one of its sends may
// have committed.
func NewToken(value string, ttl time.Duration, last time.Time, once bool) Token {
	settled := last.Add(Wait)
	return Token{Value: value, Settled: settled, Expires: settled.Add(ttl), Once: once}
}

// Settles reports whether a DELETE by the token, sent at sent, that removed
// n rows settles it: it removed what the acquire wrote, and only one send
// of it may have committed, or it was sent after the acquire could commit,
// so finding no row proves none is left. It is the one rule for every kind
// of lease.
func (x Token) Settles(n int64, sent time.Time) bool {
	return n > 0 && x.Once || sent.After(x.Settled)
}

// Delete sends del, a DELETE of what x may hold, unless a minimum hold
// keeps x's lease, and reports whether that settles x. It is judged by when
// the DELETE was sent, not when its reply came: sent after the acquire
// could commit, finding no row proves none is left.
func Delete(ctx context.Context, x Token, del func(ctx context.Context, token string) (int64, error)) bool {
	if time.Now().Before(x.Kept) {
		return false // the minimum hold still runs: its lease is no orphan
	}
	sent := time.Now()
	n, err := del(ctx, x.Value)
	return err == nil && x.Settles(n, sent)
}

// A Book remembers tokens by key. The zero value is ready to use.
type Book struct {
	// n counts the tokens, so that an acquire skips the mutex while there
	// are none: the common case costs one atomic load.
	n atomic.Int64

	mu    sync.Mutex
	byKey map[string][]Token
}

// Empty reports whether the Book remembers no token; it costs an atomic
// load.
func (b *Book) Empty() bool { return b.n.Load() == 0 }

// Remember records tokens of key. A token remembered already is merged with
// the new one: the later times, and Once only if both say so.
func (b *Book) Remember(key string, xs ...Token) {
	if len(xs) == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.byKey == nil {
		b.byKey = make(map[string][]Token)
	}
next:
	for _, x := range xs {
		for i, y := range b.byKey[key] {
			if y.Value == x.Value {
				y.Settled = later(y.Settled, x.Settled)
				y.Expires = later(y.Expires, x.Expires)
				y.Kept = later(y.Kept, x.Kept)
				y.Once = y.Once && x.Once
				b.byKey[key][i] = y
				continue next
			}
		}
		if b.n.Load() >= MaxTokens {
			b.evictLocked()
		}
		b.byKey[key] = append(b.byKey[key], x)
		b.n.Add(1)
	}
}

// evictLocked forgets the token whose lease expires first. b.mu is held.
func (b *Book) evictLocked() {
	var (
		first string
		at    int
		when  time.Time
	)
	for key, xs := range b.byKey {
		for i, x := range xs {
			if when.IsZero() || x.Expires.Before(when) {
				first, at, when = key, i, x.Expires
			}
		}
	}
	if when.IsZero() {
		return
	}
	xs := b.byKey[first]
	xs = append(xs[:at:at], xs[at+1:]...)
	if len(xs) == 0 {
		delete(b.byKey, first)
	} else {
		b.byKey[first] = xs
	}
	b.n.Add(-1)
}

// Take removes and returns the tokens remembered for key, dropping those
// whose lease has expired for sure by now.
func (b *Book) Take(key string, now time.Time) []Token {
	if b.Empty() {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	xs := b.byKey[key]
	if len(xs) == 0 {
		return nil
	}
	delete(b.byKey, key)
	b.n.Add(-int64(len(xs)))
	live := xs[:0]
	for _, x := range xs {
		if now.Before(x.Expires) {
			live = append(live, x)
		}
	}
	return live
}

// TakeAll removes and returns every token remembered, by key.
func (b *Book) TakeAll() map[string][]Token {
	b.mu.Lock()
	defer b.mu.Unlock()
	all := b.byKey
	b.byKey = nil
	b.n.Store(0)
	return all
}

// Claim takes the tokens remembered for key, hands each to settle (which
// deletes what it may hold and reports whether that settled it), and
// remembers again those that stay unsettled. It does nothing, and reads no
// clock, when the Book is empty.
func (b *Book) Claim(key string, settle func(Token) bool) {
	if b.Empty() {
		return
	}
	xs := b.Take(key, time.Now())
	var keep []Token
	for _, x := range xs {
		if !settle(x) {
			keep = append(keep, x)
		}
	}
	b.Remember(key, keep...)
}

// Has reports whether a token is remembered for key; with none remembered
// at all, it costs an atomic load.
func (b *Book) Has(key string) bool {
	if b.Empty() {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.byKey[key]) > 0
}

// Count returns how many tokens are remembered for key.
func (b *Book) Count(key string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.byKey[key])
}

// Len returns how many tokens are remembered in all.
func (b *Book) Len() int { return int(b.n.Load()) }

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
