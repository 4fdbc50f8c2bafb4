package sqllock

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/sqllock/sqllock/internal/fault"
)

// maxCampaignPoll caps how long a candidate in [Client.Elect] waits between
// attempts, so that a leader's release is noticed soon even with long leases.
const maxCampaignPoll = 2 * time.Second

// Callbacks are what [Client.Elect] calls as the lead changes, in the style
// of client-go's leader election, one at a time on Elect's goroutine.
type Callbacks struct {
	// OnStartedLeading runs with the lead's Lock when this Client takes the
	// lead. Its context ends when the lead does: the lease is lost (the cause
	// wraps [ErrLockLost]) or Elect's ctx ends. Returning nil does not end the
	// lead; an error does, and Elect returns it once the lease is released.
	// Required.
	OnStartedLeading func(ctx context.Context, l *Lock) error
	// OnStoppedLeading runs after a lead ended and its lease was released.
	// Optional.
	OnStoppedLeading func()
	// OnNewLeader runs with the holder description ([WithHolder]) of each new
	// leader this Client sees, its own included. Optional.
	OnNewLeader func(holder string)
}

// Elect campaigns for the lead on name, with leases of ttl, until ctx ends.
// It runs cb.OnStartedLeading under a keep-alive ([Lock.KeepAlive]) while it
// leads; when the lead ends it releases the lease, calls OnStoppedLeading and
// campaigns again. A leader whose renewals keep failing is told to stop
// before its lease can expire, and another candidate takes over within about
// one ttl (see docs/usage.md#leader-election-elect).
//
// When ctx ends, Elect releases any lead and returns an error wrapping ctx's
// and the last error that kept it from leading, if any. It returns earlier
// only with OnStartedLeading's error or one campaigning cannot get past (bad
// input, a missing table, a refused login, a closed Client); errors that may
// pass (a broken connection, a read-only server) are retried.
func (c *Client) Elect(ctx context.Context, name string, ttl time.Duration, cb Callbacks) error {
	if cb.OnStartedLeading == nil {
		return errors.New("sqllock: Callbacks.OnStartedLeading is nil")
	}
	if err := checkName(name); err != nil {
		return err
	}
	if err := checkTTL(ttl); err != nil {
		return err
	}
	var leader string
	observe := func(holder string) {
		if holder != "" && holder != leader {
			leader = holder
			c.log.Info("sqllock: new leader", "name", name, "holder", holder)
			if cb.OnNewLeader != nil {
				cb.OnNewLeader(holder)
			}
		}
	}
	// lastErr is the last error met since the last lead began: what kept
	// this candidate from leading, or ended its lead.
	var lastErr error
	// ended is Elect's error once ctx has ended, with err, the error that
	// ended the campaign, if any. The context is read with ctxErr: a
	// deadline that has passed may not yet show in ctx.Err().
	ended := func(err error) error {
		cerr := ctxErr(ctx)
		switch {
		case lastErr != nil:
			return errorf("elect %q: %w (last error: %w)", name, cerr, lastErr)
		case err != nil && err != cerr && !errors.Is(err, ErrClosed):
			return errorf("elect %q: %w", name, err) // an attempt cut by ctx; it wraps cerr
		}
		return cerr
	}
	for {
		l, err := c.campaign(ctx, name, ttl, observe, &lastErr)
		if err != nil {
			if ctxErr(ctx) != nil {
				return ended(err)
			}
			return err
		}
		lastErr = nil
		observe(c.holder)
		c.log.Info("sqllock: took the lead", "name", name, "fence", l.fence)
		// A failed release only leaves the lease to expire; err is logged,
		// and kept to say why the lead ended.
		var failed bool
		err = l.run(ctx, doConfig{margin: defaultSafetyMargin(ttl)}, func(lctx context.Context, l *Lock) error {
			if err := cb.OnStartedLeading(lctx, l); err != nil && lctx.Err() == nil {
				failed = true
				return err
			}
			<-lctx.Done()
			return nil
		})
		c.log.Info("sqllock: stepped down", "name", name, "fence", l.fence, "err", err)
		lastErr = err
		if cb.OnStoppedLeading != nil {
			cb.OnStoppedLeading()
		}
		if failed {
			return errorf("elect %q: leading: %w", name, err)
		}
		if ctx.Err() != nil {
			return ended(nil)
		}
	}
}

// campaign tries to take the lease on name until it does, ctx ends or an
// error comes that trying again cannot mend. It keeps in *lastErr the last
// error that may pass, and clears it when an answer comes.
func (c *Client) campaign(ctx context.Context, name string, ttl time.Duration, observe func(holder string), lastErr *error) (l *Lock, err error) {
	poll := min(max(ttl/4, minBackoff), maxCampaignPoll)
	// One call serves every attempt, as in Acquire: it owns the token and
	// what an attempt whose outcome stayed unknown leaves (acquire.go).
	a, err := c.newAcquireCall(name, ttl)
	if err != nil {
		return nil, err
	}
	for {
		l, err = a.attempt(ctx)
		// Read once, as the attempt read it: a deadline that passed during
		// the attempt is no other owner's lease.
		cerr := ctxErr(ctx)
		switch {
		case err == nil:
			return l, nil
		case cerr != nil:
			return nil, err
		case errors.Is(err, ErrNotAcquired):
			*lastErr = nil
		case passable(err):
			*lastErr = err
			c.log.Warn("sqllock: campaign attempt failed; trying again", "name", name, "err", err)
		default:
			return nil, err
		}
		wait := poll
		if info, err := c.Inspect(ctx, name); err == nil && info.Held {
			observe(info.Holder)
			// Just after the leader's lease could lapse, if that is sooner.
			wait = min(wait, info.TTL+time.Millisecond)
		}
		// Jitter, so that candidates that failed together do not collide.
		wait = wait/2 + rand.N(wait/2+1)
		if err := fault.Sleep(ctx, wait); err != nil {
			return nil, err
		}
	}
}
