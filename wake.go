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

// WithWakeups sets how many wake-up channels the Client holds at once; the
// default is 4, and 0 turns them off. With them, a process waiting in an
// Acquire for what another process holds blocks on a server named lock
// (GET_LOCK) instead of polling, and a release wakes the process that waited
// longest. Each channel holds a pool connection while the Client waits and,
// after waiting, until the Lock's Release
// (docs/usage.md#handing-a-name-to-a-waiting-process).
func WithWakeups(n int) Option {
	return func(c *Client) error {
		if n < 0 {
			return fmt.Errorf("sqllock: WithWakeups(%d): the number of wake-up channels cannot be negative", n)
		}
		c.wakeups = n
		return nil
	}
}
