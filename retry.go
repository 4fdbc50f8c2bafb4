package sqllock

import (
	"math/rand/v2"
	"time"

	"github.com/sqllock/sqllock/internal/fault"
)

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
