// Package observe holds the events a sqllock Client reports to an
// Observer, for metrics and traces, as net/http/httptrace holds an HTTP
// client's. Set one with sqllock.WithObserver; the sqllock/otel module
// implements one with OpenTelemetry. The package imports only the standard
// library.
package observe

import (
	"context"
	"time"
)

// An Observer is told what a Client does, for metrics and traces: each
// field is an optional func, called when its event happens; a nil field
// costs a nil check. Set it with sqllock.WithObserver. The sqllock/otel module
// implements one with OpenTelemetry.
//
// It is a struct of funcs, as net/http/httptrace's ClientTrace is, rather
// than an interface: a caller sets only the events it wants, an event left
// nil costs nothing (not even building its event value), and new events
// are new fields, which break no caller. Each event is a struct passed by
// value, so it too can grow fields.
//
// The funcs are called synchronously, on the goroutine doing the work,
// often between two steps of it: they must be fast, must not block, and
// must not call the Client or its Locks. They may be called concurrently.
// A panic in one is recovered and logged at Error by the Client's logger
// (see sqllock.WithLogger); the operation goes on as if the func had returned,
// so an observer's bug never leaves a lease half acquired or released.
type Observer struct {
	// AcquireDone is called when an acquire call of any kind returns
	// (TryAcquire, Acquire, their Set and Semaphore forms, the acquire of
	// Do and its kin, and Once's), unless it refused its arguments, and
	// for each attempt of Elect's campaign, as for a TryAcquire: a
	// candidate while another leads is told Held at each attempt. A set's
	// event is named by the set's label, a semaphore's by its name.
	AcquireDone func(AcquireEvent)
	// HoldStart is called when a lease is taken, by any call (also
	// Elect's and Once's), before the call returns the Lock.
	HoldStart func(HoldEvent)
	// HoldEnd is called once per lease HoldStart reported, when the
	// Client learns the lease is over (see [HoldEnd] for when).
	HoldEnd func(HoldEvent)
	// Refreshed is called when a refresh (a Lock.Refresh, or a
	// keep-alive's renewal) has its answer.
	Refreshed func(RefreshEvent)
	// Released is called when a release statement has its answer,
	// whatever it was.
	Released func(ReleaseEvent)
	// Retried is called for each send of a statement that failed in a way
	// the Client retries (the server rolled it back, or the connection
	// broke), whether or not the statement's time or attempts let it be
	// sent again. It is also called, with Statement "frozen_holder", when
	// an acquire met a holder's transaction that kept the lease row locked
	// after the lease ended (a process stopped inside Lock.Check): with
	// OutcomeRolledBack when the Client ended that transaction, with
	// OutcomeRefused when it could not (see docs/guarantees.md).
	Retried func(RetryEvent)
	// Unknown is called when an acquire's outcome stays unknown and its
	// token is remembered, and when a DELETE settles such a token (see
	// sqllock.Client.TryAcquire).
	Unknown func(UnknownEvent)
	// Wakeup is called when a waiting Acquire's wait on a wake-up
	// channel ends, and when the Client turns its channels off (see
	// sqllock.WithWakeups).
	Wakeup func(WakeupEvent)
}

// An Outcome says how an acquire call ended, or how a statement failed.
type Outcome int

// Outcomes. An error outcome comes from what the error says about the
// statement (see sqllock.Client.TryAcquire's retries).
const (
	OutcomeAcquired   Outcome = iota // the lease was taken
	OutcomeHeld                      // another owner's lease was live (also when the caller's context ended while the call waited for it)
	OutcomeCanceled                  // the caller's context ended before an answer
	OutcomeClosed                    // the Client was closed
	OutcomeRolledBack                // the server rolled the statement back (a deadlock, a cluster conflict)
	OutcomeBroken                    // the connection broke; the statement may have run
	OutcomeRefused                   // the server refused to run it now (read-only, too many connections, down)
	OutcomeFailed                    // any other error: a missing table, a refused login
)

var outcomeStrings = [...]string{"acquired", "held", "canceled", "closed", "rolled_back", "broken", "refused", "failed"}

// String returns the outcome's name in snake case, as metrics label it:
// "acquired", "held", "canceled", "closed", "rolled_back", "broken",
// "refused", "failed".
func (o Outcome) String() string {
	if o < 0 || int(o) >= len(outcomeStrings) {
		return "unknown"
	}
	return outcomeStrings[o]
}

