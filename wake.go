package sqllock

// Wake-up channels hand a name from one waiting process to the next
// without polling, in the order they came: a server named lock (GET_LOCK)
// beside the lease, on a connection of its own. The machinery is
// internal/wait's (channel.go); what a Lock does with its channel is in
// wake_lock.go.

// defaultWakeups is how many wake-up channels a Client holds at once unless
// [WithWakeups] says otherwise: the names it waits for beyond these poll.
const defaultWakeups = 4
