package sqllock

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The wake-up channel of a name hands it from one process to the next
// without polling, in the order they came. It is a server named lock
// (GET_LOCK, statements wake_wait and wake_release of queries.sql) beside
// the lease, on a connection of its own, used only by Clients made
// [WithWakeups]:
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
//
// Nothing depends on the channel for safety: the lease row and its fence
// decide who holds a name, and every grant is followed by the acquire
// statement. A channel that fails (a lost or killed connection, a full
// pool) only makes the head poll as it would without one. GET_LOCK times
// out after wakeRecheckMax at the most, and the head then polls once, so a
// process that holds the channel but is stuck cannot keep the others from
// a lease that lapsed. Within one Client, only the head of a name's queue
// uses the channel; the other callers wait in the queue as before.

// DefaultWakeups is whether a Client uses wake-up channels unless
// [WithWakeups] says otherwise.
const DefaultWakeups = false

// WithWakeups turns wake-up channels on or off (see [DefaultWakeups]). With
// them on, a process waiting in [Client.Acquire] for a name another process
// holds blocks on a server named lock (GET_LOCK) instead of polling: the
// holder lets go of it right after its [Lock.Release], which wakes the
// process that has waited longest within a round trip, and sends nothing
// while it waits (but one poll every few seconds, in case the holder is
// stuck). A process that releases a name and acquires it again queues
// behind the processes that were waiting. It also works when some
// processes use it and others do not: they poll, as they would without it.
//
// The cost: a connection of the *sql.DB's pool for each name this Client
// waits for (held by the waiting call) or holds after having waited for it
// (held until the Release), taken out of the pool and given back after;
// one statement more (GET_LOCK, which writes nothing) per contended
// Acquire, and one more (RELEASE_LOCK) after the Release of a Lock that
// waited. The Release of a Lock whose Acquire did not wait sends one
// statement more too, after its own, at most ten times a second per name
// (IS_USED_LOCK, which writes nothing): whether another process waits, so
// that this one queues behind it next time. TryAcquire and its Locks send nothing more. A pool
// limited by SetMaxOpenConns keeps one connection free for the lease
// statements: when it has no other, the Client polls instead. The lease,
// its fence and every error stay as they are without it.
func WithWakeups(on bool) Option {
	return func(c *Client) error {
		c.wake.on = on
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
	// wakeReleaseTimeout bounds letting go of a channel.
	wakeReleaseTimeout = time.Second
	// wakeWaitSlack is how much longer than the server's GET_LOCK timeout
	// the client lets a wait run before it cuts the connection.
	wakeWaitSlack = 2 * time.Second
)

// wakeups are a Client's wake-up channels, one per name it waits for or
// holds after waiting. The zero value is off.
type wakeups struct {
	on                  bool
	waitSQL, releaseSQL string // with the table's name in place
	probeSQL            string
	stop                context.Context // ends when Close starts
	cancel              context.CancelFunc
	refused             atomic.Bool // the server refuses GET_LOCK: poll, always
	// waitCap, when set, is the longest wait the connections' read timeout
	// lets through (shortenWaits); zero: wakeRecheckMax.
	waitCap atomic.Int64
	lastCut atomic.Int64 // how long the last wait ran before its connection broke

	mu     sync.Mutex
	chans  map[string]*wakeChan
	recent map[string]time.Time // when this Client last waited for a name
	probed map[string]time.Time // when a release last probed a name
	closed bool
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
	ws.stop, ws.cancel = context.WithCancel(context.Background())
	raw := strings.Trim(table, "`")
	ws.waitSQL = strings.ReplaceAll(queries["wake_wait"], "'sqllock'", "'"+raw+"'")
	ws.releaseSQL = strings.ReplaceAll(queries["wake_release"], "'sqllock'", "'"+raw+"'")
	ws.probeSQL = strings.ReplaceAll(queries["wake_probe"], "'sqllock'", "'"+raw+"'")
}

// bind puts literals in place of the placeholders of stmt, in order. The
// literals are made here (hex digits, numbers), never taken from a caller.
func bind(stmt string, lits ...string) string {
	var b strings.Builder
	for _, l := range lits {
		i := strings.IndexByte(stmt, '?')
		b.WriteString(stmt[:i])
		b.WriteString(l)
		stmt = stmt[i+1:]
	}
	b.WriteString(stmt)
	return b.String()
}

func hexLiteral(name string) string { return "X'" + hex.EncodeToString([]byte(name)) + "'" }

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
// once every probeEvery, and if so records that it does.
func (ws *wakeups) probeDue(name string) bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if t, ok := ws.probed[name]; ok && time.Since(t) < probeEvery {
		return false
	}
	stamp(&ws.probed, name, probeEvery)
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
		case ch.sem <- struct{}{}:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-ws.stop.Done():
			return nil, ErrClosed
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

// put lets go of ch's sem, dropping ch when it holds nothing. After Close
// started, whatever it holds is let go of at once.
func (ws *wakeups) put(name string, ch *wakeChan) {
	ws.mu.Lock()
	if ws.closed && ch.conn != nil {
		discardConn(ch.conn)
		ch.conn, ch.byLock = nil, nil
	}
	if ch.conn == nil && ws.chans[name] == ch {
		delete(ws.chans, name)
	}
	ws.mu.Unlock()
	<-ch.sem
}

// set changes what ch holds; the caller holds ch.sem. Writes also take
// ws.mu, so that holdsWake and Close may read them.
func (ws *wakeups) set(ch *wakeChan, conn *sql.Conn, by *Lock) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ch.conn, ch.byLock = conn, by
}

