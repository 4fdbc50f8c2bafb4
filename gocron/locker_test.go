package gocronlock

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/faultproxy"
	"github.com/sqllock/sqllock/internal/testdsn"
	"github.com/sqllock/sqllock/observe"
)

// A run's lease is kept alive while the job runs, and kept after it for the
// minimum hold; meanwhile another Locker cannot take it. At a load average
// of 20 a 1 s lease was lost, rightly, for no renewal answered within its
// quarter of a second: a run whose lease was lost so is made again with
// every duration doubled, up to 4 s; any other outcome is a failure.
func TestLocker_holdsWhileRunningAndAfter(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		c, _ := newClient(t, s.DSN)
		for ttl := time.Second; !holdsWhileRunningAndAfter(t, c, ttl); ttl *= 2 {
			if ttl >= 4*time.Second {
				t.Fatalf("the lease was lost under load with ttls up to %v: the machine is too slow for this test", ttl)
			}
			t.Logf("the %v lease was lost under load (no renewal in time); made again with a longer one", ttl)
		}
	})
}

// holdsWhileRunningAndAfter runs the scenario once with leases of ttl, on
// a job name of its own, and reports false when the running job's lease
// was lost for want of a renewal in time.
func holdsWhileRunningAndAfter(t *testing.T, c *sqllock.Client, ttl time.Duration) bool {
	ctx := context.Background()
	job, short := "job-"+ttl.String(), "short-"+ttl.String()
	a, err := NewLocker(ctx, c, WithTTL(ttl), WithMinHold(2*ttl), WithJobMinHold(short, 0))
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewLocker(ctx, c, WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	lk, err := a.Lock(ctx, job)
	if err != nil {
		t.Fatalf("Lock: %v", err)
	}
	time.Sleep(ttl * 3 / 2) // past the ttl: only renewals keep it
	other, otherErr := b.Lock(ctx, job)
	err = lk.Unlock(ctx)
	if lostUnderLoad(err) {
		// Unlock reports the loss a renewal deadline gave, which comes a
		// margin before the lease can expire: b must not have had it
		// before then, which the library's own tests check.
		if otherErr == nil {
			_ = other.Unlock(ctx)
		}
		return false
	}
	if !errors.Is(otherErr, sqllock.ErrNotAcquired) {
		t.Fatalf("second Lock while the job runs: got %v, want ErrNotAcquired", otherErr)
	}
	if err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	if info, err := c.Inspect(ctx, DefaultPrefix+job); err != nil || !info.Held {
		t.Fatalf("after Unlock within the minimum hold: got %+v, %v, want held", info, err)
	}
	// The minimum hold has passed, and the last renewal's ttl: a lease
	// is never shortened, so it ends up to a ttl after the renewal.
	time.Sleep(ttl * 6 / 5)
	lk, err = b.Lock(ctx, job)
	if err != nil {
		t.Fatalf("Lock after the minimum hold: %v", err)
	}
	_ = lk.Unlock(ctx)

	// A job with a minimum hold of its own.
	lk, err = a.Lock(ctx, short)
	if err != nil {
		t.Fatal(err)
	}
	_ = lk.Unlock(ctx)
	if lk, err = b.Lock(ctx, short); err != nil {
		t.Fatalf("Lock right after a run with no minimum hold: %v", err)
	}
	_ = lk.Unlock(ctx)
	return true
}

// lostUnderLoad reports whether err is a run's loss of its lease for want
// of a renewal in time, as on a machine too loaded for the lease: not a
// takeover, which a renewal or release reports as ErrNotHeld.
func lostUnderLoad(err error) bool {
	return errors.Is(err, sqllock.ErrLockLost) && !errors.Is(err, sqllock.ErrNotHeld) &&
		strings.Contains(err.Error(), "no renewal of ")
}

// A Locker's Lock is told to the Client's Observer as an acquire, taken or
// refused, as the TryAcquire under it is (issue 43).
func TestLocker_Lock_observed(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		var seen acquiresSeen
		c, other := newClients(t, s.DSN, sqllock.WithObserver(seen.observer()))
		ctx := context.Background()
		a, err := NewLocker(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		b, err := NewLocker(ctx, other)
		if err != nil {
			t.Fatal(err)
		}
		lk, err := a.Lock(ctx, "job")
		if err != nil {
			t.Fatalf("Lock: %v", err)
		}
		if _, err := b.Lock(ctx, "job"); !errors.Is(err, sqllock.ErrNotAcquired) {
			t.Errorf("second Lock while the job runs: got %v, want ErrNotAcquired", err)
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatalf("Unlock: %v", err)
		}
		name := DefaultPrefix + "job"
		for _, o := range []observe.Outcome{observe.OutcomeAcquired, observe.OutcomeHeld} {
			if n := seen.count(name, o); n != 1 {
				t.Errorf("acquires told %v: got %d, want 1", o, n)
			}
		}
	})
}

