package sqllock

import (
	"log/slog"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/sqllock/sqllock/internal/fault"
	"github.com/sqllock/sqllock/observe"
)

// An Option configures a Client in [New].
type Option func(*Client) error

// WithTable makes the Client use table name instead of [DefaultTable]. The
// name must match ^[A-Za-z0-9_]{1,64}$; it is quoted, never interpolated raw.
func WithTable(name string) Option {
	return func(c *Client) error {
		q, err := quoteTable(name)
		if err != nil {
			return err
		}
		c.table = q
		return nil
	}
}

// WithHolder sets the description stored with each lease this Client takes,
// for people reading the table; the default is "hostname:pid". It may not
// begin "lock-delay after a forced release of ", as a lock-delay's does
// ([Info]).
func WithHolder(desc string) Option {
	return func(c *Client) error {
		if desc == "" {
			return errorf("empty holder description")
		}
		if len(desc) > maxHolderLen {
			return errorf("holder description is %d bytes, longer than the %d the table holds", len(desc), maxHolderLen)
		}
		if strings.HasPrefix(desc, lockDelayHolder) {
			return errorf("holder description %q begins as a lock-delay's, which Elect and the sqllock command would take for one", desc)
		}
		c.holder = desc
		return nil
	}
}

// WithRetry sets how [Client.Acquire] waits between attempts. The default is
// ExponentialBackoff(8*time.Millisecond, 256*time.Millisecond).
func WithRetry(s RetryStrategy) Option {
	return func(c *Client) error {
		if s == nil {
			return errorf("nil RetryStrategy")
		}
		c.retry = s
		return nil
	}
}

// WithLockDelay sets how long [Client.ForceRelease] keeps a live lease's
// name from everyone: 0 frees it at once, d > 0 exactly d. The default lasts
// until the evicted holder's keep-alive has seen the loss and its work has
// stopped (docs/operations.md). d must be between 0 and [MaxTTL].
func WithLockDelay(d time.Duration) Option {
	return func(c *Client) error {
		if d < 0 || d > MaxTTL {
			return errorf("lock-delay %v: must be between 0 and %v", d, MaxTTL)
		}
		c.lockDelay = d
		return nil
	}
}

// WithLogger makes the Client report to l what a service could not see
// otherwise: retries, failed renewals, lost leases, changes of lead and
// Close's releases (docs/operations.md#logging), each with the lock's name
// under "name". The default, and a nil l, log nothing.
func WithLogger(l *slog.Logger) Option {
	return func(c *Client) error {
		if l == nil {
			l = discardLogger
		}
		c.log = l
		return nil
	}
}

// WithObserver makes the Client report its events to o (see [observe.Observer]).
// The default reports nothing.
func WithObserver(o observe.Observer) Option {
	return func(c *Client) error {
		c.obs = o
		return nil
	}
}

// WithWakeups sets how many wake-up channels the Client holds at once; the
// default is 4, and 0 turns them off. With them, a process waiting in an
// Acquire for what another process holds blocks on a server named lock
// (GET_LOCK) instead of polling, and a release wakes the process that waited
// longest. Each channel holds a pool connection while the Client waits and,
// after waiting, until the Lock's Release
// (docs/usage.md#handing-a-name-to-a-waiting-process).
func WithWakeups(n int) Option {
	return func(c *Client) error {
		if n < 0 {
			return errorf("WithWakeups(%d): the number of wake-up channels cannot be negative", n)
		}
		c.wakeups = n
		return nil
	}
}

// A DoOption changes how [Client.Do] and [Lock.Do] hold the lease.
type DoOption func(*doConfig) error

type doConfig struct {
	minHold   time.Duration
	margin    time.Duration
	marginSet bool
}