// discardConn closes conn's connection instead of giving it back to the
// pool: the named lock it may hold dies with it.
func discardConn(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = conn.Close()
}

// poolFull reports whether the pool has no connection to spare for a
// channel beside the one the lease statements need.
func (c *Client) poolFull() bool {
	s := c.db.Stats()
	return s.MaxOpenConnections > 0 && s.InUse >= s.MaxOpenConnections-1
}

// waitWake is the wait of the head of name's queue on the channel, for a
// lease of ttl: it blocks in GET_LOCK until the channel is granted, its
// timeout passes, or ctx ends. queued reports that another process held
// the channel when the wait began. The error is ctx's, or ErrClosed; a
// failure of the channel is wakeFailed, never an error.
func (c *Client) waitWake(ctx context.Context, name string, ttl time.Duration) (st wakeState, queued bool, err error) {
	ws := &c.wake
	if ws.refused.Load() {
		return wakeFailed, false, nil
	}
	ch, err := ws.take(ctx, name)
	if err != nil {
		return wakeFailed, false, err
	}
	defer ws.put(name, ch)
	switch {
	case ch.conn != nil && ch.byLock != nil:
		return wakeLockHeld, false, nil
	case ch.conn != nil:
		return wakeQueueHeld, false, nil
	case c.poolFull():
		return wakeFailed, false, nil
	}
	wait := min(max(ttl, wakeRecheckMin), ws.maxWait())
	if d, ok := ctx.Deadline(); ok {
		wait = max(min(wait, time.Until(d)), time.Second)
	}
	secs := (wait + time.Second - 1) / time.Second
	// The server ends GET_LOCK after secs; the client ends the wait a
	// little later, so that a connection a NAT or a load balancer dropped
	// in silence cannot hold the head of the queue, and every caller
	// behind it, until TCP gives up. Close ends the wait at once: the
	// driver cuts a connection whose context ends mid-statement, and the
	// named lock dies with it.
	wctx, cancel := context.WithTimeout(ctx, secs*time.Second+wakeWaitSlack)
	defer cancel()
	defer context.AfterFunc(ws.stop, cancel)()
	began := time.Now()
	conn, err := c.db.Conn(wctx)
	if err != nil {
		return c.wakeFailure(ctx, name, err)
	}
	lit := hexLiteral(name)
	var free, got sql.NullInt64
	err = conn.QueryRowContext(wctx, bind(ws.waitSQL, lit, lit, strconv.FormatInt(int64(secs), 10))).Scan(&free, &got)
	if err != nil || got.Int64 != 1 {
		// Timed out, or refused by the server: the lock is not ours. Any
		// other failure leaves a connection we cannot trust: it goes.
		if err == nil {
			_ = conn.Close()
			return wakeTimedOut, true, nil
		}
		if _, ok := serverErrno(err); ok && classify(err) != failedUnknown {
			_ = conn.Close() // an error reply: the connection holds nothing
		} else {
			discardConn(conn)
		}
		if elapsed := time.Since(began); classify(err) == failedUnknown && wctx.Err() == nil && elapsed < wait {
			// The connection broke mid-wait. The driver reports its own
			// read timeout (a DSN's readTimeout) so too: when two waits
			// in a row break after the same time, that is what cut them.
			c.wakeCut(ctx, elapsed, wait)
		}
		return c.wakeFailure(ctx, name, err)
	}
	ws.set(ch, conn, nil)
	return wakeGranted, free.Int64 != 1, nil
}

