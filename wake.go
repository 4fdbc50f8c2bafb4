package sqllock

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"strings"
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
//   - A Client holds at most max channels at once (DefaultWakeups), each on
//     a connection of its own, and never the pool's last connection. A name
//     that finds them all taken polls (poll.go), as it would without
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

// DefaultWakeups is how many wake-up channels a Client holds at once unless
// [WithWakeups] says otherwise: the names it waits for beyond these poll.
const DefaultWakeups = 4

// WithWakeups sets how many wake-up channels the Client holds at once, each
// on a connection of the *sql.DB's pool; 0 turns them off, and waiting
// processes poll. The default is [DefaultWakeups].
//
// With them, a process waiting in [Client.Acquire] for a name another
// process holds (or in [Client.AcquireAll] for a set, or in
// [Client.AcquireSlot] for a semaphore, each with a channel of its own) blocks on a server named lock (GET_LOCK) instead of
// polling: the holder lets go of it right after its [Lock.Release], which
// wakes the process that has waited longest within a round trip, and sends
// nothing while it waits (but one poll every few seconds, in case the
// holder is stuck). A process that releases a name and acquires it again
// queues behind the processes that were waiting. So the name goes round the
// processes that want it, in turn, instead of mostly to whichever polled
// last. It also works when some processes use it and others do not: they
// poll, as they would without it.
//
// The cost: one pool connection per channel, taken while this Client waits
// for the name, and kept by a Lock taken after waiting until its Release
// (or until its lease could have lapsed); n bounds them. A pool limited by
// SetMaxOpenConns keeps one connection free for the lease statements: when
// it has no other, the Client polls instead; and a Lock taken after waiting
// lets go of the channel at once instead of keeping it, so that the lease's
// own statements (Refresh, the keep-alive's, Release) never wait for a
// connection the channel holds while the caller's work holds the others
// (the next process then polls for the name rather than hearing of its
// release). One statement more (GET_LOCK, which writes nothing) per
// contended Acquire, and one more (RELEASE_LOCK) after the Release of a
// Lock that waited, or after its acquire in a limited pool. The Release of a Lock whose
// Acquire did not wait sends one statement more too, after its own, at most
// ten times a second per name and fifty per Client (IS_USED_LOCK, which
// writes nothing): whether another process waits, so that this one queues
// behind it next time.
// TryAcquire and its Locks send nothing more. The lease, its fence and
// every error stay as they are without it.
//
// Turn them off when every Acquire of a name is in one process (the
// Client's own queue is fair already), when connections are scarcer than
// fairness is worth (a server near max_connections), or behind a proxy
// that pools connections per transaction and cannot keep a session's named
// lock: a server that refuses GET_LOCK turns them off by itself.
func WithWakeups(n int) Option {
	return func(c *Client) error {
		if n < 0 {
			return fmt.Errorf("sqllock: WithWakeups(%d): the number of wake-up channels cannot be negative", n)
		}
		c.wake.max = n
		return nil
	}
}

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

// wakeups are a Client's wake-up channels, one per name it waits for or
// holds after waiting. The zero value is off.
type wakeups struct {
	on                  bool   // max > 0
	max                 int    // channels held at once, at most
	waitSQL, releaseSQL string // with the table's name in place
	probeSQL            string
	stop                context.Context // ends when Close starts
	cancel              context.CancelFunc
	refused             atomic.Bool // the server refuses GET_LOCK: poll, always
	// waitCap, when set, is the longest wait the connections' read timeout
	// lets through (shortenWaits); zero: wakeRecheckMax.
	waitCap atomic.Int64
	lastCut atomic.Int64 // how long the last wait ran before its connection broke

	mu        sync.Mutex
	used      int // channels whose connection is taken: held, or in a wait
	chans     map[string]*wakeChan
	recent    map[string]time.Time // when this Client last waited for a name
	probed    map[string]time.Time // when a release last probed a name
	probedAny time.Time            // when a release last probed
	closed    bool
}

// A wakeChan is the channel of one name in one Client.
type wakeChan struct {
	// sem is held by whoever uses conn or changes the fields below.
	sem  chan struct{}
	conn *sql.Conn // the connection holding the named lock; nil when not held
	// byLock is the Lock that holds the channel; nil while conn is nil or
	// while the name's wait queue holds it (its head polls).
	byLock *Lock
}

// wakeState is what a wait on a channel came to.
type wakeState int

const (
	wakeGranted   wakeState = iota // this call's GET_LOCK was granted: try now
	wakeTimedOut                   // GET_LOCK timed out: poll once now
	wakeQueueHeld                  // the wait queue already held it: poll on the strategy
	wakeLockHeld                   // a Lock of this Client holds it: its Release wakes the queue
	wakeFailed                     // no channel this time: poll on the strategy
)

func (ws *wakeups) init(table string) {
	ws.on = ws.max > 0
	ws.stop, ws.cancel = context.WithCancel(context.Background())
	raw := strings.Trim(table, "`")
	ws.waitSQL = tableNamedSQL("wake_wait", raw)
	ws.releaseSQL = tableNamedSQL("wake_release", raw)
	ws.probeSQL = tableNamedSQL("wake_probe", raw)
}

