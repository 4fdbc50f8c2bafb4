package gocronlock

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/testdsn"
)

// A register is a resource that refuses a write whose fence is below the
// highest it has taken, in the same statement as the write, as
// docs/guarantees.md asks of what a holder that may stall writes to.
type register struct {
	db    *sql.DB
	table string
}

func newRegister(t *testing.T, db *sql.DB) register {
	t.Helper()
	r := register{db: db, table: newTable(t, db, "gocron_register_")}
	if _, err := db.Exec("CREATE TABLE `" + r.table + "` (id INT PRIMARY KEY, fence BIGINT UNSIGNED NOT NULL, v VARCHAR(64) NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("INSERT INTO `" + r.table + "` VALUES (1, 0, '')"); err != nil {
		t.Fatal(err)
	}
	return r
}

// write writes v with fence, and reports whether the register took it.
func (r register) write(ctx context.Context, fence uint64, v string) (bool, error) {
	res, err := r.db.ExecContext(ctx, "UPDATE `"+r.table+"` SET fence = ?, v = ? WHERE id = 1 AND fence <= ?", fence, v, fence)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

// runOnce runs task once, at once, as job on a scheduler with opt, and
// returns what the task returned.
func runOnce(t *testing.T, opt gocron.SchedulerOption, job string, task func(context.Context) error) error {
	t.Helper()
	s, err := gocron.NewScheduler(opt)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	done := make(chan error, 1)
	_, err = s.NewJob(gocron.OneTimeJob(gocron.OneTimeJobStartImmediately()), gocron.NewTask(func(ctx context.Context) error {
		err := task(ctx)
		done <- err
		return err
	}), gocron.WithName(job))
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("the job did not run within 30s")
		return nil
	}
}

// evict takes name from whoever holds it, as an operator would, and gives
// it to other, whose Lock it returns.
func evict(t *testing.T, c, other *sqllock.Client, name string) *sqllock.Lock {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.ForceRelease(ctx, name); err != nil {
		t.Errorf("ForceRelease: %v", err)
		return nil
	}
	l, err := other.Acquire(ctx, name, time.Minute)
	if err != nil {
		t.Errorf("Acquire after the forced release: %v", err)
		return nil
	}
	t.Cleanup(func() { _ = l.Release(context.Background()) })
	return l
}

// checkFencing is the job of the fencing tests: it checks that l is the
// lease the server shows on name, writes with its fence, has another
// holder take name (take, which returns the new holder's Lock) and write,
// and checks that l's fence is then refused and that ctx ends, with a
// cause wrapping ErrLockLost.
func checkFencing(t *testing.T, ctx context.Context, l *sqllock.Lock, c *sqllock.Client, name string, reg register, take func() *sqllock.Lock) {
	t.Helper()
	if l == nil {
		t.Error("the job got no Lock")
		return
	}
	bg := context.Background()
	info, err := c.Inspect(bg, name)
	if err != nil || !info.Held || info.Fence != l.Fence() {
		t.Errorf("Inspect(%q): got %+v, %v, want held with the job's fence %d", name, info, err, l.Fence())
	}
	if ok, err := reg.write(bg, l.Fence(), "job"); !ok || err != nil {
		t.Errorf("the job's write with its fence: got %v, %v, want taken", ok, err)
	}
	newer := take()
	if newer == nil {
		return
	}
	if newer.Fence() <= l.Fence() {
		t.Errorf("the new holder's fence: got %d, want above the job's %d", newer.Fence(), l.Fence())
	}
	if ok, err := reg.write(bg, newer.Fence(), "newer"); !ok || err != nil {
		t.Errorf("the new holder's write: got %v, %v, want taken", ok, err)
	}
	if ok, err := reg.write(bg, l.Fence(), "stale"); ok || err != nil {
		t.Errorf("the job's write after the takeover: got %v, %v, want refused", ok, err)
	}
	select {
	case <-ctx.Done():
		if cause := context.Cause(ctx); !errors.Is(cause, sqllock.ErrLockLost) {
			t.Errorf("the job's context ended with %v, want a cause wrapping ErrLockLost", cause)
		}
	case <-time.After(10 * time.Second):
		t.Error("the job's context had not ended 10s after its lease was taken over")
	}
}

