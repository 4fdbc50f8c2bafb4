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
// of client-go's leader election. They run on Elect's goroutine, one at a
// time, so a slow callback delays the campaign.
type Callbacks struct {
	// OnStartedLeading runs when this Client takes the lead, with the
	// lead's Lock, for its [Lock.Fence]. Its context ends when the lead
	// ends: when the lease is lost (the cause wraps [ErrLockLost]) or
	// Elect's context ends. It may block until then or return nil at once;
	// either way the lead lasts until its context ends. An error returned
	// before then ends the lead, and Elect returns it once the lease is
	// released. Required.
	OnStartedLeading func(ctx context.Context, l *Lock) error
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
// Elect returns an error wrapping ctx's once ctx has ended and a lead, if
// any, has been released; when an error kept this candidate from leading
// since its last lead (the server was away, read-only during a failover),
// the error wraps the last one too. It returns earlier only for an error
// that campaigning cannot get past: bad input, a missing table or column, a
// refused login, a closed Client. Network and server errors that may pass
// (a broken connection, no server, a read-only server, too many
// connections) are retried.
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
