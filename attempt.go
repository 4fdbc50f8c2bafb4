package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/sqllock/sqllock/observe"
)

// One attempt of every kind of lease (a name, a set, a slot of a
// semaphore) runs here, in run: the checks before anything is sent, the
// claim of the leases earlier acquires may have left, the statement, sent
// again with the same token while its connection breaks (fault.Send), the
// cleanup of an outcome left unknown (acquireCall's rules, acquire.go), what
// a failure means, and the Lock's start, including a Close that raced it.
// What a kind differs in is its leaseKind: its statement and how its answer
// is read, in acquire.go (a name), acquire_set.go (a set) and semaphore.go (a
// slot).

// A leaseKind is one kind's part of an attempt, for one acquireCall.
type leaseKind interface {
	// op begins the attempt's errors: `acquire "x"`.
	Op() string
	// ready makes what the kind needs before its first write (the
	// Client's first use, the kind's own proof) and readies a new
	// attempt; its error is the attempt's.
	ready(ctx context.Context) error
	// claim deletes the leases earlier acquires of the kind's names may
	// have left under tokens nobody holds (held.go).
	claim(ctx context.Context)
	// send sends the kind's statement once, as fault.Send does: unknown of
	// its sends had an unknown outcome.
	send(ctx context.Context) (res sql.Result, unknown int, err error)
	// heldBy returns the refusal err means for the kind (its rows stayed
	// locked by another transaction, say), or nil.
	heldBy(ctx context.Context, err error) error
	// read reads the answer of a statement first sent at sent and last
	// sent before last: the Lock taken, the kind's refusal, or again when
	// the kind sends another statement (a semaphore's wider visit). It
	// cleans up, or retires the token, as the answer asks.
	read(ctx context.Context, res sql.Result, sent, last time.Time, unknown int) (l *Lock, again bool, err error)
	// cleanup deletes what the attempt may have written, sends of which
	// may have committed, the last sent before last (acquireCall.cleanup).
	cleanup(ctx context.Context, last time.Time, sends int)
}

// run makes one attempt of a's call, of kind k.
func (a *acquireCall) run(ctx context.Context, k leaseKind) (*Lock, error) {
	c := a.c
	if c.isClosed() {
		return nil, ErrClosed
	}
	if a.tokenErr != nil {
		return nil, a.tokenErr
	}
	if err := k.ready(ctx); err != nil {
		return nil, err
	}
	// What the first use left to prove for want of a spare connection
	// (internal/engine/pool.go); with nothing left, this costs an atomic load.
	if err := c.eng.ProvePending(ctx); err != nil {
		return nil, errorf("%s: %w", k.Op(), err)
	}
	// Leases earlier acquires may have left under tokens nobody holds go
	// first; without any, this costs an atomic load.
	k.claim(ctx)
	for {
		sent := time.Now()
		a.attempts++
		res, unknown, err := k.send(ctx)
		last := time.Now() // no send of the statement is later
		if err != nil {
			if unknown > 0 {
				// The lease may be ours under a token nobody will ever
				// use again; give it back rather than block it for ttl.
				k.cleanup(ctx, last, unknown)
			}
			return nil, a.failed(ctx, k, err)
		}
		l, again, err := k.read(ctx, res, sent, last, unknown)
		if again {
			continue
		}
		if err != nil {
			return nil, err
		}
		if unknown > 0 {
			l.sentTwice(last) // rule 3 of acquireCall
		}
		l.holdStarted()
		if !c.held.add(l) {
			// Close is releasing this Client's leases and has missed this
			// one.
			k.cleanup(ctx, last, unknown+1)
			l.holdEnded(observe.HoldClosed, ErrClosed)
			return nil, ErrClosed
		}
		return l, nil
	}
}

// failed returns the error of an attempt of kind k whose statement failed
// with err: the kind's refusal, the context's end (which wraps
// ErrNotAcquired), or what the server's error means.
func (a *acquireCall) failed(ctx context.Context, k leaseKind, err error) error {
	if held := k.heldBy(ctx, err); held != nil {
		return held
	}
	if cerr := ctxErr(ctx); cerr != nil {
		if errors.Is(err, cerr) {
			return errorf("%s: %w: %w%s", k.Op(), ErrNotAcquired, err, a.c.poolFull())
		}
		return errorf("%s: %w: %w (last error: %w)%s", k.Op(), ErrNotAcquired, cerr, err, a.c.poolFull())
	}
	return a.c.serverError(k.Op(), err)
}
