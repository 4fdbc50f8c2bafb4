package gocronlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/sqllock/sqllock"
)

// A Locker is a gocron.Locker over a sqllock Client: each run of a job takes
// the lease on the job's name, and a scheduler that finds it taken skips the
// run.
//
// gocron unlocks as soon as a job returns, so the Locker keeps the name
// taken for a minimum hold from the start of each run (see [WithMinHold]):
// a scheduler whose tick for the same run comes a little later must find it
// taken (gocron issue 841). A run's lease is first as long as the hold (a
// second at least, the ttl at most), so a job that returns within the
// first third of it leaves the name taken until the hold ends and no
// longer, with no statement at Unlock; the renewals while the job runs
// extend it to the ttl. The Locker never shortens a lease: a
// [sqllock.Lock.Refresh] cannot (a shorter one sent late would end it
// early), so a job that returns later than that third keeps the name until
// its last renewal's ttl ends. A hold longer than the job's interval would
// make every scheduler skip the runs in between, and the Locker cannot see
// the interval: learning it from the gap between Lock calls would cost the
// runs before it is learnt, and a hold cut below the splay between the
// schedulers brings issue 841 back. So the hold stays, and the Locker keeps
// the lease through it: when its own scheduler's next run of the job comes
// within the hold, that run takes the lease over instead of skipping. That
// run can only be a later tick, and the lease never lapses in between, so
// no other scheduler runs the job twice or in the meantime. A frequent job
// thus runs every time, on one scheduler, whatever its interval; when that
// scheduler stops, another takes the job over once the hold has passed.
//
// Give each scheduler a Locker of its own (they may share a Client): two
// schedulers sharing a Locker would take each other's ticks of the same run
// for later runs.
type Locker struct {
	c   *sqllock.Client
	cfg *config

	mu   sync.Mutex
	jobs map[string]*jobLease // by job name, while the Locker may hold its lease
}

var _ gocron.Locker = (*Locker)(nil)

// A jobLease is the lease a Locker holds on one job's name: while a run of
// the job takes it or runs, and after the run until its minimum hold has
// passed (the tail). Its fields are guarded by the Locker's mu.
type jobLease struct {
	lock    *sqllock.Lock // nil while a Lock call takes a new lease
	busy    bool          // a Lock call or a run has it
	run     *run          // the run under way, from Lock to Unlock; for Task
	tailEnd time.Time     // once idle: from then on the lease has expired for sure
}

