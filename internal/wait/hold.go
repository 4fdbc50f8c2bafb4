package wait

import (
	"context"
	"sync"
	"time"
)

// What a lease does with its key's wake-up channel (channel.go): the
// channel is handed to the lease whose acquire waited on it; the lease's
// release lets go of it, which wakes the process that has waited longest;
// and a lease left to lapse lets go of it when it could have expired.

// lapseSlack is how long after a lease could expire a channel it holds is
// let go of when it was neither released nor renewed.
const lapseSlack = 100 * time.Millisecond

// A Hold is what a lease taken by Acquire keeps of its key's wake-up
// channel, for its release to call. It is safe for concurrent use; a nil
// Hold does nothing.
type Hold struct {
	e     *Engine
	key   string
	lease func() (until time.Time, ended bool) // Call.Attempt's

	mu sync.Mutex
	// wake: the lease holds the key's channel, which its release lets go
	// of. contended: its acquire waited for the key. probe: its release
	// asks whether another process waits.
	wake, contended, probe bool
	lapse                  *time.Timer // lets go of the channel if the lease lapses unreleased
}

// adopt records that h holds its key's channel, which its wait queue just
// handed it (channelSet.handTo): its release lets go of it, and so does
// its lease's lapse.
func (h *Hold) adopt() {
	until, _ := h.lease()
	h.mu.Lock()
	h.wake = true
	h.lapse = time.AfterFunc(time.Until(until)+lapseSlack, h.lapsed)
	h.mu.Unlock()
}

// lapsed runs when h's lease could have expired: if it was renewed since,
// it looks again then; if its release started, there is nothing to do;
// else the lease lapsed unreleased, and the channel is let go of, so that
// the process waiting longest for the key learns of it now, and no
// connection stays pinned; then this Client's callers waiting for the key
// are kicked, to queue behind that process.
func (h *Hold) lapsed() {
	h.mu.Lock()
	if !h.wake {
		h.mu.Unlock()
		return
	}
	until, ended := h.lease()
	if ended {
		h.mu.Unlock()
		return // released, or a release under way lets go of it
	}
	if d := time.Until(until); d > 0 {
		h.lapse.Reset(d + lapseSlack)
		h.mu.Unlock()
		return
	}
	h.wake = false
	h.mu.Unlock()
	h.e.channels.letGo(context.Background(), h.key, h)
	h.e.queues.kick(h.key) // this Client's head waits behind the lease, unpolled (ownLease)
}

// Release does what the wake-up channels ask after the release statement
// of h's lease, which reached the server when ok: it lets go of the
// channel, which wakes the next process, whose acquire decides; and it
// marks or probes the key, so that this Client's next acquire of it
// queues behind the processes that wait.
func (h *Hold) Release(ctx context.Context, ok bool) {
	if h == nil {
		return
	}
	h.mu.Lock()
	contended, wake, probe := h.contended, h.wake, h.probe && ok
	h.wake, h.probe = false, h.probe && !probe
	if h.lapse != nil {
		h.lapse.Stop()
	}
	h.mu.Unlock()
	if !contended && !wake && !probe {
		return // a lease whose acquire did not wait: nothing to do
	}
	ws := &h.e.channels
	ctx = bounded(ctx) // the release's bound holds for the let-go and the probe
	if contended {
		ws.waited(h.key) // this Client's next acquire queues behind the others
	}
	if wake {
		ws.letGo(ctx, h.key, h)
		// This Client's head waits behind the lease, unpolled (ownLease),
		// whatever the release statement's answer was.
		h.e.queues.kick(h.key)
	}
	if probe {
		ws.probe(ctx, h.key)
	}
}

// Contended reports whether the acquire of h's lease waited for its key.
func (h *Hold) Contended() bool {
	if h == nil {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.contended
}
