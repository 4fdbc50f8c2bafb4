package sqllock

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"
)

// maxCampaignPoll caps how long a candidate in [Client.Elect] waits between
// attempts, so that a leader's release is noticed soon even with long leases.
const maxCampaignPoll = 2 * time.Second

// Callbacks are what [Client.Elect] calls as the lead changes, in the style
// of client-go's leader election. They run on Elect's goroutine, one at a
// time, so a slow callback delays the campaign.
type Callbacks struct {
	// OnStartedLeading runs when this Client takes the lead. Its context
	// ends when the lead ends: when the lease is lost (the cause wraps
	// [ErrLockLost]) or Elect's context ends. It may block until then or
	// return at once; either way the lead lasts until its context ends.
	// Required.
	OnStartedLeading func(ctx context.Context)
	// OnStoppedLeading runs after a lead has ended and its lease was
	// released, and only after a lead. Optional.
	OnStoppedLeading func()
	// OnNewLeader runs when the leader this Client observes changes, with
	// the leader's holder description (see [WithHolder]); this Client's own
	// when it takes the lead. Candidates sharing a description look like one.
	// Optional.
	OnNewLeader func(holder string)
}

// Elect campaigns for the lead on name until ctx ends. A candidate tries to
// take the lease on name for ttl; while another holds it, the candidate
// reads who (for OnNewLeader) and tries again when that lease could expire,
// or after ttl/4 (at most 2s) to notice a release. On taking the lease it
// runs OnStartedLeading under a keep-alive (see [Lock.KeepAlive], with the
// default safety margin). When the lead ends, it releases the lease, calls
// OnStoppedLeading and, unless ctx has ended, campaigns again: a leader whose
// renewals keep failing is told to stop before its lease can expire, and the
// other candidates take over within about one ttl.
//
// Elect returns ctx's error once ctx has ended and a lead, if any, has been
// released. It returns earlier only for an error that campaigning cannot
// get past: bad input, a missing table, a closed Client. Network and server
// errors that may pass are retried.
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
	for {
		l, err := c.campaign(ctx, name, ttl, observe)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		observe(c.holder)
		c.log.Info("sqllock: took the lead", "name", name, "fence", l.fence)
		// A failed release only leaves the lease to expire; err is logged.
		err = l.run(ctx, doConfig{margin: defaultSafetyMargin(ttl)}, func(lctx context.Context) error {
			cb.OnStartedLeading(lctx)
			<-lctx.Done()
			return nil
		})
		c.log.Info("sqllock: stepped down", "name", name, "fence", l.fence, "err", err)
		if cb.OnStoppedLeading != nil {
			cb.OnStoppedLeading()
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// campaign tries to take the lease on name until it does, ctx ends or an
// error comes that trying again cannot mend.
func (c *Client) campaign(ctx context.Context, name string, ttl time.Duration, observe func(holder string)) (*Lock, error) {
	poll := min(max(ttl/4, minBackoff), maxCampaignPoll)
	for {
		l, err := c.TryAcquire(ctx, name, ttl)
		switch {
		case err == nil:
			return l, nil
		case ctx.Err() != nil:
			return nil, err
		case errors.Is(err, ErrNotAcquired):
		case classify(err) != failedFinal:
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
		if err := sleepCtx(ctx, wait); err != nil {
			return nil, err
		}
	}
}