// A job made with Locker.Task gets the run's Lock: the lease the server
// shows on the job's name, whose fence a register takes until another
// holder has the name and refuses after; the job's context ends when the
// lease is lost, and the task's error says so.
func TestLocker_Task_fencesTheRun(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		// No lock-delay: the next holder writes while the evicted job runs,
		// the case fencing is for.
		c, other := newClients(t, s.DSN, sqllock.WithLockDelay(0))
		reg := newRegister(t, openDB(t, s.DSN))
		var log logBuffer
		locker, err := NewLocker(context.Background(), c, WithTTL(time.Second), WithMinHold(0), WithLogger(log.logger()))
		if err != nil {
			t.Fatal(err)
		}
		name := DefaultPrefix + "fenced"
		var ran atomic.Bool
		err = runOnce(t, gocron.WithDistributedLocker(locker), "fenced", locker.Task(func(ctx context.Context, l *sqllock.Lock) error {
			ran.Store(true)
			checkFencing(t, ctx, l, c, name, reg, func() *sqllock.Lock { return evict(t, c, other, name) })
			return nil
		}))
		if !ran.Load() {
			t.Fatalf("the job did not run: %v\nlogged: %s", err, log.String())
		}
		if !errors.Is(err, sqllock.ErrLockLost) {
			t.Errorf("the task returned %v, want an error wrapping ErrLockLost", err)
		}
	})
}

// A Locker's Task runs fn only in a run it locked.
func TestLocker_Task_onlyUnderItsLock(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		c, _ := newClient(t, s.DSN)
		ctx := context.Background()
		var log logBuffer
		locker, err := NewLocker(ctx, c, WithLogger(log.logger()))
		if err != nil {
			t.Fatal(err)
		}
		var ran atomic.Int32
		task := locker.Task(func(context.Context, *sqllock.Lock) error {
			ran.Add(1)
			return nil
		})
		if err := task(ctx); !errors.Is(err, sqllock.ErrNotHeld) {
			t.Errorf("the task called outside a run: got %v, want ErrNotHeld", err)
		}
		// Another Locker's run of the same context is not this one's.
		b, err := NewLocker(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		jobCtx, cancel := context.WithCancel(ctx)
		defer cancel()
		lk, err := b.Lock(jobCtx, "job")
		if err != nil {
			t.Fatal(err)
		}
		if err := task(jobCtx); !errors.Is(err, sqllock.ErrNotHeld) {
			t.Errorf("the task called in another Locker's run: got %v, want ErrNotHeld", err)
		}
		_ = lk.Unlock(ctx)
		if n := ran.Load(); n != 0 {
			t.Errorf("fn ran %d times, want 0", n)
		}
	})
}

// unnamedEnv makes the test binary a scheduler process with one job made
// with Locker.Task and no name, on the lock table it names (DSN, then the
// table, separated by a space): it exits 0 if the job's first run did not
// stop it within a minute.
const unnamedEnv = "GOCRONLOCK_TEST_UNNAMED"

func unnamedMain(spec string) int {
	dsn, table, _ := strings.Cut(spec, " ")
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	c, err := sqllock.New(db, sqllock.WithTable(table))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx := context.Background()
	locker, err := NewLocker(ctx, c)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	j, err := s.NewJob(gocron.DurationJob(100*time.Millisecond), gocron.NewTask(locker.Task(func(context.Context, *sqllock.Lock) error { return nil })),
		gocron.WithStartAt(gocron.WithStartImmediately()))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if j.Name() != taskName {
		fmt.Fprintf(os.Stderr, "gocron named the job %q, want %q\n", j.Name(), taskName)
		return 1
	}
	s.Start()
	time.Sleep(time.Minute)
	return 0
}

// A job made with Locker.Task but no gocron.WithName could never run, and
// gocron cannot refuse it when it is made: its first run stops the process
// with a panic that says how to name it, where a log line went unnoticed.
func TestLocker_Lock_unnamedTaskJobPanics(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		_, table := newClient(t, s.DSN)
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), unnamedEnv+"="+s.DSN+" "+table)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		// A panic ends a Go program with status 2.
		if got := cmd.ProcessState.ExitCode(); got != 2 || !strings.Contains(out.String(), "panic: "+errUnnamedTask.Error()+"\n") {
			t.Fatalf("the scheduler process: got status %d (%v) and output %q, want 2 and the panic %q", got, err, out.String(), errUnnamedTask)
		}
	})
}

// A run's context ends a safety margin before its lease could expire when
// no renewal gets through (here the server stops answering), before any
// other holder can take the name.
func TestLocker_Task_contextEndsBeforeExpiry(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		for try := 1; !contextEndsBeforeExpiry(t, s); try++ {
			if try == 3 {
				t.Fatal("a renewal got past the freeze in 3 tries of 3: the machine is too slow for this test")
			}
			t.Log("a renewal got past the freeze: made again")
		}
	})
}