// NewLocker returns a Locker whose locks are leases in c's table, named
// prefix + the job's name. It checks the table within ctx, as c's first use
// does, and returns the error when the table is missing or differs from
// schema.sql: with such a table every Lock would fail and gocron would skip
// every run.
func NewLocker(ctx context.Context, c *sqllock.Client, opts ...Option) (*Locker, error) {
	if c == nil {
		return nil, errors.New("gocronlock: nil *sqllock.Client")
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	if err := checkTable(ctx, c, cfg.prefix+"*"); err != nil {
		return nil, err
	}
	return &Locker{c: c, cfg: cfg, jobs: make(map[string]*jobLease)}, nil
}

// Lock takes the lease on the job's name for the run gocron is about to
// start, without waiting: when another scheduler holds it, or a run of the
// job is still under way here, it returns an error wrapping
// [sqllock.ErrNotAcquired] and gocron skips this run. A goroutine renews the
// lease while the job runs; Unlock keeps the name taken until the minimum
// hold has passed since this call.
//
// When this Locker still holds the name from the job's previous run, its
// hold not yet over, the job's interval is shorter than the hold: this run
// takes that lease over, in one statement that extends it if the server
// finds it still ours and live (see [Locker]). Otherwise it takes the lease
// afresh.
//
// The statements end when ctx ends or after the lock timeout (see
// [WithLockTimeout]), whichever is first: an acquire whose answer is then
// still outstanding first deletes the lease it may have taken, for up to a
// second more. The lease, once taken, outlives ctx: it ends at Unlock.
// Errors other than [sqllock.ErrNotAcquired] and those of a scheduler shutting
// down are logged, since gocron does not report them.
//
// A lease lost while the job runs (a renewal found it taken over, or none
// succeeded a safety margin before it could expire) ends the context of a
// job made with [Locker.Task], and Unlock reports it. gocron gives a Locker
// no other way to reach a running job: a task of another form runs on
// unaware of the loss.
//
// Lock panics at the first run of a job made with [Locker.Task] but not
// named with gocron.WithName: such a job could never run (see
// [Locker.Task]), and gocron lets a Locker neither refuse the job when it
// is made nor report a refused run anywhere but in a log.
func (l *Locker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	if key == taskName {
		panic(errUnnamedTask)
	}
	if err := ctx.Err(); err != nil {
		return nil, err // the scheduler is shutting down
	}
	r, err := l.lock(ctx, key, time.Now())
	if err != nil {
		switch {
		case ctx.Err() != nil:
			l.cfg.log.DebugContext(ctx, "gocronlock: run skipped: the scheduler is shutting down", "job", key, "err", err)
		case errors.Is(err, sqllock.ErrNotAcquired) && !errors.Is(err, context.DeadlineExceeded):
			// Another scheduler has this run: the usual case. (An acquire
			// cut by the lock timeout wraps ErrNotAcquired too.)
			l.cfg.log.DebugContext(ctx, "gocronlock: run skipped: the job's name is taken", "job", key, "err", err)
		default:
			l.cfg.log.ErrorContext(ctx, "gocronlock: run skipped: the job's lease could not be taken", "job", key, "name", l.cfg.prefix+key, "err", err)
		}
		return nil, err
	}
	return r, nil
}

func (l *Locker) lock(ctx context.Context, key string, start time.Time) (*run, error) {
	jobCtx := ctx
	l.mu.Lock()
	jl := l.jobs[key]
	switch {
	case jl != nil && jl.busy:
		l.mu.Unlock()
		return nil, fmt.Errorf("%w: gocronlock: a run of %q is still under way on this scheduler", sqllock.ErrNotAcquired, key)
	case jl != nil && !start.Before(jl.tailEnd):
		jl.lock = nil // expired: the server would say ErrNotHeld
	case jl == nil:
		jl = &jobLease{}
		l.jobs[key] = jl
	}
	jl.busy = true
	prev, prevEnd := jl.lock, jl.tailEnd
	l.mu.Unlock()

	ctx, cancel := context.WithTimeout(ctx, l.cfg.lockTimeout)
	defer cancel()
	minHold, ok := l.cfg.perJob[key]
	if !ok {
		minHold = l.cfg.minHold
	}
	lease := l.cfg.firstLease(minHold)
	lock := prev
	if prev != nil {
		// The lease ends lease from now, or later if a renewal or an earlier
		// hold left it so (a Refresh never shortens).
		err := prev.Refresh(ctx, lease)
		switch {
		case errors.Is(err, sqllock.ErrNotHeld):
			lock = nil // the hold ended on the server's clock: take it afresh
		case err != nil:
			// Unknown: the lease may be ours for a ttl from now. The next
			// run tries again; the server's answer settles it.
			l.idle(jl, time.Now().Add(l.cfg.ttl))
			return nil, err
		}
	}
	if lock == nil {
		var err error
		if lock, err = l.c.TryAcquire(ctx, l.cfg.prefix+key, lease); err != nil {
			l.forget(key, jl)
			return nil, err
		}
	}
	end := time.Now().Add(lease)
	if lock == prev {
		end = later(end, prevEnd) // the previous run's lease may end later
	}
	r := &run{l: l, key: key, jl: jl, lock: lock, jobCtx: jobCtx, start: start, minHold: minHold, lease: lease,
		end: end, stop: make(chan struct{}), done: make(chan struct{})}
	r.live, r.lose = context.WithCancelCause(context.Background())
	r.margin.Store(int64(safetyMargin(lease)))
	l.mu.Lock()
	jl.lock, jl.run = lock, r
	l.mu.Unlock()
	go r.renew(context.WithoutCancel(ctx))
	return r, nil
}

// idle leaves jl to the job's next run, its lease expired for sure from
// tailEnd on.
func (l *Locker) idle(jl *jobLease, tailEnd time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	jl.busy, jl.run, jl.tailEnd = false, nil, tailEnd
}

// forget drops jl, whose lease is gone or was never taken.
func (l *Locker) forget(key string, jl *jobLease) {
	l.mu.Lock()
	defer l.mu.Unlock()
	jl.run = nil
	if l.jobs[key] == jl {
		delete(l.jobs, key)
	}
}

// A run is one run's hold of its job's lease, from Lock to Unlock; a
// goroutine renews the lease until Unlock stops it.
type run struct {
	l       *Locker
	key     string
	jl      *jobLease
	lock    *sqllock.Lock
	jobCtx  context.Context // Lock's: gocron's context of the job, which the task gets too
	start   time.Time
	minHold time.Duration
	lease   time.Duration // the lease's length now: the first lease, then the ttl
	// margin is the safety margin of the lease ValidUntil counts from, in
	// nanoseconds: set by renew, read by expired from the job's goroutine.
	margin atomic.Int64
	// end is when the lease ends at the latest, as far as this scheduler
	// knows: the last answer plus the lease it set. Set by renew, read by
	// Unlock once renew has returned.
	end time.Time

	stop chan struct{} // closed by Unlock
	done chan struct{} // closed when renew has returned
	lost error         // why the lease was lost, if it was; set before done closes

	// live ends when the lease is lost, with lost as its cause, or at
	// Unlock: the end of the context a Task's fn runs under.
	live context.Context
	lose context.CancelCauseFunc

	once sync.Once
	err  error
}

// renew refreshes the lease to the ttl every third of its length until
// Unlock. It is not the library's keep-alive, which only a release stops:
// the lease must outlive the run, for its hold and for the job's next run
// here. It gives the lease up for lost, and ends r.live, when a renewal
// finds it taken over, or when none has succeeded a safety margin before it
// could expire (see safetyMargin), as [sqllock.Lock.KeepAlive] does.
func (r *run) renew(ctx context.Context) {
	defer close(r.done)
	ttl := r.l.cfg.ttl
	granted := r.lease // of the statement ValidUntil counts from: the first lease, then the ttl
	t := time.NewTimer(r.lease / 3)
	defer t.Stop()
	for {
		deadline := r.lock.ValidUntil().Add(-safetyMargin(granted))
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
		if !time.Now().Before(deadline) {
			r.fail(fmt.Errorf("%w: no renewal of %q succeeded in time; the lease may expire within %v", sqllock.ErrLockLost, r.lock.Name(), safetyMargin(granted)))
			return
		}
		rctx, cancel := context.WithDeadline(ctx, earlier(time.Now().Add(r.lease/4), deadline))
		err := r.lock.Refresh(rctx, ttl)
		cancel()
		if err == nil || !errors.Is(err, sqllock.ErrNotHeld) {
			// Applied, or it may be, now or later.
			r.lease, r.end = ttl, time.Now().Add(ttl)
		}
		wait := ttl / 3
		switch {
		case err == nil:
			granted = ttl
			r.margin.Store(int64(safetyMargin(granted)))
		case errors.Is(err, sqllock.ErrNotHeld):
			r.fail(fmt.Errorf("%w: %w", sqllock.ErrLockLost, err))
			return
		case !time.Now().Before(deadline):
			r.fail(fmt.Errorf("%w: no renewal of %q succeeded in time; the lease may expire within %v: %w", sqllock.ErrLockLost, r.lock.Name(), safetyMargin(granted), err))
			return
		default:
			r.l.cfg.log.WarnContext(ctx, "gocronlock: lease renewal failed; retrying", "job", r.key, "name", r.lock.Name(), "err", err)
			wait = min(r.lease/10, time.Second, time.Until(deadline))
		}
		t.Reset(wait)
	}
}

// expired returns the loss renew reports once the run's deadline, a
// safety margin before the lease could expire, has passed on the monotonic
// clock, whether or not renew's timer has fired; nil before. It is how a
// Task's context ends at once after a pause (taskContext).
func (r *run) expired() error {
	margin := time.Duration(r.margin.Load())
	if time.Now().Before(r.lock.ValidUntil().Add(-margin)) {
		return nil
	}
	return fmt.Errorf("%w: no renewal of %q succeeded in time; the lease may expire within %v", sqllock.ErrLockLost, r.lock.Name(), margin)
}

// fail records why the lease was lost and ends the job's context with it.
func (r *run) fail(lost error) {
	r.lost = lost
	r.lose(lost)
}

// safetyMargin is how long before a lease of length lease could expire the
// job is told it is lost, unless a renewal has succeeded: min(lease/10, 5s),
// sqllock's default for work under a keep-alive.
func safetyMargin(lease time.Duration) time.Duration {
	return min(lease/10, 5*time.Second)
}

// Unlock ends the run (see [Locker.Lock]): it stops the renewals and, until
// the minimum hold has passed since Lock, keeps the lease, extended if it
// would end before the hold does, for the job's next run here to take
// over; after it, it releases the lease. Its statements run on a context
// of their own, bounded by [sqllock.ReleaseTimeout], since gocron's ctx may
// have ended. Its error wraps [sqllock.ErrLockLost] when the lease was lost
// while the job ran; gocron ignores it, so it is logged too.
func (r *run) Unlock(ctx context.Context) error {
	r.once.Do(func() { r.err = r.unlock(ctx) })
	return r.err
}

func (r *run) unlock(ctx context.Context) error {
	close(r.stop)
	<-r.done
	if r.lost == nil {
		// Stopped before its timer fired, or with both ready (a loaded
		// machine wakes it late, and select picks either): renew has not
		// seen the deadline pass, but a Task's context has ended at it with
		// this loss, and the lease may expire. Report it, as renew would.
		if lost := r.expired(); lost != nil {
			r.fail(lost)
		}
	}
	r.lose(nil) // the job has returned
	l, name := r.l, r.lock.Name()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), sqllock.ReleaseTimeout)
	defer cancel()
	if r.lost != nil {
		l.forget(r.key, r.jl)
		l.cfg.log.ErrorContext(ctx, "gocronlock: lease lost while the job ran", "job", r.key, "name", name, "err", r.lost)
		_ = r.lock.Release(ctx) // in case it is ours after all; ErrNotHeld otherwise
		return r.lost
	}
	var err error
	if rest := r.minHold - time.Since(r.start); rest >= sqllock.MinTTL {
		// The lease lasts through the hold, or is extended to; past its end
		// it blocks nobody and needs no release.
		if !r.lock.ValidUntil().Before(r.start.Add(r.minHold)) {
			l.idle(r.jl, r.end)
			return nil
		}
		if err = r.lock.Refresh(ctx, rest); err == nil {
			l.idle(r.jl, later(r.end, time.Now().Add(rest)))
			return nil
		}
	} else {
		err = r.lock.Release(ctx)
		if err == nil {
			l.forget(r.key, r.jl)
			return nil
		}
	}
	if errors.Is(err, sqllock.ErrNotHeld) {
		// Taken over, or expired, between the last renewal and now.
		l.forget(r.key, r.jl)
		err = fmt.Errorf("%w: %w", sqllock.ErrLockLost, err)
		l.cfg.log.ErrorContext(ctx, "gocronlock: lease lost while the job ran", "job", r.key, "name", name, "err", err)
		return err
	}
	// Unknown: the lease may last a ttl from now. The job's next run here
	// asks the server; the other schedulers wait for it to expire.
	l.idle(r.jl, time.Now().Add(l.cfg.ttl))
	l.cfg.log.WarnContext(ctx, "gocronlock: could not end the run's lease; it expires on its own", "job", r.key, "name", name, "err", err)
	return err
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
