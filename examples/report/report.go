// Package report is the code under test of docs/testing-your-code.md: a
// nightly report that one replica at a time runs, batch by batch, under a
// lease, and that stops as soon as the lease is lost.
package report

import (
	"context"
	"errors"
	"time"

	"github.com/sqllock/sqllock"
)

// Report runs Batch under the lease "nightly-report" until it has no more.
type Report struct {
	Locks *sqllock.Client
	TTL   time.Duration // the lease's length: a lost lease is noticed within TTL/3
	// Batch does one batch of the report and says whether more remain. It
	// must stop when ctx ends: the lease is lost, another replica may run.
	Batch func(ctx context.Context) (more bool, err error)
}

// Run runs the report unless another replica runs it (ran false, no
// error). An error wrapping sqllock.ErrLockLost means the lease was lost
// midway and the report stopped.
func (r *Report) Run(ctx context.Context) (ran bool, err error) {
	l, err := r.Locks.TryAcquire(ctx, "nightly-report", r.TTL)
	if errors.Is(err, sqllock.ErrNotAcquired) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return true, l.Do(ctx, func(ctx context.Context, _ *sqllock.Lock) error {
		for {
			more, err := r.Batch(ctx)
			if err != nil || !more {
				return err
			}
		}
	})
}
