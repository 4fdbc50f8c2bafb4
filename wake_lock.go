package sqllock

import (
	"context"
	"time"

	"github.com/sqllock/sqllock/internal/wait"
)

// What a Lock does with its name's wake-up channel (internal/wait): the channel
// is handed to the Lock whose Acquire waited on it; the Lock's release lets
// go of it, which wakes the process that has waited longest; and a Lock left
// to lapse lets go of it when its lease could have expired.

// holdChannel records that l holds its key's channel, which its wait
// queue just handed it (wait.Channels.HandTo): l's release lets go of it,
// and so does its lease's lapse.
func (l *Lock) holdChannel() {
	l.mu.Lock()
	l.wake = true
	l.lapse = time.AfterFunc(time.Until(l.validUntil)+lapseSlack, l.lapsed)
	l.mu.Unlock()
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
	l.c.wait.Channels.LetGo(context.Background(), l.waitKey(), l)
}

// afterRelease does what the wake-up channels (internal/wait) ask after the
// release statement of l, which reached the server when ok.
func (l *Lock) afterRelease(ctx context.Context, ok bool) {
	l.mu.Lock()
	contended, wake, probe := l.contended, l.wake, l.probe && ok
	l.wake, l.probe = false, l.probe && !probe
	if l.lapse != nil {
		l.lapse.Stop()
	}
	l.mu.Unlock()
	if !contended && !wake && !probe {
		return // a Lock whose acquire did not wait: nothing to do, nothing made
	}
	key := l.waitKey()      // the queue and channel of its kind (wait_kinds.go)
	ctx = wait.Bounded(ctx) // the release's bound holds for the let-go and the probe
	if contended {
		l.c.wait.Channels.Waited(key) // this Client's next Acquire queues behind the others
	}
	if wake {
		// Right after the statement, whatever its outcome: the channel
		// wakes the next process, whose acquire decides.
		l.c.wait.Channels.LetGo(ctx, key, l)
	}
	if probe {
		l.c.wait.Channels.Probe(ctx, key)
	}
}