// contended reports whether this Client waited for name within the last
// contendedFor.
func (ws *wakeups) contended(name string) bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	t, ok := ws.recent[name]
	if ok && time.Since(t) >= contendedFor {
		delete(ws.recent, name)
		return false
	}
	return ok
}

// waited records that this Client waited for name now.
func (ws *wakeups) waited(name string) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	stamp(&ws.recent, name, contendedFor)
}

// probeDue reports whether a release of name should probe now, at most
// once every probeEvery for the name and once every probeAnyEvery in all,
// and if so records that it does. A name a release skips is probed by a
// later one: a process that keeps taking a name others wait for learns of
// them within a few of its releases.
func (ws *wakeups) probeDue(name string) bool {
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

// take returns the channel of name with its sem held, as long as ctx
// allows; ErrClosed once Close started.
func (ws *wakeups) take(ctx context.Context, name string) (*wakeChan, error) {
	for {
		ws.mu.Lock()
		if ws.closed {
			ws.mu.Unlock()
			return nil, ErrClosed
		}
		ch := ws.chans[name]
		if ch == nil {
			if ws.chans == nil {
				ws.chans = make(map[string]*wakeChan)
			}
			ch = &wakeChan{sem: make(chan struct{}, 1)}
			ws.chans[name] = ch
		}
		ws.mu.Unlock()
		select {
		case ch.sem <- struct{}{}: // free: taken even if ctx has ended
		default:
			select {
			case ch.sem <- struct{}{}:
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-ws.stop.Done():
				return nil, ErrClosed
			}
		}
		ws.mu.Lock()
		current := ws.chans[name] == ch && !ws.closed
		ws.mu.Unlock()
		if current {
			return ch, nil
		}
		<-ch.sem // dropped while we waited for it; look again
	}
}

// takeAnyway is take for what must be done whatever the caller's context
// (a hand-over, a let-go): it waits up to wakeReleaseTimeout instead. It
// returns nil when this Client has no channel of name, or Close has it,
// which lets go of it.
func (ws *wakeups) takeAnyway(ctx context.Context, name string) *wakeChan {
	if !ws.has(name) {
		return nil
	}
	ctx, cancel := anyway(ctx, wakeReleaseTimeout)
	defer cancel()
	ch, err := ws.take(ctx, name)
	if err != nil {
		return nil
	}
	return ch
}

// boundKey marks a context whose deadline bounds even what anyway runs: a
// release's, which must end within ReleaseTimeout, its channel's let-go
// included.
type boundKey struct{}

// bounded returns ctx marked so that anyway keeps to its deadline.
func bounded(ctx context.Context) context.Context {
	return context.WithValue(ctx, boundKey{}, true)
}

// anyway returns a context for what must be done whatever ctx's end: ctx's
// values, ending after d; before, at ctx's deadline, when ctx is bounded. A
// let-go cut short by it discards the connection, with which the server
// named lock dies.
func anyway(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if dl, ok := ctx.Deadline(); ok && ctx.Value(boundKey{}) != nil && time.Until(dl) < d {
		return context.WithDeadline(context.WithoutCancel(ctx), dl)
	}
	return context.WithTimeout(context.WithoutCancel(ctx), d)
}

// put lets go of ch's sem, dropping ch when it holds nothing. After Close
// started, whatever it holds is let go of at once.
func (ws *wakeups) put(name string, ch *wakeChan) {
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
// ws.mu, so that holdsWake and Close may read them. A connection set here
// was reserved (reserve); one let go of here is counted back.
func (ws *wakeups) set(ch *wakeChan, conn *sql.Conn, by *Lock) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if conn == nil {
		ws.clearLocked(ch)
		return
	}
	ch.conn, ch.byLock = conn, by
}

// clearLocked empties ch, counting its connection, if any, back; ws.mu is
// held.
func (ws *wakeups) clearLocked(ch *wakeChan) {
	if ch.conn != nil {
		ws.used--
	}
	ch.conn, ch.byLock = nil, nil
}

// reserve counts one more channel connection, if the Client's bound allows
// it, before the connection is taken; unreserve counts it back when the
// wait does not keep it.
func (ws *wakeups) reserve() bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.used >= ws.max || ws.closed {
		return false
	}
	ws.used++
	return true
}

func (ws *wakeups) unreserve() {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.used--
}

// inUse returns how many channel connections are taken; for tests.
func (ws *wakeups) inUse() int {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return ws.used
}

// discardConn closes conn's connection instead of giving it back to the
// pool: the named lock it may hold dies with it.
func discardConn(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = conn.Close()
}

// closeAll lets go of every channel: Close calls it. Waits under way end at
// once (their contexts end with stop); a channel still in use when ctx ends
// is let go of by its user.
func (ws *wakeups) closeAll(ctx context.Context) {
	if ws.cancel == nil {
		return
	}
	ws.mu.Lock()
	ws.closed = true
	ws.cancel()
	chans := make(map[string]*wakeChan, len(ws.chans))
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
func (ws *wakeups) has(name string) bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return ws.chans[name] != nil
}

// holdsWake reports whether this Client holds the channel of name; for tests.
func (ws *wakeups) holdsWake(name string) bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ch := ws.chans[name]
	return ch != nil && ch.conn != nil
}
