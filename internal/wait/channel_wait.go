package wait

import (
	"context"
	"database/sql"
	"strconv"
	"time"

	"github.com/sqllock/sqllock/internal/fault"
	"github.com/sqllock/sqllock/internal/sqltext"
)

// The statements on a name's wake-up channel (channel.go): the wait of the head
// of the name's queue in GET_LOCK, letting go of the channel, which wakes the
// next process, and the probe after a release. Each bounds itself: no wait
// on the channel can hold up a caller past its context, a Close, or a
// connection that went silent.

// poolFull reports whether the pool has no connection to spare for a
// channel beside the one the lease statements need.
func (ws *channelSet) poolFull() bool {
	s := ws.db.Stats()
	return s.MaxOpenConnections > 0 && s.InUse >= s.MaxOpenConnections-1
}

// wait is the wait of the head of name's queue on the channel, for a
// lease of ttl: it blocks in GET_LOCK until the channel is granted, its
// timeout passes, or ctx ends. queued reports that another process held
// the channel when the wait began. The error is ctx's, or Config.Closed; a
// failure of the channel is stFailed, never an error.
func (ws *channelSet) wait(ctx context.Context, name string, ttl time.Duration) (st state, queued bool, err error) {
	if ws.refused.Load() {
		return stFailed, false, nil
	}
	ch, err := ws.take(ctx, name)
	if err != nil {
		return stFailed, false, err
	}
	defer ws.put(name, ch)
	switch {
	case ch.conn != nil && ch.holder != nil:
		return stLockHeld, false, nil
	case ch.conn != nil:
		return stQueueHeld, false, nil
	case ws.poolFull() || !ws.reserve():
		// The pool's last connection stays for the lease statements, and
		// past its bound the Client polls for the name.
		return stFailed, false, nil
	}
	kept := false
	defer func() {
		if !kept {
			ws.unreserve()
		}
	}()
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
	conn, err := ws.db.Conn(wctx)
	if err != nil {
		return ws.failure(ctx, name, err)
	}
	lit := sqltext.Hex(name)
	var free, got sql.NullInt64
	err = conn.QueryRowContext(wctx, sqltext.Bind(ws.sql("wake_wait"), lit, lit, strconv.FormatInt(int64(secs), 10))).Scan(&free, &got)
	if err != nil || got.Int64 != 1 {
		// Timed out, or refused by the server: the lock is not ours. Any
		// other failure leaves a connection we cannot trust: it goes.
		if err == nil {
			_ = conn.Close()
			return stTimedOut, true, nil
		}
		if _, ok := fault.Errno(err); ok && fault.Classify(err) != fault.Unknown {
			_ = conn.Close() // an error reply: the connection holds nothing
		} else {
			discardConn(conn)
		}
		if elapsed := time.Since(began); fault.Classify(err) == fault.Unknown && wctx.Err() == nil && elapsed < wait {
			// The connection broke mid-wait. The driver reports its own
			// read timeout (a DSN's readTimeout) so too: when two waits
			// in a row break after the same time, that is what cut them.
			ws.cut(ctx, elapsed, wait)
		}
		return ws.failure(ctx, name, err)
	}
	ws.set(ch, conn, nil)
	kept = true
	return stGranted, free.Int64 != 1, nil
}

// failure is the answer of a wait on name's channel that failed with err.
func (ws *channelSet) failure(ctx context.Context, name string, err error) (state, bool, error) {
	if cerr := fault.CtxErr(ctx); cerr != nil {
		return stFailed, false, cerr
	}
	if ws.stop.Err() != nil {
		return stFailed, false, ws.closedErr
	}
	if n, ok := fault.Errno(err); ok && n == fault.NotSupportedYet {
		if !ws.refused.Swap(true) {
			ws.log.WarnContext(ctx, "sqllock: the server refuses GET_LOCK; this Client's wake-up channels stay off, and waiting processes poll", "err", err)
			ws.told("", stOff, 0)
		}
		return stFailed, false, nil
	}
	ws.log.DebugContext(ctx, "sqllock: wake-up channel failed; polling instead", "name", name, "err", err)
	return stFailed, false, nil
}

