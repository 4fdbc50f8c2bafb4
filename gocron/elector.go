package gocronlock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/go-co-op/gocron/v2"
	"github.com/sqllock/sqllock"
)

// An Elector is a gocron.Elector over [sqllock.Client.Elect]: the scheduler
// whose Client leads runs the jobs.
type Elector struct {
	mu     sync.Mutex
	lead   *lead // while this scheduler leads
	ended  error // why the campaign ended for good, if it has
	cancel context.CancelFunc
	done   chan error
}

// A lead is this scheduler's lead: its Lock, and the context that ends
// with it (see [sqllock.Callbacks]).
type lead struct {
	ctx  context.Context
	lock *sqllock.Lock
}

var _ gocron.Elector = (*Elector)(nil)

// NewElector checks c's table within ctx, as c's first use does, and
// returns the error when the table is missing or differs from schema.sql.
// Then it starts campaigning for the lead on name (prefixed like a Locker's
// names) until ctx ends or Close is called. A campaign that ends for good
// before that (Elect's error that campaigning cannot get past, such as a
// table dropped since) is logged, and IsLeader returns its error from then
// on.
func NewElector(ctx context.Context, c *sqllock.Client, name string, opts ...Option) (*Elector, error) {
	if c == nil {
		return nil, errors.New("gocronlock: nil *sqllock.Client")
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	name = cfg.prefix + name
	if err := checkTable(ctx, c, name); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	e := &Elector{cancel: cancel, done: make(chan error, 1)}
	cb := sqllock.Callbacks{
		OnStartedLeading: func(ctx context.Context, l *sqllock.Lock) error {
			e.set(&lead{ctx: ctx, lock: l})
			<-ctx.Done()
			e.set(nil) // before the lease is released
			return nil
		},
	}
	go func() {
		err := c.Elect(ctx, name, cfg.ttl, cb)
		if ctx.Err() == nil {
			e.end(cfg.log, name, err)
		}
		e.done <- err
	}()
	return e, nil
}

func (e *Elector) set(ld *lead) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.lead = ld
}

// end records and logs a campaign that ended before its context.
func (e *Elector) end(log *slog.Logger, name string, err error) {
	log.Error("gocronlock: campaign for the lead ended; this scheduler will not lead", "name", name, "err", err)
	e.mu.Lock()
	defer e.mu.Unlock()
	e.ended = err
}

// IsLeader returns nil while this scheduler leads, and an error wrapping
// [ErrNotLeader] otherwise; after a campaign that ended for good, it wraps
// that campaign's error too.
func (e *Elector) IsLeader(context.Context) error {
	_, err := e.current()
	return err
}

// current returns the lead this scheduler holds, or IsLeader's error. A
// lead whose context has ended is over, though Elect may not yet have
// released its lease.
func (e *Elector) current() (*lead, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case e.lead != nil && e.lead.ctx.Err() == nil:
		return e.lead, nil
	case e.ended != nil:
		return nil, fmt.Errorf("%w: the campaign ended: %w", ErrNotLeader, e.ended)
	}
	return nil, ErrNotLeader
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
