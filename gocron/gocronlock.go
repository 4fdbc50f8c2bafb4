// Package gocronlock lets gocron v2 schedulers on several hosts share jobs
// through sqllock: [NewLocker] gives a gocron.Locker that runs each run of a
// job on one scheduler, and [NewElector] a gocron.Elector that runs every job
// on the one scheduler that leads.
//
//	locks, _ := sqllock.New(db)
//	locker, _ := gocronlock.NewLocker(locks, gocronlock.WithMinHold(5*time.Second))
//	s, _ := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
//
// It is a module of its own, so that the sqllock library does not depend on
// gocron.
package gocronlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/sqllock/sqllock"
)

// Defaults of a Locker.
const (
	// DefaultTTL is the lease a run holds, renewed every third of it while
	// the job runs.
	DefaultTTL = 30 * time.Second
	// DefaultMinHold is how long after a scheduler took a run's lease the
	// name stays taken, however fast the job: longer than the splay between
	// the schedulers' clocks and start-up, shorter than the job's interval.
	DefaultMinHold = 5 * time.Second
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
	ttl     time.Duration
	minHold time.Duration
	perJob  map[string]time.Duration
	prefix  string
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

// WithMinHold sets how long after it was taken a job's name stays taken
// (default [DefaultMinHold]), so that a scheduler whose tick comes a little
// later does not run the same run again (ShedLock's lockAtLeastFor; gocron
// releases its lock as soon as the job returns). It must be longer than the
// splay between schedulers and shorter than the job's interval.
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
// job whose interval is shorter or much longer than the others'.
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

// WithPrefix sets what starts every lock name (default [DefaultPrefix]).
func WithPrefix(p string) Option {
	return func(c *config) error {
		c.prefix = p
		return nil
	}
}

func newConfig(opts []Option) (*config, error) {
	c := &config{ttl: DefaultTTL, minHold: DefaultMinHold, prefix: DefaultPrefix}
	for _, opt := range opts {
		if err := opt(c); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// A Locker is a gocron.Locker over a sqllock Client.
type Locker struct {
	c   *sqllock.Client
	cfg *config
}

var _ gocron.Locker = (*Locker)(nil)

// NewLocker returns a Locker whose locks are leases in c's table, named
// prefix + the job's name.
func NewLocker(c *sqllock.Client, opts ...Option) (*Locker, error) {
	if c == nil {
		return nil, errors.New("gocronlock: nil *sqllock.Client")
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	return &Locker{c: c, cfg: cfg}, nil
}

// Lock takes the lease on the job's name, without waiting: when another
// scheduler holds it, it returns an error wrapping [sqllock.ErrNotAcquired]
// and gocron skips this run. A keep-alive renews the lease until Unlock,
// which keeps the name taken until the minimum hold has passed since Lock.
// gocron gives a Locker no way to stop a running job, so a lease lost while
// the job runs (its renewals failed for most of a ttl) is reported only by
// Unlock: a job that must stop when it loses its lease should run under
// [sqllock.Client.Do] itself.
func (l *Locker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	if err := ctx.Err(); err != nil {
		return nil, err // the scheduler is shutting down
	}
	minHold, ok := l.cfg.perJob[key]
	if !ok {
		minHold = l.cfg.minHold
	}
	lk := &lock{unlock: make(chan struct{}), done: make(chan error, 1)}
	acquired := make(chan struct{})
	go func() {
		// Do owns the keep-alive and the release; the run's lease lives
		// until Unlock, not until ctx ends.
		lk.done <- l.c.TryDo(context.WithoutCancel(ctx), l.cfg.prefix+key, l.cfg.ttl, func(ctx context.Context) error {
			close(acquired)
			select {
			case <-lk.unlock:
				return nil
			case <-ctx.Done():
				<-lk.unlock // lost: gocron cannot stop the job; it learns at Unlock
				return context.Cause(ctx)
			}
		}, sqllock.WithMinHold(minHold))
	}()
	select {
	case <-acquired:
		return lk, nil
	case err := <-lk.done:
		return nil, err
	}
}

// lock is one run's lease: the Do that holds it runs until unlock closes.
type lock struct {
	once   sync.Once
	unlock chan struct{}
	done   chan error
	err    error
}

// Unlock ends the run's lease (see [Locker.Lock]) and returns once it is
// released. Its error wraps [sqllock.ErrLockLost] when the lease was lost
// while the job ran.
func (lk *lock) Unlock(context.Context) error {
	lk.once.Do(func() {
		close(lk.unlock)
		lk.err = <-lk.done
	})
	return lk.err
}

// An Elector is a gocron.Elector over [sqllock.Client.Elect]: the scheduler
// whose Client leads runs the jobs.
type Elector struct {
	mu      sync.Mutex
	leading bool
	cancel  context.CancelFunc
	done    chan error
}

var _ gocron.Elector = (*Elector)(nil)

// NewElector starts campaigning for the lead on name (prefixed like a
// Locker's names) until ctx ends or Close is called.
func NewElector(ctx context.Context, c *sqllock.Client, name string, opts ...Option) (*Elector, error) {
	if c == nil {
		return nil, errors.New("gocronlock: nil *sqllock.Client")
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	e := &Elector{cancel: cancel, done: make(chan error, 1)}
	cb := sqllock.Callbacks{
		OnStartedLeading: func(ctx context.Context) {
			e.set(true)
			<-ctx.Done()
			e.set(false) // before the lease is released
		},
	}
	go func() { e.done <- c.Elect(ctx, cfg.prefix+name, cfg.ttl, cb) }()
	return e, nil
}

func (e *Elector) set(leading bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.leading = leading
}

// IsLeader returns nil while this scheduler leads, and [ErrNotLeader]
// otherwise.
func (e *Elector) IsLeader(context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.leading {
		return ErrNotLeader
	}
	return nil
}

// Close stops campaigning, gives up the lead if this scheduler has it, and
// returns once the lease is released.
func (e *Elector) Close() error {
	e.cancel()
	err := <-e.done
	e.done <- err // a second Close returns at once
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}