// The next run of a job on the scheduler that holds its name, during the
// hold, takes the lease over (issue 21: a job whose interval is shorter
// than the hold ran only once per hold); another scheduler still finds the
// name taken, during the run and through the new run's hold; a run
// that is still under way here is not run again.
func TestLocker_Lock_takesOverItsOwnHold(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		c, _ := newClient(t, s.DSN)
		ctx := context.Background()
		var log logBuffer
		// Each run comes a second after the one before, two inside its
		// hold: margin enough for a loaded machine's late wake-ups.
		const hold = 3 * time.Second
		a, err := NewLocker(ctx, c, WithMinHold(hold), WithLogger(log.logger()))
		if err != nil {
			t.Fatal(err)
		}
		b, err := NewLocker(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		lk, err := a.Lock(ctx, "job")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Lock(ctx, "job"); !errors.Is(err, sqllock.ErrNotAcquired) {
			t.Fatalf("Lock while a run is under way here: got %v, want ErrNotAcquired", err)
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		var last time.Time
		for i := range 3 { // each a second after the one before: inside its hold
			time.Sleep(time.Second)
			if _, err := b.Lock(ctx, "job"); !errors.Is(err, sqllock.ErrNotAcquired) {
				t.Fatalf("another Locker during the hold: got %v, want ErrNotAcquired", err)
			}
			last = time.Now()
			lk, err := a.Lock(ctx, "job")
			if err != nil {
				t.Fatalf("run %d, during the hold of the one before: %v", i+2, err)
			}
			if err := lk.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if log.Contains("level=ERROR") || log.Contains("level=WARN") {
			t.Errorf("logged:\n%s", log.String())
		}
		// The last hold ends a little after last, when its lease began.
		time.Sleep(time.Until(last.Add(hold)))
		for deadline := last.Add(hold + 5*time.Second); ; time.Sleep(50 * time.Millisecond) {
			lk, err = b.Lock(ctx, "job")
			if err == nil {
				break
			}
			if !errors.Is(err, sqllock.ErrNotAcquired) || time.Now().After(deadline) {
				t.Fatalf("another Locker once the last hold has passed: %v", err)
			}
		}
		_ = lk.Unlock(ctx)
	})
}

// A lease taken from a running job is reported by Unlock, and logged.
func TestLocker_Unlock_reportsLoss(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		c, _ := newClient(t, s.DSN)
		ctx := context.Background()
		var log logBuffer
		locker, err := NewLocker(ctx, c, WithTTL(time.Second), WithMinHold(0), WithLogger(log.logger()))
		if err != nil {
			t.Fatal(err)
		}
		lk, err := locker.Lock(ctx, "evicted")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.ForceRelease(ctx, DefaultPrefix+"evicted"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(700 * time.Millisecond) // a renewal finds it gone
		if err := lk.Unlock(ctx); !errors.Is(err, sqllock.ErrLockLost) {
			t.Fatalf("Unlock: got %v, want ErrLockLost", err)
		}
		if !log.Contains("level=ERROR") || !log.Contains("job=evicted") {
			t.Errorf("logged %q, want an error naming the job", log.String())
		}
		if lk, err = locker.Lock(ctx, "evicted"); err != nil {
			t.Fatalf("Lock after the loss: %v", err)
		}
		_ = lk.Unlock(ctx)
	})
}

// Issue 21: with a missing table, NewLocker returned a Locker whose every
// Lock failed, and gocron skipped every run in silence.
func TestNewLocker_missingTable(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		db := openDB(t, s.DSN)
		c, err := sqllock.New(db, sqllock.WithTable(newTable(t, db, "gocron_missing_")))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		locker, err := NewLocker(context.Background(), c)
		if err == nil || !strings.Contains(err.Error(), "does not exist") {
			t.Fatalf("NewLocker: got %v, %v, want an error saying the table does not exist", locker, err)
		}
	})
}

// A Lock that fails for any reason but another scheduler's run is logged
// as an error, since gocron only skips the run; one that finds the name
// taken is not.
func TestLocker_Lock_logsErrors(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		c, table := newClient(t, s.DSN)
		ctx := context.Background()
		var log logBuffer
		a, err := NewLocker(ctx, c, WithLogger(log.logger()))
		if err != nil {
			t.Fatal(err)
		}
		b, err := NewLocker(ctx, c, WithLogger(log.logger()))
		if err != nil {
			t.Fatal(err)
		}
		lk, err := a.Lock(ctx, "job")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Lock(ctx, "job"); !errors.Is(err, sqllock.ErrNotAcquired) {
			t.Fatalf("Lock of a taken name: got %v, want ErrNotAcquired", err)
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if log.Contains("level=ERROR") {
			t.Fatalf("a name taken by another scheduler was logged as an error:\n%s", log.String())
		}

		if _, err := openDB(t, s.DSN).Exec("DROP TABLE `" + table + "`"); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Lock(ctx, "other"); err == nil {
			t.Fatal("Lock with the table dropped: got nil, want an error")
		}
		if !log.Contains("level=ERROR") || !log.Contains("job=other") {
			t.Errorf("logged %q, want an error naming the job", log.String())
		}
	})
}