// WithMinHold keeps the lease after fn returns until d after it was acquired
// (ShedLock's lockAtLeastFor), so that a host whose trigger fires late does
// not run the job again: the release then sets the expiry instead of deleting
// the lease. d may exceed the ttl; it must be between 0 and [MaxTTL].
func WithMinHold(d time.Duration) DoOption {
	return func(c *doConfig) error {
		if d < 0 || d > MaxTTL {
			return errorf("minimum hold %v is outside [0, %v]", d, MaxTTL)
		}
		c.minHold = d
		return nil
	}
}

// WithSafetyMargin sets how long before the lease could expire fn's context is
// cancelled when renewals keep failing ([Lock.KeepAlive]): the time fn needs
// to stop, plus how far the client's clock may run slow of the server's over
// one ttl. The default is min(ttl/10, 5s); d must be at least 0 and below the
// ttl.
func WithSafetyMargin(d time.Duration) DoOption {
	return func(c *doConfig) error {
		if d < 0 {
			return errorf("safety margin %v is negative", d)
		}
		c.margin, c.marginSet = d, true
		return nil
	}
}

// A RetryStrategy tells [Client.Acquire] how long to wait between attempts.
// It serves every Acquire of a Client at once, so it keeps no state.
type RetryStrategy interface {
	// Backoff returns how long to wait after the attempt-th failed attempt
	// (the first is 1) and false when Acquire should give up instead.
	Backoff(attempt int) (wait time.Duration, ok bool)
}

// Defaults of the strategy a Client uses unless [WithRetry] says otherwise:
// exponential backoff from defaultRetryMin up to defaultRetryMax, with
// jitter. A waiting process (all its Acquire calls for one name share one
// poller) polls at most 1/(defaultRetryMax/2) times a second once the
// backoff has grown, about 5 times a second, and learns of a release in
// another process within defaultRetryMax plus a round trip; a release in
// the same Client wakes it at once. Faster schedules cut that latency for
// more load: see docs/performance.md for measured figures.
const (
	defaultRetryMin = 8 * time.Millisecond
	defaultRetryMax = 256 * time.Millisecond
)

// minBackoff is the least any strategy waits, so that a strategy built with
// a zero or negative duration cannot spin against the server.
const minBackoff = time.Millisecond

type retryFunc func(attempt int) (time.Duration, bool)

func (f retryFunc) Backoff(attempt int) (time.Duration, bool) { return f(attempt) }

// NoRetry gives up after the first failed attempt, like [Client.TryAcquire].
func NoRetry() RetryStrategy {
	return retryFunc(func(int) (time.Duration, bool) { return 0, false })
}

// LinearBackoff waits d between attempts, until the context ends.
func LinearBackoff(d time.Duration) RetryStrategy {
	d = max(d, minBackoff)
	return retryFunc(func(int) (time.Duration, bool) { return d, true })
}

// ExponentialBackoff waits about first, doubling the wait after each further
// failed attempt up to limit; each wait is drawn from its upper half.
func ExponentialBackoff(first, limit time.Duration) RetryStrategy {
	first = max(first, minBackoff)
	limit = max(limit, first)
	return retryFunc(func(attempt int) (time.Duration, bool) {
		d := first
		for i := 1; i < attempt && d < limit; i++ {
			if d > limit/2 {
				d = limit // doubling would pass the limit, or overflow
				break
			}
			d *= 2
		}
		half := d / 2
		return half + rand.N(d-half+1), true
	})
}

// LimitRetry makes at most n attempts in all, waiting between them as s
// says. LimitRetry(s, 1) is NoRetry.
func LimitRetry(s RetryStrategy, n int) RetryStrategy {
	return retryFunc(func(attempt int) (time.Duration, bool) {
		if attempt >= n {
			return 0, false
		}
		return s.Backoff(attempt)
	})
}

// withRetryBudget sets how long the Client's statements are sent again
// while the server rolls them back, and the pause between sends, in place
// of the library's (fault.MaxRetryBudget, fault.Backoff): for tests that
// only wait on them.
func withRetryBudget(b fault.Budget) Option {
	return func(c *Client) error {
		c.budget = b
		return nil
	}
}
