package report

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/sqllocktest"
)

// newReport returns a Report on a fake server, with batches that take 5 ms
// and never run out, and a counter of the batches it ran.
func newReport(t *testing.T, srv *sqllocktest.Server) (*Report, *int) {
	t.Helper()
	locks, err := sqllock.New(srv.DB())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { locks.Close() })
	batches := 0
	return &Report{
		Locks: locks,
		TTL:   300 * time.Millisecond,
		Batch: func(ctx context.Context) (bool, error) {
			select {
			case <-ctx.Done():
				return false, context.Cause(ctx)
			case <-time.After(5 * time.Millisecond):
				batches++
				return true, nil
			}
		},
	}, &batches
}

func TestReport_Run_skipsWhileAnotherReplicaRuns(t *testing.T) {
	srv := sqllocktest.New(t)
	other, _ := newReport(t, srv)
	if _, err := other.Locks.TryAcquire(context.Background(), "nightly-report", time.Minute); err != nil {
		t.Fatal(err)
	}
	r, batches := newReport(t, srv)
	ran, err := r.Run(context.Background())
	if ran || err != nil || *batches != 0 {
		t.Fatalf("got ran %v, %v, %d batches; want no run", ran, err, *batches)
	}
}

func TestReport_Run_stopsWhenLeaseExpires(t *testing.T) {
	srv := sqllocktest.New(t)
	r, _ := newReport(t, srv)
	// The lease ends under the report, as when its holder stalled: the
	// next renewal finds it gone.
	time.AfterFunc(50*time.Millisecond, func() {
		if err := srv.Expire("nightly-report"); err != nil {
			t.Error(err)
		}
	})
	ran, err := r.Run(context.Background())
	if !ran || !errors.Is(err, sqllock.ErrLockLost) {
		t.Fatalf("got ran %v, %v; want ErrLockLost", ran, err)
	}
}

func TestReport_Run_stopsWhenDatabaseIsDown(t *testing.T) {
	srv := sqllocktest.New(t)
	r, _ := newReport(t, srv)
	// No renewal can succeed: the report stops before its lease could
	// expire, so that no second replica runs beside it.
	time.AfterFunc(50*time.Millisecond, srv.Down)
	start := time.Now()
	ran, err := r.Run(context.Background())
	if !ran || !errors.Is(err, sqllock.ErrLockLost) {
		t.Fatalf("got ran %v, %v; want ErrLockLost", ran, err)
	}
	if d := time.Since(start); d > 50*time.Millisecond+r.TTL {
		t.Fatalf("stopped after %v, later than the lease could last", d)
	}
}

func TestReport_Run_throughADeadlockAndALostReply(t *testing.T) {
	srv := sqllocktest.New(t)
	r, batches := newReport(t, srv)
	r.Batch = func(context.Context) (bool, error) { *batches++; return *batches < 3, nil }
	// The library sends the acquire again after a deadlock, and after a
	// reply lost once the server had taken the lease, with the same token.
	if err := srv.Inject(
		sqllocktest.Fault{Statement: "acquire", Err: sqllocktest.Deadlock},
		sqllocktest.Fault{Statement: "acquire", Err: sqllocktest.ErrLostConnection, Applied: true},
	); err != nil {
		t.Fatal(err)
	}
	ran, err := r.Run(context.Background())
	if !ran || err != nil || *batches != 3 {
		t.Fatalf("got ran %v, %v, %d batches; want 3 batches", ran, err, *batches)
	}
}
