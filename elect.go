package sqllock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/sqllock/sqllock/internal/fault"
	"github.com/sqllock/sqllock/observe"
)

// maxCampaignPoll caps how long a candidate in [Client.Elect] waits between
// attempts, so that a leader's release is noticed soon even with long leases.
const maxCampaignPoll = 2 * time.Second

// Callbacks are what [Client.Elect] calls as the lead changes, one at a
// time on Elect's goroutine (docs/usage.md#leader-election-elect).
type Callbacks struct {
	// OnStartedLeading, required, runs with the lead's Lock when this Client
	// takes the lead; its context ends when the lead does (with cause
	// [ErrLockLost] when the lease is lost). An error ends the lead, and
	// Elect returns it; returning nil does not.
	OnStartedLeading func(ctx context.Context, l *Lock) error
	// OnStoppedLeading runs after a lead ended and its lease was released.
	OnStoppedLeading func()
	// OnNewLeader runs with the holder description ([WithHolder]) of each
	// new leader this Client sees, its own included. A lock-delay left by
	// [Client.ForceRelease] is no leader: it is logged ("no leader:
	// lock-delay for N s after a forced release of X"), and whoever leads
	// after it is new, even the holder it evicted.
	OnNewLeader func(holder string)
}

// Elect campaigns for the lead on name, with leases of ttl, until ctx ends.
// While it leads it runs cb.OnStartedLeading under a keep-alive; a leader
// whose renewals keep failing is told to stop before its lease can expire,
// and another takes over within about one ttl. When the lead ends, Elect
// releases the lease, calls OnStoppedLeading and campaigns again. It returns
// after releasing any lead: when ctx ends, an error wrapping ctx's and the
// last error that kept it from leading; before, only OnStartedLeading's error
// or one that campaigning cannot get past (bad input, a missing table, a
// refused login, a closed Client).
func (c *Client) Elect(ctx context.Context, name string, ttl time.Duration, cb Callbacks) error {
	if cb.OnStartedLeading == nil {
		return errorf("Callbacks.OnStartedLeading is nil")
	}
	if err := checkName(name); err != nil {
		return err
	}
	if err := checkTTL(ttl); err != nil {
		return err
	}
	var leader string
	observe := func(info Info) {
		holder := info.Holder
		if holder == "" || holder == leader {
			return
		}
		leader = holder
		if evicted, ok := strings.CutPrefix(holder, lockDelayHolder); ok {
			// A lock-delay holds the name, not a candidate: no leader
			// until it ends, and whoever leads next is new, even the
			// evicted one.
			secs := (info.TTL + time.Second - 1) / time.Second
			msg := fmt.Sprintf("no leader: lock-delay for %d s after a forced release of %s", secs, evicted)
			c.log.Info("sqllock: "+msg, "name", name, "evicted", evicted, "lock_delay", info.TTL)
			// The Observer sees it as the campaign's acquire refused by
			// the lock-delay's statement (a metric's statement="lock_delay",
			// outcome="held").
			if c.obs.Retried != nil {
				observed(&c.reporter, c.obs.Retried, observe.RetryEvent{Statement: "lock_delay", Name: name, Outcome: observe.OutcomeHeld,
					Err: errorf("%s: %w", msg, ErrNotAcquired)})
			}
			return
		}
		c.log.Info("sqllock: new leader", "name", name, "holder", holder)
		if cb.OnNewLeader != nil {
			cb.OnNewLeader(holder)
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
		observe(Info{Holder: c.holder})
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
func (c *Client) campaign(ctx context.Context, name string, ttl time.Duration, observe func(Info), lastErr *error) (l *Lock, err error) {
	poll := min(max(ttl/4, minBackoff), maxCampaignPoll)
	// One call serves every attempt, as in Acquire: it owns the token and
	// what an attempt whose outcome stayed unknown leaves (acquire.go).
	a, err := c.newAcquireCall(name, ttl)
	if err != nil {
		return nil, err
	}
	for {
		l, err = a.try(ctx) // observed as a TryAcquire is
		// Read once, as the attempt read it: a deadline that passed during
		// the attempt is no other owner's lease.
		cerr := ctxErr(ctx)
		switch {
		case err == nil:
			return l, nil
		case cerr != nil:
			if passable(err) && !errors.Is(err, cerr) {
				// Refused, and ctx ended just after: Elect's error says
				// the context ended, and why this candidate did not lead.
				*lastErr = err
			}
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
			observe(info)
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
