package sqllocktest_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/sqllocktest"
)

// processBatches is the code under test: a job that must stop as soon as
// its lease is lost, because another replica may then run it. It tells
// started after its third batch, and then goes on until ctx ends.
func processBatches(ctx context.Context, started chan<- struct{}) (batches int, err error) {
	for {
		if err := ctx.Err(); err != nil {
			return batches, context.Cause(ctx)
		}
		batches++ // one batch of work
		if batches == 3 {
			close(started)
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Millisecond): // the batch's own pace, not the test's
		}
	}
}

// A job run by Client.Do stops when its lease is lost: here the test
// expires the lease once the job is under way, as a stalled holder's lease
// would expire, and the job's context ends at the next renewal, a third of
// the lease later. The test waits for events, never for a time.
func ExampleServer_Expire() {
	srv, err := sqllocktest.NewServer() // in a test: srv := sqllocktest.New(t)
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	locks, err := sqllock.New(srv.DB())
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close()

	started := make(chan struct{})
	result := make(chan error, 1)
	go func() {
		result <- locks.Do(context.Background(), "nightly-report", 300*time.Millisecond,
			func(ctx context.Context, _ *sqllock.Lock) error {
				_, err := processBatches(ctx, started)
				return err
			})
	}()
	<-started // the job runs
	if err := srv.Expire("nightly-report"); err != nil {
		log.Fatal(err)
	}
	err = <-result
	fmt.Println("Do reports the lease lost:", errors.Is(err, sqllock.ErrLockLost))
	// Output:
	// Do reports the lease lost: true
}

// A leader steps down when the database goes away, before its lease could
// expire, so that no two replicas lead at once; it leads again once the
// database is back.
func ExampleServer_Down() {
	srv, err := sqllocktest.NewServer() // in a test: srv := sqllocktest.New(t)
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	locks, err := sqllock.New(srv.DB())
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close()

	ctx, cancel := context.WithCancel(context.Background())
	events := make(chan string, 10)
	elected := make(chan error, 1)
	go func() {
		elected <- locks.Elect(ctx, "leader", 300*time.Millisecond, sqllock.Callbacks{
			OnStartedLeading: func(lead context.Context, _ *sqllock.Lock) error {
				events <- "leading"
				<-lead.Done()
				events <- fmt.Sprintf("lead ended, lease lost: %v", errors.Is(context.Cause(lead), sqllock.ErrLockLost))
				return nil
			},
			OnStoppedLeading: func() { events <- "stepped down" },
		})
	}()
	fmt.Println(<-events)
	srv.Down()
	fmt.Println(<-events)
	fmt.Println(<-events)
	srv.Up()
	fmt.Println(<-events)
	cancel()
	fmt.Println(<-events)
	fmt.Println(<-events)
	fmt.Println("Elect returns ctx's error:", errors.Is(<-elected, context.Canceled))
	// Output:
	// leading
	// lead ended, lease lost: true
	// stepped down
	// leading
	// lead ended, lease lost: false
	// stepped down
	// Elect returns ctx's error: true
}

// The next statement of a kind can fail as the server would fail it: here
// the acquire's reply is lost after the server took the lease, and the
// Client, sending it again with the same token, is told it holds it.
func ExampleServer_Inject() {
	srv, err := sqllocktest.NewServer() // in a test: srv := sqllocktest.New(t)
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	locks, err := sqllock.New(srv.DB())
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close()
	ctx := context.Background()

	if err := srv.Inject(sqllocktest.Fault{Statement: "acquire", Err: sqllocktest.ErrLostConnection, Applied: true}); err != nil {
		log.Fatal(err)
	}
	lock, err := locks.TryAcquire(ctx, "job", time.Minute)
	if err != nil {
		log.Fatal(err)
	}
	defer lock.Release(ctx)
	fmt.Println("acquired after a lost reply; faults left:", srv.Pending())
	// Output:
	// acquired after a lost reply; faults left: 0
}
