package wait

import (
	"context"
	"database/sql"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// The wake-up channel of a name hands it from one process to the next
// without polling, in the order they came. It is a server named lock
// (GET_LOCK, statements wake_wait and wake_release of queries.sql) beside
// the lease, on a connection of its own. Clients use it unless made
// WithWakeups(0):
//
//   - A Client whose Acquire is refused, or that waited for the name within
//     the last contendedFor, has the head of its wait queue block in
//     GET_LOCK instead of sleeping between polls. Granted, it sends the
//     acquire. If that succeeds, the Lock holds the lease and the channel,
//     and every other waiting process queues behind it in GET_LOCK. If it
//     is refused (the holder does not use the channel, or its channel died),
//     the head keeps the channel and polls on its RetryStrategy, alone:
//     the others stay queued behind it.
//   - A Lock that holds the channel lets go of it right after its release
//     statement, which wakes the first process in line: the hand-off costs
//     one round trip more than the release, and no process polls.
//   - So that a process that releases and at once acquires again does not
//     jump the queue, a Client that waited for the name recently goes
//     through GET_LOCK first; and the release of a Lock taken without
//     waiting asks the server (wake_probe) whether another process holds
//     the channel, which it does only while it waits for the name. An
//     Acquire on a name this Client has not waited for sends the acquire
//     statement alone; TryAcquire never touches the channel.
//   - A Client holds at most max channels at once (defaultWakeups), each on
//     a connection of its own, and never the pool's last connection. A name
//     that finds them all taken polls (look.go), as it would without
//     channels; the names that hold one keep it until their Lock is
//     released or their queue empties.
//
// Nothing depends on the channel for safety: the lease row and its fence
// decide who holds a name, and every grant is followed by the acquire
// statement. A channel that fails (a lost or killed connection, a full
// pool) only makes the head poll as it would without one. GET_LOCK times
// out after wakeRecheckMax at the most, and the head then polls once, so a
// process that holds the channel but is stuck cannot keep the others from
// a lease that lapsed. Within one Client, only the head of a name's queue
// uses the channel; the other callers wait in the queue as before.

const (
	// contendedFor is how long after waiting for a name (or releasing a
	// Lock it had waited for) a Client's Acquire of it goes through the
	// channel first.
	contendedFor = time.Second
	// wakeRecheckMin and wakeRecheckMax bound how long one GET_LOCK waits
	// before the caller polls once: the ttl asked for, within these.
	wakeRecheckMin = time.Second
	wakeRecheckMax = 5 * time.Second
	// probeEvery is how often, at most, the releases of one name's Locks
	// taken without waiting ask whether another process waits: a name
	// released many times a second pays for one probe in many.
	probeEvery = 100 * time.Millisecond
	// probeAnyEvery is how often, at most, a Client probes at all, so that
	// releases of many names, each taken once, do not each cost a
	// statement more: fifty probes a second at the most.
	probeAnyEvery = 20 * time.Millisecond
	// wakeReleaseTimeout bounds letting go of a channel.
	wakeReleaseTimeout = time.Second
	// wakeWaitSlack is how much longer than the server's GET_LOCK timeout
	// the client lets a wait run before it cuts the connection.
	wakeWaitSlack = 2 * time.Second
)

// A channelSet is a Client's wake-up channels, one per key it waits for or
// holds after waiting (Engine.Init readies them).
type channelSet struct {
	on        bool                     // max > 0
	max       int                      // channels held at once, at most
	sql       func(name string) string // Config.SQL
	db        *sql.DB
	log       *slog.Logger
	told      func(key string, st state, wait time.Duration) // Config.Woke
	closedErr error                                          // Config.Closed
	stop      context.Context                                // ends when Close starts
	cancel    context.CancelFunc
	refused   atomic.Bool // the server refuses GET_LOCK: poll, always
	// waitCap, when set, is the longest wait the connections' read timeout
	// lets through (cut); zero: wakeRecheckMax.
	waitCap atomic.Int64
	lastCut atomic.Int64 // how long the last wait ran before its connection broke

	mu        sync.Mutex
	used      int // channels whose connection is taken: held, or in a wait
	chans     map[string]*channel
	recent    map[string]time.Time // when this Client last waited for a key
	probed    map[string]time.Time // when a release last probed a key
	probedAny time.Time            // when a release last probed
	closed    bool
}

// A channel is the wake-up channel of one key in one Client.
type channel struct {
	// sem is held by whoever uses conn or changes the fields below.
	sem  chan struct{}
	conn *sql.Conn // the connection holding the named lock; nil when not held
	// holder is the lease that holds the channel (handTo); nil while conn
	// is nil or while the key's wait queue holds it (its head polls).
	holder any
}

// A state is what a wait on a channel came to, or (stOff) that the
// channels turned off.
type state int

const (
	stGranted   state = iota // this call's GET_LOCK was granted: try now
	stTimedOut               // GET_LOCK timed out: poll once now
	stQueueHeld              // the wait queue already held it: poll on the strategy
	stLockHeld               // a lease of this Client holds it: its release wakes the queue
	stFailed                 // no channel this time: poll on the strategy
	stOff                    // the channels turned off: the server refuses GET_LOCK, or the connections' read timeout cuts every wait
)

// halt ends every wait on a channel at once: Close's first step.
func (ws *channelSet) halt() {
	if ws.cancel != nil {
		ws.cancel()
	}
}

// contended reports whether this Client waited for name within the last
// contendedFor.
func (ws *channelSet) contended(name string) bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	t, ok := ws.recent[name]
	if ok && time.Since(t) >= contendedFor {
		delete(ws.recent, name)
		return false
	}
	return ok
}

