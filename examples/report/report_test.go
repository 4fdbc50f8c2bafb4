package report

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/sqllocktest"
)

// newReport returns a Report on a fake server whose batches never run out:
// after the third, each calls then (if not nil) once, and waits for its
// context to end, as a job busy with a long batch would. It also returns a
// counter of the batches begun.
func newReport(t *testing.T, srv *sqllocktest.Server, then func()) (*Report, *int) {
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
			batches++
			if batches < 3 {
				return true, ctx.Err()
			}
			if batches == 3 && then != nil {
				then()
			}
			<-ctx.Done()
			return false, context.Cause(ctx)
		},
	}, &batches
}

func TestReport_Run_skipsWhileAnotherReplicaRuns(t *testing.T) {
	srv := sqllocktest.New(t)
	other, _ := newReport(t, srv, nil)
	if _, err := other.Locks.TryAcquire(context.Background(), "nightly-report", time.Minute); err != nil {
		t.Fatal(err)
	}
	r, batches := newReport(t, srv, nil)
	ran, err := r.Run(context.Background())
	if ran || err != nil || *batches != 0 {
		t.Fatalf("got ran %v, %v, %d batches; want no run", ran, err, *batches)
	}
}

func TestReport_Run_stopsWhenLeaseExpires(t *testing.T) {
	srv := sqllocktest.New(t)
	// The lease ends under the third batch, as when its holder stalled:
	// the next renewal finds it gone, and the batch's context ends.
	r, batches := newReport(t, srv, func() {
		if err := srv.Expire("nightly-report"); err != nil {
			t.Error(err)
		}
	})
	ran, err := r.Run(context.Background())
	if !ran || !errors.Is(err, sqllock.ErrLockLost) || *batches != 3 {
		t.Fatalf("got ran %v, %v, %d batches; want ErrLockLost after 3", ran, err, *batches)
	}
}

func TestReport_Run_stopsWhenDatabaseIsDown(t *testing.T) {
	srv := sqllocktest.New(t)
	// The database goes down under the third batch. No renewal can
	// succeed: the report stops, before its lease could expire by the
	// Client's clock, so that no second replica runs beside it.
	r, batches := newReport(t, srv, srv.Down)
	ran, err := r.Run(context.Background())
	if !ran || !errors.Is(err, sqllock.ErrLockLost) || *batches != 3 {
		t.Fatalf("got ran %v, %v, %d batches; want ErrLockLost after 3", ran, err, *batches)
	}
}

func TestReport_Run_throughADeadlockAndALostReply(t *testing.T) {
	srv := sqllocktest.New(t)
	r, batches := newReport(t, srv, nil)
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