// contextEndsBeforeExpiry runs the scenario once, and reports false when a
// renewal got through after the task had found the lease past its end: a
// test starved between Lock and the freeze (load average 30) let the first
// renewal be on its way as the proxy froze, and its answer moved the lease
// on, which the run then rightly did not report lost.
func contextEndsBeforeExpiry(t *testing.T, s testdsn.Server) bool {
	c, p, _, _ := newProxiedClient(t, s)
	ctx := context.Background()
	// The lock timeout is the setup's: a 5 s one ran out at a load
	// average of 45.
	locker, err := NewLocker(ctx, c, WithTTL(2*time.Second), WithMinHold(0), WithLogger(nil), WithLockTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	jobCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	lk, err := locker.Lock(jobCtx, "job")
	if err != nil {
		t.Fatal(err)
	}
	p.freeze()
	var (
		liveAtExpiry bool
		held         *sqllock.Lock
		slept        time.Time // the ValidUntil the task found passed
	)
	err = locker.Task(func(ctx context.Context, l *sqllock.Lock) error {
		// No renewal gets through, so ValidUntil stays. Once it has
		// passed, the context has ended, whether or not its timer has
		// fired yet on a loaded machine (a goroutine woken by Done may
		// run late): its Err asks the run's deadline, a margin before.
		held = l
		for {
			slept = l.ValidUntil()
			time.Sleep(time.Until(slept))
			if l.ValidUntil().Equal(slept) {
				break
			}
		}
		liveAtExpiry = ctx.Err() == nil
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Second):
			t.Error("the job's context had not ended 10s after the lease could expire")
		}
		return context.Cause(ctx)
	})(jobCtx)
	if !errors.Is(err, sqllock.ErrLockLost) || strings.Count(err.Error(), "lock lost") != 1 {
		t.Errorf("the task returned %v, want ErrLockLost, said once", err)
	}
	if liveAtExpiry {
		t.Errorf("the job's context was live when the lease could expire, want ended a margin before")
	}
	p.close()
	if err := lk.Unlock(ctx); !errors.Is(err, sqllock.ErrLockLost) {
		if held != nil && !held.ValidUntil().Equal(slept) {
			return false
		}
		t.Errorf("Unlock: got %v, want ErrLockLost", err)
	}
	return true
}

// Unlock reports the loss a Task's context ended with even when the
// renewing goroutine was stopped before its timer fired past the deadline
// (on a loaded machine it fires late, and a select with both the stop and
// the timer ready picks either): the lease may expire, and the release,
// which cannot reach the server here, must not hide that. It failed at a
// load average of 20, Unlock returning the release's connection error.
func TestLocker_Unlock_lossPastDeadlineBeforeRenewSawIt(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		c, p, _, _ := newProxiedClient(t, s)
		ctx := context.Background()
		locker, err := NewLocker(ctx, c, WithTTL(time.Second), WithMinHold(0), WithLogger(nil), WithLockTimeout(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		r, err := locker.lock(ctx, "job", time.Now())
		if err != nil {
			t.Fatal(err)
		}
		// Stop the renewals before the first, as Unlock's stop does when it
		// wins over the timer; Unlock then finds them stopped.
		close(r.stop)
		<-r.done
		r.stop = make(chan struct{})
		for r.expired() == nil {
			time.Sleep(time.Until(r.lock.ValidUntil()))
		}
		p.close() // the release cannot tell ErrNotHeld
		if err := r.Unlock(ctx); !errors.Is(err, sqllock.ErrLockLost) || !strings.Contains(err.Error(), "no renewal") {
			t.Errorf("Unlock past the deadline: got %v, want ErrLockLost: no renewal succeeded in time", err)
		}
	})
}

