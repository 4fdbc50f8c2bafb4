// Package sqllock is a distributed lease lock kept in one table of a MySQL
// or MariaDB database, for services that already run on one: exactly one
// replica seeds the data, runs tonight's job, or leads.
//
// A lease is a row: the lock's name, a random owner token, the holder's
// description, a fence and an expiry. Every time is the server's
// (UTC_TIMESTAMP(6)), so clients whose clocks disagree still agree on who
// holds a name, and [Client.TryAcquire], [Lock.Refresh] and [Lock.Release]
// are one statement each (queries.sql; the table is schema.sql).
//
// Beyond a lock: sets of names taken all or none ([Client.TryAcquireSet]),
// semaphores ([Client.Semaphore]), work under a kept-alive lease
// ([Client.Do]), leader election ([Client.Elect]) and [Client.Once].
// docs/usage.md shows them; docs/guarantees.md, servers.md, statements.md
// and operations.md say what they promise, where, what they send, and how to
// run them.
//
// # What a lease promises
//
// While a lease is live by the server's clock, no other acquire of its name
// succeeds. It is not a mutex across a process pause: a holder that stalls
// past its expiry (GC, swap, a lost network) can wake believing it still
// holds the name while a new holder works. [Lock.ValidUntil] says until when
// the holder can rely on the lease, on its own monotonic clock. For work that
// must never overlap, pass [Lock.Fence] to the resource and have it refuse
// fences lower than the highest it has seen, or, for writes to the same
// database, call [Lock.Check] in their transaction.
//
// Each acquisition of a name issues a fence greater than any issued for it
// before, across takeovers and across release and re-acquire, in the order
// acquisitions commit. A name's fence row, which a release keeps, orders
// them without trusting any clock, as long as nobody deletes it by hand; a
// refresh keeps the fence.
package sqllock