// An AcquireEvent is one acquire call that returned.
type AcquireEvent struct {
	Ctx     context.Context // the call's
	Name    string
	Outcome Outcome
	Start   time.Time     // when the call began
	Wait    time.Duration // from Start to its return: the time waited
	// Attempts counts the acquire statements the call sent, not counting
	// sends of one attempt again (see Retried), nor the one-statement
	// looks of a waiting Acquire, which queued calls share.
	Attempts int
	Fence    uint64 // of the lease taken; 0 if none
	Err      error  // the call's error; nil when acquired
}

// HoldEnd says how a lease ended.
type HoldEnd int

// The ends of a lease.
const (
	HoldHeld     HoldEnd = iota // not ended: a HoldStart
	HoldReleased                // a Release, or the end of a Do, freed the name
	HoldLost                    // the keep-alive gave it up, or a Refresh or Release found it taken over
	HoldLapsed                  // it passed its ValidUntil without a renewal, and nobody took the name
	HoldClosed                  // Client.Close released it
)

var holdEndNames = [...]string{"held", "released", "lost", "lapsed", "closed"}

// String returns the end's name: "held", "released", "lost", "lapsed",
// "closed".
func (e HoldEnd) String() string {
	if e < 0 || int(e) >= len(holdEndNames) {
		return "unknown"
	}
	return holdEndNames[e]
}

// A HoldEvent is the start or the end of a lease. A lease left to lapse,
// with no Release and no keep-alive, ends when the Client learns of it: at
// a later Release of its Lock (lapsed, or lost if another owner took the
// name), a Refresh (lost), Close (closed), or when the Client's registry
// of Locks grows and sweeps it out (lapsed).
type HoldEvent struct {
	Name  string
	Fence uint64
	TTL   time.Duration // of the acquire
	End   HoldEnd       // HoldHeld in HoldStart
	Held  time.Duration // in HoldEnd: since HoldStart
	Err   error         // in HoldEnd: what ended it, if an error did
}

// A RefreshEvent is one refresh's answer.
type RefreshEvent struct {
	Name string
	// Left is how long the lease had left, at the earliest, when the
	// refresh was sent: ValidUntil minus the send time, negative when it
	// could have expired already. A keep-alive renews at about 2/3 of
	// the ttl left; a Left near zero means renewals run late.
	Left time.Duration
	// TTL is the lease length the refresh asked for: the ttl a keep-alive
	// renews for, so that Left/TTL near 2/3 is on time and near 0 is late.
	TTL  time.Duration
	Took time.Duration // from the send to the answer
	// Shared is how many leases the statement renewed, when it was the
	// Client's shared renewal, which renews the leases its keep-alives
	// hold for one ttl together; 0 when the lease was refreshed on its own.
	Shared  int
	Outcome Outcome // OutcomeAcquired: renewed; OutcomeHeld: the lease was lost
	Err     error
}

// A ReleaseEvent is one release statement's answer.
type ReleaseEvent struct {
	Name string
	Took time.Duration
	Err  error // nil: the name was freed
}

// A RetryEvent is a statement that failed and may be sent again.
type RetryEvent struct {
	Statement string // its name in queries.sql: "acquire", "refresh", ...; "frozen_holder"; or "lock_delay" (Outcome held), a lock-delay an Elect candidate found holding the name
	Name      string // the lock name
	Outcome   Outcome
	Err       error
}

// An UnknownEvent is an acquire whose outcome stayed unknown: its token
// was remembered (Settled false), or a DELETE settled it (Settled true).
type UnknownEvent struct {
	Name    string
	Settled bool
}

// A WakeupState says how a wait on a wake-up channel ended.
type WakeupState int

// The ends of a wait on a wake-up channel.
const (
	WakeupGranted  WakeupState = iota // the holder let go of the name: the waiter tries now
	WakeupTimedOut                    // the wait's bound passed: the waiter polls once
	WakeupFailed                      // no channel this time (pool full, a broken connection): the waiter polls
	WakeupOff                         // the Client turned its channels off for good (the server refuses GET_LOCK, or cuts every wait)
)

var wakeupNames = [...]string{"granted", "timed_out", "failed", "off"}

// String returns the state's name: "granted", "timed_out", "failed",
// "off".
func (s WakeupState) String() string {
	if s < 0 || int(s) >= len(wakeupNames) {
		return "unknown"
	}
	return wakeupNames[s]
}

// A WakeupEvent is a wait on a wake-up channel that ended.
type WakeupEvent struct {
	Name  string // empty for WakeupOff
	State WakeupState
	Wait  time.Duration
}
