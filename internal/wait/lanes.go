package wait

import "math/rand/v2"

// Lanes make a semaphore of n > 1 slots fair between processes. A wake-up
// channel (channel.go) wakes a waiter only when the one connection that
// holds it lets go, and a waiter blocks on one channel at a time: one
// channel per semaphore can hand on the release of one holder, not of
// any of n. So a waiting acquire of a slot joins one of up to n lanes,
// each a queue and a channel of its own, as a single name has: the lease
// whose acquire waited on a lane keeps its channel, and its release wakes
// the process that has waited longest on that lane, which sends its
// acquire (any free slot; the slot rows decide, the lane is advice). A
// Client spreads its callers over the lanes, so a process with as many
// waiters as lanes waits on every one, and each lane goes round the
// processes that want it, in turn. Without lanes the queue that held the
// semaphore's one channel kept it while it had callers, and took every
// slot freed in its process at once: another process waited in GET_LOCK,
// and got nothing.
//
// The caller names the lanes' keys (key(j), 1-based): lane 1 is best the
// key an acquire that does not wait uses, so that it sends and makes
// nothing more.

// lanes is how many lanes a Client uses for a semaphore of n slots: one
// per slot, within its channels and Config.MaxLanes; 1 (no lanes: one
// queue, whose head polls while another holds its channel) without
// channels.
func (e *Engine) lanes(n int) int {
	ws := &e.channels
	if n < 2 || !ws.on || ws.refused.Load() {
		return 1
	}
	return max(min(n, ws.max, e.maxLanes), 1)
}

// Lane returns the lane a waiting acquire of a slot of a semaphore of n
// slots joins, key(j) naming lane j's key: the one with the fewest
// callers of this Client waiting; among those, one this Client waited on
// within the last second (it let go of that lane's channel, or waits
// behind it), so that a process that releases and acquires again queues
// behind the process its release woke instead of racing it. It returns 0
// when the semaphore has no lanes.
func (e *Engine) Lane(n int, key func(j int) string) int {
	lanes := e.lanes(n)
	if lanes < 2 {
		return 0
	}
	ws := &e.channels
	if e.queues.keys() == 0 && !ws.waitedAny() {
		return 1 // nobody waits here, nothing was waited for lately
	}
	best, fewest, recent := 1, -1, false
	from := rand.IntN(lanes) // ties go to any lane, not always the first
	for i := range lanes {
		j := (from+i)%lanes + 1
		k := key(j)
		w, r := e.queues.waiting(k), ws.contended(k)
		if fewest < 0 || w < fewest || w == fewest && r && !recent {
			best, fewest, recent = j, w, r
		}
	}
	return best
}

// KickLanes makes the heads of lanes 2 and up (key(j) naming lane j's key)
// in this Client try now: a slot was freed by a lease that held no lane's
// channel, whose release woke no other process.
func (e *Engine) KickLanes(key func(j int) string) {
	if e.queues.keys() == 0 {
		return
	}
	for j := 2; j <= min(e.channels.max, e.maxLanes); j++ {
		e.queues.kick(key(j))
	}
}