// letGo lets go of the channel of name if by holds it (by nil: the wait
// queue), which wakes the first process waiting for it.
func (ws *channelSet) letGo(ctx context.Context, name string, by any) {
	ch := ws.takeAnyway(ctx, name)
	if ch == nil {
		return
	}
	defer ws.put(name, ch)
	ctx, cancel := anyway(ctx, wakeReleaseTimeout)
	defer cancel()
	if ch.conn == nil || ch.holder != by {
		return
	}
	conn := ch.conn
	ws.mu.Lock()
	ch.conn, ch.holder = nil, nil // counted back once conn is let go of
	ws.mu.Unlock()
	defer ws.unreserve()
	if ws.stop.Err() != nil {
		// Close has started: no round trip, which would add its own
		// second to Close's bound; the named lock dies with the
		// connection.
		discardConn(conn)
		return
	}
	var ok sql.NullInt64
	if err := conn.QueryRowContext(ctx, sqltext.Bind(ws.sql("wake_release"), sqltext.Hex(name))).Scan(&ok); err != nil || ok.Int64 != 1 {
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
func (ws *channelSet) probe(ctx context.Context, name string) {
	if ws.stop.Err() != nil || !ws.probeDue(name) {
		return // Close has started: nothing of this Client waits any more
	}
	ctx, cancel := anyway(ctx, wakeReleaseTimeout)
	defer cancel()
	var id sql.NullInt64
	if err := ws.db.QueryRowContext(ctx, sqltext.Bind(ws.sql("wake_probe"), sqltext.Hex(name))).Scan(&id); err == nil && id.Valid {
		ws.waited(name)
	}
}

// maxWait is the longest one GET_LOCK waits: wakeRecheckMax, or less when
// the connections' read timeout cut a longer wait.
func (ws *channelSet) maxWait() time.Duration {
	if d := time.Duration(ws.waitCap.Load()); d > 0 {
		return d
	}
	return wakeRecheckMax
}

// cut is told that a wait meant to last wait broke after elapsed. Two
// in a row that break after the same time (within a tenth, at least 100ms)
// are a timeout of the connections: a DSN's readTimeout shorter than the
// wait, which would make every wait fail and open a connection again. Waits
// then last a whole second less than elapsed; below a second the channels
// stay off, and waiting processes poll. Each change is logged once.
func (ws *channelSet) cut(ctx context.Context, elapsed, wait time.Duration) {
	last := time.Duration(ws.lastCut.Swap(int64(elapsed)))
	if diff := (elapsed - last).Abs(); last == 0 || diff > max(elapsed/10, 100*time.Millisecond) {
		return
	}
	capped := elapsed.Truncate(time.Second) - time.Second
	if capped < time.Second {
		if !ws.refused.Swap(true) {
			ws.log.WarnContext(ctx, "sqllock: the connections' read timeout (a DSN's readTimeout) cuts every wake-up wait; this Client's wake-up channels stay off, and waiting processes poll: set readTimeout above 7s", "cut_after", elapsed, "wait", wait)
			ws.told("", stOff, 0)
		}
		return
	}
	if old := ws.waitCap.Swap(int64(capped)); old == 0 || time.Duration(old) > capped {
		ws.log.WarnContext(ctx, "sqllock: the connections' read timeout (a DSN's readTimeout) cut a wake-up wait; waits are shortened: set readTimeout above 7s", "cut_after", elapsed, "wait_now", capped)
	}
}

// handTo gives the channel of name, held by its wait queue, to holder, the
// lease the queue's head just took, and runs adopt while the channel is
// still taken, so that holder learns it holds it before anyone can let go
// of it (letGo with holder). It does nothing when the queue does not hold
// the channel.
func (ws *channelSet) handTo(ctx context.Context, name string, holder any, adopt func()) {
	// Not bound by the caller's context: the lease is taken, and a channel
	// left with a queue that has no head any more would stay pinned.
	ch := ws.takeAnyway(ctx, name)
	if ch == nil {
		return
	}
	if ch.conn != nil && ch.holder == nil && ws.db.Stats().MaxOpenConnections > 0 {
		// A bounded pool: kept for the lease's life, the channel could
		// take the connection the lease's own statements (its refreshes,
		// its release) need once the caller's work holds the others. It
		// is let go of now; the next process polls.
		ws.put(name, ch)
		ws.letGo(ctx, name, nil)
		return
	}
	if ch.conn != nil && ch.holder == nil {
		ws.set(ch, ch.conn, holder)
		adopt()
	}
	ws.put(name, ch)
}

// take returns the channel of name with its sem held, as long as ctx
// allows; the Client's closed error once Close started.
func (ws *channelSet) take(ctx context.Context, name string) (*channel, error) {
	for {
		ws.mu.Lock()
		if ws.closed {
			ws.mu.Unlock()
			return nil, ws.closedErr
		}
		ch := ws.chans[name]
		if ch == nil {
			if ws.chans == nil {
				ws.chans = make(map[string]*channel)
			}
			ch = &channel{sem: make(chan struct{}, 1)}
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
				return nil, ws.closedErr
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
func (ws *channelSet) takeAnyway(ctx context.Context, name string) *channel {
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

// anyway returns a context for what must be done whatever ctx's end: ctx's
// values, ending after d; before, at ctx's deadline, when ctx is Bounded.
// A let-go cut short by it discards the connection, with which the server
// named lock dies.
func anyway(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if dl, ok := ctx.Deadline(); ok && ctx.Value(boundKey{}) != nil && time.Until(dl) < d {
		return context.WithDeadline(context.WithoutCancel(ctx), dl)
	}
	return context.WithTimeout(context.WithoutCancel(ctx), d)
}
