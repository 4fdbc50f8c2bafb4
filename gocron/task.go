package gocronlock

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"runtime"

	"github.com/sqllock/sqllock"
)

// Task returns the function to give gocron.NewTask, with no parameters, for
// a job run under l: each run calls fn with the run's Lock, whose fence the
// job passes to what it writes (docs/guarantees.md), and with the job's
// context, which gocron ends at shutdown and which also ends, with a cause
// wrapping [sqllock.ErrLockLost], when the run's lease is lost: a renewal
// found it taken over, or none succeeded a safety margin before it could
// expire. The function returns fn's error, joined with that cause when the
// lease was lost while fn ran.
//
// The function finds the run by gocron's context of the job, which gocron
// passes both to [Locker.Lock] and, as its first argument, to a task that
// takes a context. A run not locked by l (the job runs under another Locker
// or an Elector, has no locker, or was given a context of its own in
// gocron.NewTask) is not run: the function returns an error wrapping
// [sqllock.ErrNotHeld].
//
// Name the job with gocron.WithName. Otherwise gocron names it after the
// function, which is the same for every job made with Task: they would
// share one lease, so [Locker.Lock] panics at the job's first run, with
// errUnnamedTask's message. gocron.NewJob cannot refuse it: gocron offers a
// Locker no way to see a job before its first run.
//
//go:noinline
func (l *Locker) Task(fn func(ctx context.Context, l *sqllock.Lock) error) func(context.Context) error {
	return func(ctx context.Context) error {
		r := l.running(ctx)
		if r == nil {
			return fmt.Errorf("%w: gocronlock: the job's run was not locked by this Locker", sqllock.ErrNotHeld)
		}
		return runTask(ctx, r.live, r.lock, r.expired, fn)
	}
}

// errUnnamedTask is what [Locker.Lock] panics with for a job named
// taskName.
var errUnnamedTask = errors.New("gocronlock: a job made with Locker.Task has no name of its own, so it can never run " +
	"(gocron names it after the function, which every such job shares, and they would share one lease): " +
	"give it one with gocron.WithName(\"...\") in gocron.NewJob, the same on every scheduler")

// taskName is the name gocron gives a job whose task is a Locker's Task and
// whose name is not set: the function's. Task is not inlined, so that its
// function has this name wherever Task is called (an inlined copy is named
// after its caller, and would change with the compiler's choices).
var taskName = runtime.FuncForPC(reflect.ValueOf((*Locker)(nil).Task(nil)).Pointer()).Name()

// running returns the run under way whose job's context is ctx, or nil if
// there is none, or more than one (Lock called with one context for several
// jobs, which gocron never does).
func (l *Locker) running(ctx context.Context) *run {
	if ctx == nil || !reflect.TypeOf(ctx).Comparable() {
		return nil // == on such a context would panic; gocron's are pointers
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	var found *run
	for _, jl := range l.jobs {
		if jl.run != nil && jl.run.jobCtx == ctx {
			if found != nil {
				return nil
			}
			found = jl.run
		}
	}
	return found
}

// Task returns the function to give gocron.NewTask, with no parameters, for
// a job run under e: each run calls fn with the Lock of the lead this
// scheduler holds, whose fence the job passes to what it writes
// (docs/guarantees.md), and with the job's context, which gocron ends at
// shutdown and which also ends when the lead does, with the lead's cause
// (wrapping [sqllock.ErrLockLost] when its lease was lost). The function
// returns fn's error, joined with that cause when the lease was lost while
// fn ran.
//
// gocron runs a job only after [Elector.IsLeader] said this scheduler
// leads; should the lead have ended since, the function does not run fn and
// returns an error wrapping [ErrNotLeader].
func (e *Elector) Task(fn func(ctx context.Context, l *sqllock.Lock) error) func(context.Context) error {
	return func(ctx context.Context) error {
		ld, err := e.current()
		if err != nil {
			return err
		}
		return runTask(ctx, ld.ctx, ld.lock, nil, fn)
	}
}

// runTask runs fn with lock on a context derived from the job's ctx that
// also ends when lease does, with its cause, and is exact after a pause
// (see taskContext).
func runTask(ctx, lease context.Context, lock *sqllock.Lock, expired func() error, fn func(ctx context.Context, l *sqllock.Lock) error) error {
	tctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	defer context.AfterFunc(lease, func() { cancel(context.Cause(lease)) })()
	task := &taskContext{Context: tctx, cancel: cancel, lease: lease, expired: expired}
	err := fn(task, lock)
	if lost := context.Cause(task); errors.Is(lost, sqllock.ErrLockLost) && !errors.Is(err, lost) {
		err = errors.Join(err, lost)
	}
	return err
}

// A taskContext is the context a Task's fn runs under. Its Err, Done and
// Value first ask the lease whether it has ended (the root's keep-alive
// context under an Elector, whose check is exact; under a Locker, the
// run's expired, which compares the monotonic clock with the run's
// deadline). After a process pause (SIGSTOP, a paused VM) the timers that
// end the lease and the job's own are all overdue and Go runs them in any
// order: without the check, a job that resumed first would find its
// context live and do one more unit beside the next holder.
type taskContext struct {
	context.Context
	cancel  context.CancelCauseFunc
	lease   context.Context
	expired func() error // nil when lease's own check is exact
}

func (c *taskContext) check() {
	if c.Context.Err() != nil {
		return
	}
	if c.lease.Err() != nil {
		c.cancel(context.Cause(c.lease))
	} else if c.expired != nil {
		if err := c.expired(); err != nil {
			c.cancel(err)
		}
	}
}

func (c *taskContext) Err() error {
	c.check()
	return c.Context.Err()
}

func (c *taskContext) Done() <-chan struct{} {
	c.check()
	return c.Context.Done()
}

// Value checks too: context.Cause reads the cause through Value.
func (c *taskContext) Value(key any) any {
	c.check()
	return c.Context.Value(key)
}
