package engine

import (
	"database/sql"
	"sync"
	"sync/atomic"
)

// An acquire that finds the name's lease attached to its holder's session
// writes nothing and answers 3, and acquire_attached, which reads the
// session, decides (queries.sql). A name found attached is likely to be
// found so again: its holder keeps it alive, and an Acquire that waits, or
// a TryAcquire each tick of a cron on several hosts, asks again and again.
// So the Server remembers the names it found attached, and sends their
// next acquire as acquire_attached at once: one statement, where it would
// be two. acquire_attached decides every lease as acquire does, attached
// or not, so a name remembered wrongly costs the session read, never a
// wrong answer: what the acquire rests on is still read by the statement
// that relies on it. A name is forgotten once this Server takes it, and
// all are past attachedNames.

// attachedNames bounds the names remembered: a Client asks for more names
// than that only by the thousand, where the second statement of each first
// acquire is the lesser cost.
const attachedNames = 4096

// attachedSeen is the set of names the Server's acquires found attached.
// Its zero value is empty and ready.
type attachedSeen struct {
	n     atomic.Int32 // len(names), read without mu: most acquires find none
	mu    sync.Mutex
	names map[string]struct{}
}

// has reports whether name was found attached and not taken since.
func (a *attachedSeen) has(name string) bool {
	if a.n.Load() == 0 {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	_, ok := a.names[name]
	return ok
}

// add remembers name; past attachedNames, it forgets the others first.
func (a *attachedSeen) add(name string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.names == nil || len(a.names) >= attachedNames {
		a.names = make(map[string]struct{})
	}
	a.names[name] = struct{}{}
	a.n.Store(int32(len(a.names)))
}

// drop forgets name: this Server took it.
func (a *attachedSeen) drop(name string) {
	if a.n.Load() == 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.names, name)
	a.n.Store(int32(len(a.names)))
}

// attachedMark reports whether an acquire answered 3: the lease it found is
// attached (queries.sql, acquire).
func attachedMark(r sql.Result) bool {
	id, err := r.LastInsertId()
	return err == nil && id == 3
}

// takenMark reports whether an acquire answered a fence (above 3): it took
// the name, or its lease was ours already.
func takenMark(r sql.Result) bool {
	id, err := r.LastInsertId()
	return err == nil && uint64(id) > 3
}
