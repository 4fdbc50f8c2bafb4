// Command linearize checks the histories sqllock-stress writes (its
// -history flag) for linearizability against a model of the lock and the
// register it protects, with porcupine (github.com/anishathalye/porcupine).
// It is independent of the stress checker's own rules: it reads only the
// history file, and decides whether some order of the operations, each
// taking effect at one instant between its call and its return, is one the
// model allows.
//
//	cd linearize && go run . [-timeout 1m] [-slack 1ms] [-viz FILE] HISTORY...
//
// It exits 0 when every history is linearizable; 1 when the model rejects
// one, after writing porcupine's visualization of it (HISTORY.html, or
// -viz) and naming the names whose operations it rejects; 3 when the check
// ran past -timeout without a verdict, which fails too (with the
// visualization of how far it got); 2 on bad usage or an unreadable file.
//
// # The history
//
// One JSON object per line, one per operation: k, the kind (acquire,
// refresh, release, write: a fenced write to the register, cwrite: a write
// made after Lock.Check in its transaction to a register without a guard
// of its own, read: the parent's read of the register after the run); n,
// the name; p and g, the process (-1: the parent) and goroutine; f, the
// fence (the one acquired, or the holder's for its other operations); r,
// the result (ok; refused; rejected: a fenced write the register refused;
// notheld: a refresh or release that found the lease not the caller's;
// unknown: an error left the outcome unknown; none: a write the server
// rolled back); c and t, the call and return times in ns on a clock the
// processes share; ttl, the lease length in ns; ka, the holder keeps its
// lease with Lock.KeepAlive; set, the size of the set (TryAcquireSet) the
// operation took, refreshed or released for every name of it at once; w,
// the register's count of writes a read found.
//
// # The model
//
// The history is partitioned by name (a set's operations count once for
// each of its names); each name's state is the highest fence issued, its
// latest lease (for a semaphore, each slot's: the holder's fence, whether
// it was released, and the bounds of its expiry), and the register (its
// fence and its count of writes). A lease ends by time, with no operation,
// so the model keeps the bounds of each lease's expiry: taken or renewed by
// an operation that ran on the server between its call c and return t, a
// lease of ttl lasted at least until c + ttl and at most until t + ttl. The
// model requires:
//
//   - an acquire's fence is greater than every fence issued before it (a
//     semaphore's across its slots), and a semaphore of n hands out slots
//     1 to n; since every recorded acquire must take effect, one takes
//     effect only after the recorded acquire with the next lower fence,
//     which spares the search the orders that could never finish (callers
//     waiting in Acquire keep a dozen acquires of a name in flight);
//   - an acquire takes the name (or the slot) only once its latest lease
//     was released or may have expired (its return at or after the
//     earliest expiry);
//   - a refresh succeeds, and a write after Lock.Check commits, only while
//     the caller's lease may be live: not taken over, not released, called
//     before the latest expiry;
//   - a release succeeds only when nobody took the lease over; a release or
//     refresh that finds the lease gone, or a Check that refuses a write,
//     only when it may have been taken over, released or expired;
//   - the register takes a fenced write whose fence is at least its own
//     and refuses a lower one; a write after Check sets it whatever its
//     fence; a read returns the last write's fence and the count of
//     writes, so an acknowledged write that the register lost fails the
//     read;
//   - an operation carries a fence that some acquire issued.
//
// Every time comparison is widened by -slack in the direction that
// accepts, for the clocks of the processes and the server: the lease rules
// assume they read one host clock, as every run of the stress checker does.
//
// An operation of unknown outcome may take effect at any time after its
// call, or never: a write's two outcomes are both kept (the model is
// nondeterministic), a refresh may have extended the lease by any time, a
// release may have freed it; a set's refresh or release that found one of
// its leases gone counts as of unknown outcome for each name, since it
// still extended or freed the others. Acquires of unknown outcome are left
// out: no holder acts on them, and the lease one may have taken ends by
// its ttl or by its Client's clean-up before another can take the name, so
// leaving it out only drops what the model could check of it. Refusals are
// left out too: a refusal is right while a lease is live, but also while a
// Lock.Check transaction holds the lease row past its expiry, or while a
// lease that an acquire of unknown outcome took is live, which the history
// cannot show; a set is refused when any of its names is held.
//
// What the model does not check: the renewals of a keep-alive, which the
// history lacks (a lease under -keepalive has no upper bound on its
// expiry, so writes after Check are held only to the lease not being taken
// over or released); how long a refused acquire waited; a set's atomicity
// (each name is checked alone); with fenced writes, a stale holder's write
// that lands before the next holder's first write, which fencing allows.
package main