// wakeFailure is the answer of a wait on name's channel that failed with err.
func (c *Client) wakeFailure(ctx context.Context, name string, err error) (wakeState, bool, error) {
	if cerr := ctxErr(ctx); cerr != nil {
		return wakeFailed, false, cerr
	}
	if c.wake.stop.Err() != nil {
		return wakeFailed, false, ErrClosed
	}
	if n, ok := serverErrno(err); ok && n == erNotSupportedYet {
		if !c.wake.refused.Swap(true) {
			c.log.WarnContext(ctx, "sqllock: the server refuses GET_LOCK; this Client's wake-up channels stay off, and waiting processes poll", "err", err)
		}
		return wakeFailed, false, nil
	}
	c.log.DebugContext(ctx, "sqllock: wake-up channel failed; polling instead", "name", name, "err", err)
	return wakeFailed, false, nil
}

// letGo lets go of the channel of name if by holds it (by nil: the wait
// queue), which wakes the first process waiting for it.
func (c *Client) letGo(ctx context.Context, name string, by *Lock) {
	ws := &c.wake
	if !ws.has(name) {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), wakeReleaseTimeout)
	defer cancel()
	ch, err := ws.take(ctx, name)
	if err != nil {
		return // Close lets go of it
	}
	defer ws.put(name, ch)
	if ch.conn == nil || ch.byLock != by {
		return
	}
	conn := ch.conn
	ws.set(ch, nil, nil)
	if ws.stop.Err() != nil {
		// Close has started: no round trip, which would add its own
		// second to Close's bound; the named lock dies with the
		// connection.
		discardConn(conn)
		return
	}
	var ok sql.NullInt64
	if err := conn.QueryRowContext(ctx, bind(ws.releaseSQL, hexLiteral(name))).Scan(&ok); err != nil || ok.Int64 != 1 {
		discardConn(conn) // the lock dies with the connection
		return
	}
	_ = conn.Close() // back to the pool, holding nothing
}

// probe asks the server, at most once every probeEvery, whether another
// process holds, so waits for, the channel of name, and if so records that
// this Client waited for it: its
// next Acquire of name queues behind that process instead of racing it.
// Without it, a process that holds a name without having waited for it
// would take it back after each release, before the one process that
// polls for it (the others wait behind that one on the channel).
func (c *Client) probe(ctx context.Context, name string) {
	if c.wake.stop.Err() != nil || !c.wake.probeDue(name) {
		return // Close has started: nothing of this Client waits any more
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), wakeReleaseTimeout)
	defer cancel()
	var id sql.NullInt64
	if err := c.db.QueryRowContext(ctx, bind(c.wake.probeSQL, hexLiteral(name))).Scan(&id); err == nil && id.Valid {
		c.wake.waited(name)
	}
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
	chans := make([]*wakeChan, 0, len(ws.chans))
	for _, ch := range ws.chans {
		chans = append(chans, ch)
	}
	ws.mu.Unlock()
	for _, ch := range chans {
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
			ch.conn, ch.byLock = nil, nil
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

// maxWait is the longest one GET_LOCK waits: wakeRecheckMax, or less when
// the connections' read timeout cut a longer wait.
func (ws *wakeups) maxWait() time.Duration {
	if d := time.Duration(ws.waitCap.Load()); d > 0 {
		return d
	}
	return wakeRecheckMax
}

// wakeCut is told that a wait meant to last wait broke after elapsed. Two
// in a row that break after the same time (within a tenth, at least 100ms)
// are a timeout of the connections: a DSN's readTimeout shorter than the
// wait, which would make every wait fail and open a connection again. Waits
// then last a whole second less than elapsed; below a second the channels
// stay off, and waiting processes poll. Each change is logged once.
func (c *Client) wakeCut(ctx context.Context, elapsed, wait time.Duration) {
	ws := &c.wake
	last := time.Duration(ws.lastCut.Swap(int64(elapsed)))
	if diff := (elapsed - last).Abs(); last == 0 || diff > max(elapsed/10, 100*time.Millisecond) {
		return
	}
	capped := elapsed.Truncate(time.Second) - time.Second
	if capped < time.Second {
		if !ws.refused.Swap(true) {
			c.log.WarnContext(ctx, "sqllock: the connections' read timeout (a DSN's readTimeout) cuts every wake-up wait; this Client's wake-up channels stay off, and waiting processes poll: set readTimeout above 7s", "cut_after", elapsed, "wait", wait)
		}
		return
	}
	if old := ws.waitCap.Swap(int64(capped)); old == 0 || time.Duration(old) > capped {
		c.log.WarnContext(ctx, "sqllock: the connections' read timeout (a DSN's readTimeout) cut a wake-up wait; waits are shortened: set readTimeout above 7s", "cut_after", elapsed, "wait_now", capped)
	}
}
