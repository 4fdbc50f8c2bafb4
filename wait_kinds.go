package sqllock

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Every kind of waiting acquire (Acquire of one name, AcquireSet of a set,
// Semaphore.Acquire of a semaphore) waits in one path, acquireQueued (wait.go),
// on internal/wait's machinery: the Client's fair queue, the wake-up
// channel and the look. A waitCall is what that path needs of each kind.
// Its key names the queue and the channel: a lock's name, a set's setKey,
// a semaphore's lane's key (laneKey): each kind makes its own, and no two
// kinds share a queue.

// A waitCall is one waiting acquire, used by one goroutine.
type waitCall interface {
	// key names the call's queue in the Client and its wake-up channel.
	key() string
	// label names what the call waits for in the Observer's events.
	label() string
	// op begins the call's errors: `acquire "x"`.
	op() string
	leaseTTL() time.Duration
	// attempt sends one attempt, as the kind's Try call does.
	attempt(ctx context.Context) (*Lock, error)
	// final reports whether err, which wraps ErrNotAcquired, ends the call
	// at once instead of counting as a refused attempt.
	final(err error) bool
	// lookName is the one lease name a look (internal/wait) can answer for, or
	// "" when the kind has none: the look is single names' alone.
	lookName() string
	// shared reports whether the key may be held by several Locks at once
	// (a semaphore of more than one slot): then an acquisition does not make
	// the next caller in line wait, and the Lock does not keep the channel.
	shared() bool
}

func (a *acquireCall) key() string                            { return a.name }
func (a *acquireCall) label() string                          { return a.name }
func (a *acquireCall) op() string                             { return fmt.Sprintf("acquire %q", a.name) }
func (a *acquireCall) leaseTTL() time.Duration                { return a.ttl }
func (a *acquireCall) final(error) bool                       { return false }
func (a *acquireCall) lookName() string                       { return a.name }
func (a *acquireCall) shared() bool                           { return false }
func (a *setCall) key() string                                { return setKey(a.names) }
func (a *setCall) op() string                                 { return "acquire " + a.name }
func (a *setCall) lookName() string                           { return "" }
func (a *setCall) attempt(ctx context.Context) (*Lock, error) { return a.run(ctx, a) }
func (s *slotCall) label() string                             { return s.sem }
func (s *slotCall) op() string                                { return fmt.Sprintf("acquire a slot of %q", s.sem) }
func (s *slotCall) final(err error) bool                      { return errors.Is(err, ErrSlotCount) }
func (s *slotCall) lookName() string                          { return "" }
func (s *slotCall) shared() bool                              { return s.n > 1 && !s.lanes }

// key is the semaphore's fence row name, or its lane's (semaphore_lanes.go).
func (s *slotCall) key() string { return laneKey(s.sem, s.name, s.lane) }

// leaseTTL bounds a wait on the key's channel (wait.go): a lane's waits a
// second at most, then polls once, since a slot freed on a lane nobody
// waits on wakes no process (semaphore_lanes.go).
func (s *slotCall) leaseTTL() time.Duration {
	if s.lanes {
		return min(s.ttl, time.Second)
	}
	return s.ttl
}

// A setCall is an acquireCall for a set (acquire_set.go): name is the set's
// label, names its names; set is the lease set of the attempt under way.
type setCall struct {
	acquireCall
	set *lockSet
}

// waitKey is the key of the queue and channel l's acquire waited in: a
// set's key for a set, the semaphore's lane's for a slot, else the name.
func (l *Lock) waitKey() string { return l.kind.waitKey(l) }
