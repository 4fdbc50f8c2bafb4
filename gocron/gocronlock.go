// Package gocronlock lets gocron v2 schedulers on several hosts share jobs
// through sqllock: [NewLocker] gives a gocron.Locker that runs each run of a
// job on one scheduler, and [NewElector] a gocron.Elector that runs every job
// on the one scheduler that leads.
//
//	locks, _ := sqllock.New(db)
//	locker, err := gocronlock.NewLocker(ctx, locks) // fails if the table is missing
//	s, _ := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
//
// A job made with [Locker.Task] or [Elector.Task] gets the Lock it runs
// under, to pass its fence to what it writes, so that a scheduler that
// stalls past its lease is refused (docs/guarantees.md), and a context
// that ends when that lease is lost:
//
//	task := locker.Task(func(ctx context.Context, l *sqllock.Lock) error {
//		return store.Write(ctx, l.Fence(), report) // refused once a later holder wrote
//	})
//	s.NewJob(gocron.DurationJob(time.Minute), gocron.NewTask(task), gocron.WithName("report"))
//
// gocron has no way to hand a job a value from its Locker: it passes the
// Locker the job's context, which the task gets too, and a Locker's Task
// finds the run by it. An Elector's Task takes the lead this scheduler holds
// when the run starts.
//
// gocron does not report what a Locker's Lock and Unlock return, so the
// Locker and the Elector log what goes wrong (see [WithLogger]).
//
// It is a module of its own, so that the sqllock library does not depend on
// gocron.
package gocronlock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/sqllock/sqllock"
)

// Defaults of a Locker.
const (
	// DefaultTTL is the lease a run holds, renewed every third of it while
	// the job runs.
	DefaultTTL = 30 * time.Second
	// DefaultMinHold is how long after a run began the job's name stays
	// taken, however fast the job: longer than the splay between the
	// schedulers' clocks and ticks. A job whose interval is shorter still
	// runs every time (see [WithMinHold]).
	DefaultMinHold = 5 * time.Second
	// DefaultLockTimeout bounds each Lock: gocron's context for it ends only
	// when the scheduler shuts down.
	DefaultLockTimeout = 5 * time.Second
	// DefaultPrefix starts every lock name, so that gocron's job names do
	// not meet other names in the table.
	DefaultPrefix = "gocron:"
)

// ErrNotLeader is what an Elector's IsLeader returns while this scheduler
// does not lead: gocron then does not run the job here.
var ErrNotLeader = errors.New("gocronlock: not the leader")

// An Option configures a Locker or an Elector.
type Option func(*config) error

type config struct {
	ttl         time.Duration
	minHold     time.Duration
	perJob      map[string]time.Duration
	lockTimeout time.Duration
	prefix      string
	log         *slog.Logger
}

// WithTTL sets the lease length (default [DefaultTTL]). A scheduler that
// dies keeps a job, or the lead, for at most this long.
func WithTTL(d time.Duration) Option {
	return func(c *config) error {
		if d < time.Second {
			return fmt.Errorf("gocronlock: ttl %v is below 1s", d)
		}
		c.ttl = d
		return nil
	}
}

// firstLease is the lease a run of a job with minimum hold minHold takes
// first: the hold, but a second at least (the shortest ttl WithTTL takes)
// and the ttl at most; the ttl when there is no hold.
func (c *config) firstLease(minHold time.Duration) time.Duration {
	if minHold <= 0 {
		return c.ttl
	}
	return min(c.ttl, max(minHold, time.Second))
}

// WithMinHold sets how long after a run began its job's name stays taken
// (default [DefaultMinHold]), so that a scheduler whose tick for the same
// run comes a little later does not run it again (ShedLock's
// lockAtLeastFor; gocron unlocks as soon as the job returns, gocron issue
// 841). It must be longer than the splay between the schedulers' ticks.
//
// It may be longer than the job's interval. The Locker keeps the lease
// through the hold, and when its own scheduler's next run of the job comes
// while the hold lasts, that run takes the lease over, with a hold of its
// own: the job then runs every time, on this scheduler, while the others
// find the name taken. Should this scheduler stop or die, another takes the
// job over once the hold (or, mid-run, the ttl) has passed. A run that ends
// after the first third of the hold keeps the name until its last
// renewal's ttl ends: the Locker never shortens a lease (see [Locker]).
func WithMinHold(d time.Duration) Option {
	return func(c *config) error {
		if d < 0 {
			return fmt.Errorf("gocronlock: minimum hold %v is negative", d)
		}
		c.minHold = d
		return nil
	}
}

// WithJobMinHold sets the minimum hold of the job named job alone, for a
// job whose runs need a hold longer or shorter than the others'.
func WithJobMinHold(job string, d time.Duration) Option {
	return func(c *config) error {
		if d < 0 {
			return fmt.Errorf("gocronlock: minimum hold %v of %q is negative", d, job)
		}
		if c.perJob == nil {
			c.perJob = make(map[string]time.Duration)
		}
		c.perJob[job] = d
		return nil
	}
}

// WithLockTimeout bounds each [Locker.Lock] (default [DefaultLockTimeout]):
// a server that does not answer by then costs the run, not the job. gocron
// schedules a job's next run only once Lock has returned, and its context
// for Lock has no deadline.
func WithLockTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("gocronlock: lock timeout %v is not positive", d)
		}
		c.lockTimeout = d
		return nil
	}
}

// WithPrefix sets what starts every lock name (default [DefaultPrefix]).
func WithPrefix(p string) Option {
	return func(c *config) error {
		c.prefix = p
		return nil
	}
}

// WithLogger sets where a Locker or an Elector reports what gocron would
// not show: a Lock that failed other than because another scheduler has the
// run (Error; gocron skips the run), a lease lost while the job ran
// (Error), a release that failed (Warn), a campaign that ended for good
// (Error). The default is [slog.Default]; a nil l logs nothing. The
// Client's own logger ([sqllock.WithLogger]) is separate.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			l = slog.New(slog.DiscardHandler)
		}
		c.log = l
		return nil
	}
}

func newConfig(opts []Option) (*config, error) {
	c := &config{ttl: DefaultTTL, minHold: DefaultMinHold, lockTimeout: DefaultLockTimeout,
		prefix: DefaultPrefix, log: slog.Default()}
	for _, opt := range opts {
		if err := opt(c); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// checkTable makes c's first-use check, which fails when its table is
// missing or differs from schema.sql, by reading the lease on name.
func checkTable(ctx context.Context, c *sqllock.Client, name string) error {
	if _, err := c.Inspect(ctx, name); err != nil {
		return fmt.Errorf("gocronlock: %w", err)
	}
	return nil
}