// waitedAny reports whether this Client waited for any key within the last
// contendedFor.
func (ws *channelSet) waitedAny() bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for n, t := range ws.recent {
		if time.Since(t) < contendedFor {
			return true
		}
		delete(ws.recent, n)
	}
	return false
}

// waited records that this Client waited for name now.
func (ws *channelSet) waited(name string) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	stamp(&ws.recent, name, contendedFor)
}

// probeDue reports whether a release of name should probe now, at most
// once every probeEvery for the name and once every probeAnyEvery in all,
// and if so records that it does. A name a release skips is probed by a
// later one: a process that keeps taking a name others wait for learns of
// them within a few of its releases.
func (ws *channelSet) probeDue(name string) bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if time.Since(ws.probedAny) < probeAnyEvery {
		return false
	}
	if t, ok := ws.probed[name]; ok && time.Since(t) < probeEvery {
		return false
	}
	stamp(&ws.probed, name, probeEvery)
	ws.probedAny = time.Now()
	return true
}

// stamp sets (*m)[name] to now, first dropping the entries older than
// keep once the map has grown, so that many names do not make it grow.
func stamp(m *map[string]time.Time, name string, keep time.Duration) {
	if *m == nil {
		*m = make(map[string]time.Time)
	}
	if len(*m) >= 1024 {
		for n, t := range *m {
			if time.Since(t) >= keep {
				delete(*m, n)
			}
		}
	}
	(*m)[name] = time.Now()
}

// put lets go of ch's sem, dropping ch when it holds nothing. After Close
// started, whatever it holds is let go of at once.
func (ws *channelSet) put(name string, ch *channel) {
	ws.mu.Lock()
	if ws.closed && ch.conn != nil {
		discardConn(ch.conn)
		ws.clearLocked(ch)
	}
	if ch.conn == nil && ws.chans[name] == ch {
		delete(ws.chans, name)
	}
	ws.mu.Unlock()
	<-ch.sem
}

// set changes what ch holds; the caller holds ch.sem. Writes also take
// ws.mu, so that holds and closeAll may read them. A connection set here
// was reserved (reserve); one let go of here is counted back.
func (ws *channelSet) set(ch *channel, conn *sql.Conn, by any) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if conn == nil {
		ws.clearLocked(ch)
		return
	}
	ch.conn, ch.holder = conn, by
}

// clearLocked empties ch, counting its connection, if any, back; ws.mu is
// held.
func (ws *channelSet) clearLocked(ch *channel) {
	if ch.conn != nil {
		ws.used--
	}
	ch.conn, ch.holder = nil, nil
}

// reserve counts one more channel connection, if the Client's bound allows
// it, before the connection is taken; unreserve counts it back when the
// wait does not keep it.
func (ws *channelSet) reserve() bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.used >= ws.max || ws.closed {
		return false
	}
	ws.used++
	return true
}

func (ws *channelSet) unreserve() {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.used--
}

// inUse returns how many channel connections are taken; for tests.
func (ws *channelSet) inUse() int {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return ws.used
}

// closeAll lets go of every channel: Close calls it. Waits under way end at
// once (their contexts end with stop); a channel still in use when ctx ends
// is let go of by its user.
func (ws *channelSet) closeAll(ctx context.Context) {
	if ws.cancel == nil {
		return
	}
	ws.mu.Lock()
	ws.closed = true
	ws.cancel()
	chans := make(map[string]*channel, len(ws.chans))
	for name, ch := range ws.chans {
		chans[name] = ch
	}
	ws.mu.Unlock()
	for name, ch := range chans {
		// A free channel is always let go of, even once ctx has ended (a
		// select on both would pick either at random). One still in use
		// when ctx ends is let go of by its user, in put, which sees
		// closed.
		select {
		case ch.sem <- struct{}{}:
		default:
			select {
			case ch.sem <- struct{}{}:
			case <-ctx.Done():
				continue
			}
		}
		ws.mu.Lock()
		if ch.conn != nil {
			discardConn(ch.conn)
			ws.clearLocked(ch)
		}
		if ws.chans[name] == ch {
			delete(ws.chans, name)
		}
		ws.mu.Unlock()
		<-ch.sem
	}
}

// has reports whether name has a channel in this Client, held or in use.
func (ws *channelSet) has(name string) bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return ws.chans[name] != nil
}

// holds reports whether this Client holds the channel of name; for tests.
func (ws *channelSet) holds(name string) bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ch := ws.chans[name]
	return ch != nil && ch.conn != nil
}