// Issue 21: against a server that accepted connections and never answered,
// Lock called with a 2 s context was still blocked 8 s later. Its statements
// end with ctx, and within the lock timeout when ctx has no deadline, as
// gocron's has not: whether it takes a lease afresh or takes over its own
// hold, on a connection that was working or a new one.
func TestLocker_Lock_silentServer(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		c, p, dsn, table := newProxiedClient(t, s)
		ctx := context.Background()
		fresh, err := NewLocker(ctx, c, WithMinHold(0))
		if err != nil {
			t.Fatal(err)
		}
		held, err := NewLocker(ctx, c, WithMinHold(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		var log logBuffer
		bounded, err := NewLocker(ctx, c, WithMinHold(0), WithLockTimeout(time.Second), WithLogger(log.logger()))
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range []*Locker{fresh, held} { // a working connection, and a hold to take over
			lk, err := l.Lock(ctx, "job")
			if err != nil {
				t.Fatal(err)
			}
			if err := lk.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
		p.freeze()

		// cleanup is the acquire's DELETE of the lease it may have taken
		// (sqllock's cleanupTimeout), on a context of its own.
		const cleanup = time.Second
		for _, tc := range []struct {
			what    string
			l       *Locker
			timeout time.Duration // of ctx; 0: none
			within  time.Duration
		}{
			{"acquire", fresh, 2 * time.Second, 2*time.Second + cleanup},
			{"take over the hold", held, 2 * time.Second, 2 * time.Second},
			{"lock timeout", bounded, 0, time.Second + cleanup},
		} {
			ctx, cancel := context.WithCancel(context.Background())
			if tc.timeout > 0 {
				ctx, cancel = context.WithTimeout(context.Background(), tc.timeout)
			}
			start := time.Now()
			done := make(chan error, 1)
			go func() {
				_, err := tc.l.Lock(ctx, "job")
				done <- err
			}()
			select {
			case err := <-done:
				elapsed := time.Since(start)
				t.Logf("%s: returned after %v: %v", tc.what, elapsed.Round(time.Millisecond), err)
				if err == nil || !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("%s: got %v, want an error wrapping context.DeadlineExceeded", tc.what, err)
				}
				if elapsed > tc.within+500*time.Millisecond {
					t.Errorf("%s: returned after %v, want within %v", tc.what, elapsed, tc.within)
				}
			case <-time.After(tc.within + 10*time.Second):
				t.Fatalf("%s: Lock still blocked %v after it was called", tc.what, time.Since(start).Round(time.Second))
			}
			cancel()
		}
		if !log.Contains("level=ERROR") {
			t.Errorf("a Lock cut by the lock timeout logged %q, want an error", log.String())
		}

		// A Client's first use, in NewLocker, ends with ctx too.
		fresh2, err := sqllock.New(openDB(t, dsn), sqllock.WithTable(table))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		start := time.Now()
		done := make(chan error, 1)
		go func() {
			_, err := NewLocker(ctx, fresh2)
			done <- err
		}()
		select {
		case err := <-done:
			t.Logf("NewLocker: returned after %v: %v", time.Since(start).Round(time.Millisecond), err)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("NewLocker: got %v, want an error wrapping context.DeadlineExceeded", err)
			}
			if elapsed := time.Since(start); elapsed > 1500*time.Millisecond {
				t.Errorf("NewLocker: returned after %v, want within 1s", elapsed)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("NewLocker still blocked 10s after it was called")
		}
	})
}

// newProxiedClient returns a Client on a fresh table of s, reached through
// a silentProxy, p, whose DSN is dsn; p closes, then the Client, when the
// test ends. It skips when s is not reached over TCP.
func newProxiedClient(t *testing.T, s testdsn.Server) (c *sqllock.Client, p silentProxy, dsn, table string) {
	t.Helper()
	_, table = newClient(t, s.DSN)
	cfg, err := mysql.ParseDSN(s.DSN)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Net != "tcp" {
		t.Skipf("the server is reached over %s, not TCP", cfg.Net)
	}
	p = newSilentProxy(t, cfg.Addr)
	cfg.Addr = p.addr()
	dsn = cfg.FormatDSN()
	c, err = sqllock.New(openDB(t, dsn), sqllock.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	t.Cleanup(p.close) // first: Close's releases then fail at once
	return c, p, dsn, table
}

// A silentProxy forwards connections to a server until it is frozen; from
// then on it holds what the connections carry and carries no new one to
// the server, as a frozen mysqld or a stalled proxy does.
type silentProxy struct{ *faultproxy.Proxy }

func newSilentProxy(t *testing.T, target string) silentProxy {
	t.Helper()
	p, err := faultproxy.Start(target)
	if err != nil {
		t.Fatal(err)
	}
	return silentProxy{p}
}

func (p silentProxy) addr() string { return p.Addr() }
func (p silentProxy) freeze()      { p.Stall(faultproxy.Both) }
func (p silentProxy) close()       { _ = p.Close() }
