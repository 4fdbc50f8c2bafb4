package sqllock

import (
	"context"
	"time"
)

// What a Lock does with its name's wake-up channel (wake.go): the channel
// is handed to the Lock whose Acquire waited on it; the Lock's release lets
// go of it, which wakes the process that has waited longest; and a Lock left
// to lapse lets go of it when its lease could have expired.

// handTo gives the channel of name, held by its wait queue, to l, which
// the queue's head just acquired; it does nothing when the queue does not
// hold it.
func (ws *wakeups) handTo(ctx context.Context, name string, l *Lock) {
	// Not bound by the caller's context: the lease is taken, and a channel
	// left with a queue that has no head any more would stay pinned.
	ch := ws.takeAnyway(ctx, name)
	if ch == nil {
		return
	}
	if ch.conn != nil && ch.byLock == nil && l.c.db.Stats().MaxOpenConnections > 0 {
		// A bounded pool: kept for the Lock's life, the channel could
		// take the connection the lease's own statements (Refresh, the
		// keep-alive's, Release) need once the caller's work holds the
		// others. It is let go of now; the next process polls.
		ws.put(name, ch)
		l.c.letGo(ctx, name, nil)
		return
	}
	if ch.conn != nil && ch.byLock == nil {
		ws.set(ch, ch.conn, l)
		l.mu.Lock()
		l.wake = true
		l.lapse = time.AfterFunc(time.Until(l.validUntil)+lapseSlack, l.lapsed)
		l.mu.Unlock()
	}
	ws.put(name, ch)
}

// lapseSlack is how long after a Lock's ValidUntil a channel it holds is let
// go of when the Lock was neither released nor renewed.
const lapseSlack = 100 * time.Millisecond

// lapsed runs when the lease of l, which holds its name's channel, could
// have expired: if l was renewed since, it looks again then; if it was
// released, there is nothing to do; else the lease lapsed unreleased, and
// the channel is let go of, so that the process waiting longest for the
// name learns of it now, and no connection stays pinned.
func (l *Lock) lapsed() {
	l.mu.Lock()
	if !l.wake || l.released || l.endCause != nil {
		l.mu.Unlock()
		return // released, or a release under way lets go of it
	}
	if d := time.Until(l.validUntil); d > 0 {
		l.lapse.Reset(d + lapseSlack)
		l.mu.Unlock()
		return
	}
	l.wake = false
	l.mu.Unlock()
	l.c.letGo(context.Background(), l.waitKey(), l)
}

// afterRelease does what the wake-up channels (wake.go) ask after the
// release statement of l, which reached the server when ok.
func (l *Lock) afterRelease(ctx context.Context, ok bool) {
	l.mu.Lock()
	contended, wake, probe := l.contended, l.wake, l.probe && ok
	l.wake, l.probe = false, l.probe && !probe
	if l.lapse != nil {
		l.lapse.Stop()
	}
	l.mu.Unlock()
	key := l.waitKey() // the queue and channel of its kind (wait_kinds.go)
	ctx = bounded(ctx) // the release's bound holds for the let-go and the probe
	if contended {
		l.c.wake.waited(key) // this Client's next Acquire queues behind the others
	}
	if wake {
		// Right after the statement, whatever its outcome: the channel
		// wakes the next process, whose acquire decides.
		l.c.letGo(ctx, key, l)
	}
	if probe {
		l.c.probe(ctx, key)
	}
}
