package sqllock

import (
	"log/slog"
	"strings"
	"time"

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