// A job made with Elector.Task gets the lead's Lock: the lease the server
// shows on the lead's name, whose fence a register takes until another
// scheduler leads and refuses after; the job's context ends with the lead.
// A scheduler that does not lead gets no Lock: fn does not run.
func TestElector_Task_fencesTheLead(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		// No lock-delay: the next holder writes while the evicted job runs,
		// the case fencing is for.
		c, other := newClients(t, s.DSN, sqllock.WithLockDelay(0))
		reg := newRegister(t, openDB(t, s.DSN))
		ctx := context.Background()
		a, b := leaderAndFollower(t, c, other)

		var ran atomic.Int32
		follower := b.Task(func(context.Context, *sqllock.Lock) error {
			ran.Add(1)
			return nil
		})
		if err := follower(ctx); !errors.Is(err, ErrNotLeader) {
			t.Errorf("b's task while a leads: got %v, want ErrNotLeader", err)
		}
		if n := ran.Load(); n != 0 {
			t.Errorf("b's fn ran %d times while a leads, want 0", n)
		}

		name := DefaultPrefix + "lead"
		// takeOver frees the name until b leads. a, told of its loss by its
		// next renewal, campaigns again at once and may take the name back
		// before b's next attempt (a quarter of the 1 s lease away): that
		// is the election working, so the name is freed again.
		takeOver := func() *sqllock.Lock {
			for range 20 {
				before, err := c.Inspect(ctx, name)
				if err != nil {
					t.Errorf("Inspect: %v", err)
					return nil
				}
				// ErrNotHeld: the 1 s lease lapsed since the Inspect (a
				// renewal that a loaded machine answered late); the name
				// is free all the same.
				if _, err := c.ForceRelease(ctx, name); err != nil && !errors.Is(err, sqllock.ErrNotHeld) {
					t.Errorf("ForceRelease: %v", err)
					return nil
				}
				waitUntil(t, "a new lead", func() bool {
					info, err := c.Inspect(ctx, name)
					return err == nil && info.Held && info.Fence > before.Fence
				})
				for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
					if b.IsLeader(ctx) == nil {
						ld, err := b.current()
						if err != nil {
							t.Errorf("b's lead: %v", err)
							return nil
						}
						return ld.lock
					}
					if a.IsLeader(ctx) == nil {
						break // a leads again
					}
				}
			}
			t.Errorf("b did not take the lead in 20 forced releases")
			return nil
		}
		var ranA atomic.Bool
		err := runOnce(t, gocron.WithDistributedElector(a), "job", a.Task(func(ctx context.Context, l *sqllock.Lock) error {
			ranA.Store(true)
			checkFencing(t, ctx, l, c, name, reg, takeOver)
			return nil
		}))
		if !ranA.Load() {
			t.Fatalf("the job did not run on the leader: %v", err)
		}
		if !errors.Is(err, sqllock.ErrLockLost) {
			t.Errorf("the task returned %v, want an error wrapping ErrLockLost", err)
		}
		// takeOver may have freed a lead a had taken again, whose loss a
		// learns at its next renewal (no lock-delay here: fencing is the
		// subject), or, when b's belief that it led was a moment stale, left
		// a leading again, which is the election working. Until a knows it
		// does not lead, its task runs, as CI saw: wait for that, taking
		// the lead over for b again while a still leads after a renewal
		// period. Once a knows, its task must not run.
		for round := 0; a.IsLeader(ctx) == nil; round++ {
			if round == 10 {
				t.Fatal("a still leads after 10 takeovers for b")
			}
			for until := time.Now().Add(2 * time.Second); time.Now().Before(until) && a.IsLeader(ctx) == nil; {
				time.Sleep(10 * time.Millisecond)
			}
			if a.IsLeader(ctx) == nil {
				takeOver()
			}
		}
		if err := a.Task(func(context.Context, *sqllock.Lock) error {
			t.Error("a's fn ran after a lost the lead")
			return nil
		})(ctx); !errors.Is(err, ErrNotLeader) {
			t.Errorf("a's task after b took the lead: got %v, want ErrNotLeader", err)
		}
	})
}

// A Locker Task's context is exact: once the run's deadline has passed on
// the monotonic clock, Err, Done and the cause say the lease is lost at
// once, before any timer fires (here the deadline is moved into the past
// under a live lease, as a pause past it would leave it, and no renewal
// timer is due for a third of the lease).
func TestLocker_Task_contextExactPastDeadline(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		c, _ := newClient(t, s.DSN)
		ctx := context.Background()
		locker, err := NewLocker(ctx, c, WithTTL(time.Minute), WithMinHold(0), WithLogger(nil))
		if err != nil {
			t.Fatal(err)
		}
		jobCtx, cancel := context.WithCancel(ctx)
		defer cancel()
		lk, err := locker.Lock(jobCtx, "exact")
		if err != nil {
			t.Fatal(err)
		}
		defer lk.Unlock(ctx)
		ran := false
		err = locker.Task(func(ctx context.Context, l *sqllock.Lock) error {
			ran = true
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("before the deadline: ctx.Err() = %v, want nil", err)
			}
			r := locker.running(jobCtx)
			r.margin.Store(int64(2 * time.Minute)) // the deadline is now behind us
			if !errors.Is(ctx.Err(), context.Canceled) || !errors.Is(context.Cause(ctx), sqllock.ErrLockLost) {
				return fmt.Errorf("past the deadline: ctx.Err() = %v, cause %v, want canceled by ErrLockLost at once", ctx.Err(), context.Cause(ctx))
			}
			select {
			case <-ctx.Done():
			default:
				return errors.New("past the deadline: Done() is not closed")
			}
			return context.Cause(ctx)
		})(jobCtx)
		if !ran {
			t.Fatalf("fn did not run: %v", err)
		}
		if !errors.Is(err, sqllock.ErrLockLost) || strings.Contains(err.Error(), "want") {
			t.Errorf("the task returned %v, want ErrLockLost alone", err)
		}
	})
}
