package sqllock

import "math/rand/v2"

// Lanes make a semaphore of n > 1 slots fair between processes. A wake-up
// channel (internal/wait) wakes a waiter only when the one connection that
// holds it lets go, and a waiter blocks on one channel at a time: one
// channel per semaphore can hand on the release of one holder, not of
// any of n. So a waiting Semaphore.Acquire joins one of up to n lanes, each
// a queue and a channel of its own, as a single name has: the Lock whose
// Acquire waited on a lane keeps its channel, and its release wakes the
// process that has waited longest on that lane, which sends slot_acquire
// (any free slot; the slot rows decide, the lane is advice). A Client
// spreads its callers over the lanes, so a process with as many waiters as
// lanes waits on every one, and each lane goes round the processes that
// want it, in turn. Without lanes the queue that held the semaphore's one
// channel kept it while it had callers, and took every slot freed in its
// process at once: another process waited in GET_LOCK, and got nothing.
//
// Lane 1 is the semaphore's own key (slotRows), so that an Acquire that
// does not wait sends and makes nothing more than before; lane j > 1 is
// the name of slot j's row, which no lock name and no other key may be.

// slotLanes is how many lanes a Client uses for a semaphore of n slots:
// one per slot, within its channels; 1 (no lanes: one queue, whose head
// polls while another holds its channel) without channels.
func (c *Client) slotLanes(n int) int {
	ws := &c.wait.Channels
	if n < 2 || !ws.On() || ws.Refused() || c.oneLane {
		return 1
	}
	return min(n, ws.Max(), MaxSlots)
}

// laneKey is the key of lane j (1-based) of the semaphore whose fence row
// is named p.
func laneKey(sem, p string, j int) string {
	if j <= 1 {
		return p
	}
	return slotName(sem, j)
}

// chooseLane puts s in the lane of its semaphore with the fewest callers
// of this Client waiting; among those, one this Client waited on within the
// last second (it let go of that lane's channel, or waits behind it), so
// that a process that releases and acquires again queues behind the
// process its release woke instead of racing it.
func (s *slotCall) chooseLane() {
	c := s.c
	lanes := c.slotLanes(s.n)
	if lanes < 2 {
		return
	}
	s.lanes = true
	ws := &c.wait.Channels
	if c.wait.Queues.Len() == 0 && !ws.WaitedAny() {
		return // lane 1: nobody waits here, nothing was waited for lately
	}
	best, fewest, recent := 1, -1, false
	from := rand.IntN(lanes) // ties go to any lane, not always the first
	for i := range lanes {
		j := (from+i)%lanes + 1
		key := laneKey(s.sem, s.name, j)
		w, r := c.wait.Queues.Waiting(key), ws.Contended(key)
		if fewest < 0 || w < fewest || w == fewest && r && !recent {
			best, fewest, recent = j, w, r
		}
	}
	s.lane = best
}

// kickLanes makes the heads of lanes 2 and up of semaphore sem (p its
// fence row) in this Client try now: a slot was freed by a Lock that held
// no lane's channel, whose release woke no other process.
func (c *Client) kickLanes(sem, p string) {
	for j := 2; j <= min(c.wait.Channels.Max(), MaxSlots); j++ {
		c.wait.Queues.Kick(laneKey(sem, p, j))
	}
}
