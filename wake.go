package sqllock

import "fmt"

// Wake-up channels hand a name from one waiting process to the next
// without polling, in the order they came: a server named lock (GET_LOCK)
// beside the lease, on a connection of its own. The machinery is
// internal/wait's (channel.go); what a Lock does with its channel is in
// wake_lock.go.

// defaultWakeups is how many wake-up channels a Client holds at once unless
// [WithWakeups] says otherwise: the names it waits for beyond these poll.
const defaultWakeups = 4

// WithWakeups sets how many wake-up channels the Client holds at once, each
// on a connection of the *sql.DB's pool; 0 turns them off, and waiting
// processes poll. The default is 4.
//
// With them, a process waiting in [Client.Acquire] for a name another
// process holds (or in [Client.AcquireSet] for a set, or in
// [Semaphore.Acquire] for a semaphore, each with a channel of its own) blocks on a server named lock (GET_LOCK) instead of
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
		c.wakeups = n
		return nil
	}
}
