// Package sqllock is a distributed lease lock kept in one table of a MySQL
// or MariaDB database, for services that already run on one: exactly one
// replica seeds the data, runs tonight's job, or leads.
//
// A lease is a row: the lock's name, a random owner token, the holder's
// description, a fencing token and an expiry. Every time is the server's
// (UTC_TIMESTAMP(6)), so clients whose clocks disagree still agree on who
// holds a name. Each operation is one statement and, on a warm connection,
// one round trip:
//
//   - [Client.TryAcquire] is one INSERT ... ON DUPLICATE KEY UPDATE that takes
//     a free name or an expired lease and leaves a live one alone. Whether it
//     acquired is read from the insert id the statement reports (set with
//     LAST_INSERT_ID), not from the affected-rows count, whose meaning the
//     DSN flag clientFoundRows changes.
//   - [Lock.Refresh] is one UPDATE guarded by the token and the expiry.
//   - [Lock.Release] is one DELETE guarded by the token, so it never removes
//     a lease someone else took over.
//
// The statements are in queries.sql and the table in schema.sql, both
// embedded; [Client.CreateTable] runs schema.sql, which can also be run by
// hand. A Client holds the table against schema.sql before its first
// statement, and refuses one that differs ([ErrBadTable]); on TiDB it sends
// TiDB's forms of its statements (queries.sql). Before its first write it
// proves, under a name of its own, that the server hands back each
// statement's own answer as MySQL does, and refuses a server or a layer in
// between that does not, such as Vitess ([ErrUnsupportedServer]). The library takes a *sql.DB
// and imports no driver; it is tested with github.com/go-sql-driver/mysql
// against MariaDB 10.11 and 11.8, MySQL 9.7, TiDB 8.4, Galera and Group
// Replication, and, where Docker runs, MySQL 5.7 and 8.0.
//
// # What a lease promises
//
// While a Lock's lease is live by the server's clock, no other TryAcquire or
// Acquire of that name succeeds. A lease is not a mutex across a process
// pause: a holder that stalls past its expiry (GC, swap, a lost network)
// can wake up believing it still holds the name while a new holder works.
// [Lock.ValidUntil] gives the latest instant the holder can rely on, on its
// own monotonic clock, assuming only that the client's and the server's
// clocks run at the same rate. For work that must never overlap, pass
// [Lock.Fence] to the resource and have it refuse fences lower than the
// highest it has seen.
//
// # Fences
//
// A name has two rows: its lease, which Release deletes, and its fence, which
// stays. Each acquisition moves the fence row to the greater of its old value
// plus one and the server's clock in microseconds, in the same statement and
// under the fence row's lock, so fences of a name grow strictly in the order
// acquisitions commit: across takeovers, and across release and re-acquire.
// This needs no assumption about clocks; the clock only seeds a name's first
// fence and keeps fences readable as times. The one assumption is that the
// fence rows are not deleted by hand: a name whose fence row is gone starts
// again from the server's clock, which is safe only if that clock is ahead of
// every fence issued for it before. A refresh keeps the fence.
//
// # Work under a lease
//
// [Client.Do] and [Lock.Do] run a function under a lease that a
// keep-alive renews (see [Lock.KeepAlive]); the function's context is
// cancelled, with cause [ErrLockLost], before the lease could lapse, and the
// lease is released when the function returns. [WithMinHold] keeps the name
// taken for a minimum time. [Client.Elect] is leader election over a lease,
// [Client.Once] runs a function successfully once across replicas and
// restarts, and [Lock.Check] fences writes made in a transaction on the same
// database. [Client.Close] releases every lease its Client holds.
//
// # Operators and logging
//
// [Client.List] and [Client.Inspect] read the table, [Client.ForceRelease]
// frees a name whoever holds it (the fence row stays) and [Client.ResetOnce]
// lets Once run again; the sqllock command (cmd/sqllock) does the same from
// a shell, and runs cron jobs under a lease. [WithLogger] reports retries,
// failed renewals, lost leases, Elect's changes of lead and Close's releases
// to a log/slog Logger.
//
// # Errors
//
// [ErrNotAcquired] and [ErrNotHeld] are compared with errors.Is; errors from
// the driver are wrapped. A deadlock, a lock wait timeout, a cluster
// rollback or a broken connection is retried a few times with the same
// token, which makes the retry give the answer the first attempt would have.
// Bad input (an empty or over-long name, a lease outside [MinTTL, MaxTTL], a
// bad table name) is refused before any statement is sent.
package sqllock
