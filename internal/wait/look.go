package wait

import (
	"context"
	"database/sql"
	"strings"
	"sync"
	"time"

	"github.com/sqllock/sqllock/internal/sqltext"
)

// How the waiting calls of one Client (Acquire, AcquireAll and Semaphore.Acquire,
// which wait in one path: acquire.go) poll, and what they cost the
// server in connections. Calls waiting for the same name, set or semaphore
// share a queue whose head alone sends statements (queue.go). The heads of every name share
// two bounds more, so that a Client waiting for a hundred names loads the
// server about as one waiting for a few:
//
//   - An acquire statement of a waiting call (its first attempt, and every
//     one after) takes one of maxWaitingAttempts slots while it runs.
//   - A head whose name was found held does not send the acquire again to
//     learn whether the name is free: it asks the look statement of
//     queries.sql, which answers for many names at once. One goroutine at
//     a time sends it, for every name due then (up to maxLookNames a
//     statement); heads that come due while it runs wait for the next one.
//     Only a name found free is sent the acquire, which decides.
//
// A head sends the acquire without looking first while its Client waits
// for lookAbove names or fewer: the acquire is then the poll, and a name
// let go of is taken one round trip after a poll sees it free, not two
// (with a holder that takes it back at once, that round trip decides
// who gets it). It does too when its answer is likely yes or must come
// from the acquire: its call has not been refused yet, the channel
// (channel.go) woke it, a Release in this Client woke it, or the Client has an
// orphan to delete for the name (held.go), which only the acquire's path
// deletes.
//
// Sets and semaphores do not look: the look answers for single names. So a
// Client's waiting calls take at most defaultWakeups (the channels,
// WithWakeups) + maxWaitingAttempts + 1 (the look) connections at once,
// however many names, sets and semaphores they wait for: 13 by default. The calls a caller makes
// itself (TryAcquire, Refresh, Release, Check's transaction, Inspect, List,
// and the refreshes of KeepAlive and Do) take one each while they run, as any
// query of the caller's would.

const (
	// maxWaitingAttempts bounds the acquire statements of a Client's
	// waiting calls under way at once.
	maxWaitingAttempts = 8
	// maxLookNames bounds the names one look statement asks about.
	maxLookNames = 64
	// lookAbove is how many names a Client waits for at most before its
	// heads poll with the look statement instead of their acquires.
	lookAbove = 4
	// lookTimeout bounds one look statement; a head whose look fails sends
	// its acquire instead.
	lookTimeout = 5 * time.Second
)

// A looker gathers the names whose heads ask whether they are free, and sends
// the look statement for them on one goroutine at a time. The zero value is
// ready to use.
type looker struct {
	db        *sql.DB
	sql       func(name string) string // Config.SQL
	stop      context.Context          // ends when Close starts
	closing   <-chan struct{}
	closedErr error

	mu      sync.Mutex
	asks    []lookAsk
	running bool // a sender goroutine runs
	closed  bool // Close started: no sender starts
	senders sync.WaitGroup
}

// A lookAsk is one head's question: is name held by a live lease?
type lookAsk struct {
	name   string
	answer chan lookAnswer // buffered: the sender never waits for the head
}

type lookAnswer struct {
	held bool
	err  error
}

// held reports whether a live lease on name stands, by the server's
// clock, asking in one statement with every other name due at the same time.
// Its error is ctx's, Config.Closed, or the look's own, after which the caller
// sends its acquire instead.
func (lk *looker) held(ctx context.Context, name string) (bool, error) {
	ask := lookAsk{name: name, answer: make(chan lookAnswer, 1)}
	lk.mu.Lock()
	if lk.closed {
		lk.mu.Unlock()
		return false, lk.closedErr
	}
	lk.asks = append(lk.asks, ask)
	start := !lk.running
	if start {
		lk.running = true
		lk.senders.Add(1)
	}
	lk.mu.Unlock()
	if start {
		go lk.send()
	}
	select {
	case a := <-ask.answer:
		return a.held, a.err
	case <-ctx.Done():
		return false, ctx.Err()
	case <-lk.closing:
		return false, lk.closedErr
	}
}

// send sends look statements until no head asks any more. Its
// statements end when Close starts.
func (lk *looker) send() {
	defer lk.senders.Done()
	for {
		lk.mu.Lock()
		if len(lk.asks) == 0 {
			lk.running = false
			lk.mu.Unlock()
			return
		}
		n := min(len(lk.asks), maxLookNames)
		batch := make([]lookAsk, n)
		copy(batch, lk.asks)
		lk.asks = append(lk.asks[:0], lk.asks[n:]...)
		lk.mu.Unlock()

		held, err := lk.look(batch)
		for _, a := range batch {
			a.answer <- lookAnswer{held: held[a.name], err: err}
		}
	}
}

// look sends one look statement for the names of batch and returns those
// held by a live lease.
func (lk *looker) look(batch []lookAsk) (map[string]bool, error) {
	lits := make([]string, len(batch))
	for i, a := range batch {
		lits[i] = sqltext.Hex(a.name)
	}
	names, err := lk.holders(lk.stop, strings.Join(lits, ", "))
	if err != nil {
		return nil, err
	}
	held := make(map[string]bool, len(names))
	for _, n := range names {
		held[n] = true
	}
	return held, nil
}

// holders sends the look statement for in, the names' literals joined by
// commas, and returns those a live lease holds, by the server's clock. It
// ends with ctx, and after lookTimeout at most. The heads' looks use it,
// and so does a refused set, to say which of its names are held.
func (lk *looker) holders(ctx context.Context, in string) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, lookTimeout)
	defer cancel()
	rows, err := lk.db.QueryContext(ctx, strings.Replace(lk.sql("look"), "?", in, 1))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var held []string
	for rows.Next() {
		var name []byte
		if err := rows.Scan(&name); err != nil {
			return nil, err
		}
		held = append(held, string(name))
	}
	return held, rows.Err()
}

// sending reports whether a goroutine sends looks now; for tests.
func (lk *looker) sending() bool {
	lk.mu.Lock()
	defer lk.mu.Unlock()
	return lk.running
}

// close stops new senders and waits for the one under way, whose
// statement ends when Close starts (channelSet.Stop).
func (lk *looker) close() {
	lk.mu.Lock()
	lk.closed = true
	lk.mu.Unlock()
	lk.senders.Wait()
}
