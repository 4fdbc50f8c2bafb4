package sqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/sqllock/sqllock"
)

// The examples need a server, so they have no Output lines: they compile
// everywhere and run nowhere by themselves.

func ExampleNew() {
	db, err := sql.Open("mysql", "app:secret@tcp(db:3306)/app")
	if err != nil {
		log.Fatal(err)
	}
	locks, err := sqllock.New(db, sqllock.WithTable("app_locks"), sqllock.WithHolder("worker-3"))
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close()
	// Once, at deploy time or start-up; schema.sql does the same by hand.
	if err := locks.CreateTable(context.Background()); err != nil {
		log.Fatal(err)
	}
}

func ExampleClient_TryAcquire() {
	ctx := context.Background()
	var locks *sqllock.Client // from sqllock.New

	lock, err := locks.TryAcquire(ctx, "nightly-report", time.Minute)
	if errors.Is(err, sqllock.ErrNotAcquired) {
		return // another replica runs tonight's report
	}
	if err != nil {
		log.Fatal(err)
	}
	// Release even if ctx is cancelled by then.
	defer lock.Release(context.WithoutCancel(ctx))
	fmt.Println("running the report under fence", lock.Fence())
}

func ExampleClient_TryAcquireSet() {
	ctx := context.Background()
	var locks *sqllock.Client // from sqllock.New

	// Both shards or neither: another rebuild that needs either waits.
	lock, err := locks.TryAcquireSet(ctx, []string{"shard-3", "shard-7"}, time.Minute)
	var held *sqllock.HeldError
	if errors.As(err, &held) {
		fmt.Println("busy:", held.Names) // nothing was taken
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	defer lock.Release(context.WithoutCancel(ctx))
	fmt.Println("rebuilding", lock.Names(), "under fence", lock.Fence())
}

func ExampleClient_Acquire() {
	var locks *sqllock.Client // from sqllock.New
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	lock, err := locks.Acquire(ctx, "schema-migration", time.Minute)
	if errors.Is(err, context.DeadlineExceeded) {
		log.Fatal("another replica held the migration lock for 30s") // err is also ErrNotAcquired
	}
	if err != nil {
		log.Fatal(err)
	}
	defer lock.Release(context.WithoutCancel(ctx))
}

func ExampleLock_Refresh() {
	ctx := context.Background()
	var lock *sqllock.Lock // from TryAcquire or Acquire, with a ttl of one minute

	err := lock.Refresh(ctx, time.Minute)
	switch {
	case errors.Is(err, sqllock.ErrNotHeld):
		log.Print("lease lost: stop the work") // someone took the name over
	case err != nil:
		// Not proof of loss: the lease stands until lock.ValidUntil().
		log.Printf("refresh failed, retry before %v: %v", lock.ValidUntil(), err)
	}
}

func ExampleClient_Inspect() {
	var locks *sqllock.Client // from sqllock.New
	info, err := locks.Inspect(context.Background(), "nightly-report")
	if err != nil {
		log.Fatal(err)
	}
	if info.Held {
		fmt.Printf("%s holds it for another %v (fence %d)\n", info.Holder, info.TTL, info.Fence)
	}
}

func ExampleClient_Do() {
	ctx := context.Background()
	var locks *sqllock.Client // from sqllock.New

	// One replica at a time runs the report; the others wait their turn.
	err := locks.Do(ctx, "nightly-report", time.Minute, func(ctx context.Context, _ *sqllock.Lock) error {
		// ctx is cancelled before the lease could lapse: stop when it is.
		return runReport(ctx)
	}, sqllock.WithMinHold(10*time.Minute)) // a late trigger on another host finds it taken
	if errors.Is(err, sqllock.ErrLockLost) {
		log.Print("the lease was lost while the report ran; another replica may run it too")
	}
	if err != nil {
		log.Print(err)
	}
}

func ExampleLock_Do() {
	ctx := context.Background()
	var locks *sqllock.Client // from sqllock.New

	// Tonight's job runs on whichever host's cron fires first; the others
	// skip it rather than wait.
	l, err := locks.TryAcquire(ctx, "nightly-report", time.Minute)
	if errors.Is(err, sqllock.ErrNotAcquired) {
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	// Do renews the lease while fn runs and releases it after.
	err = l.Do(ctx, func(ctx context.Context, l *sqllock.Lock) error {
		return runReport(ctx) // pass l.Fence() to a resource that can refuse stale writers
	})
	if err != nil {
		log.Print(err)
	}
}

func ExampleClient_Elect() {
	ctx := context.Background() // cancel it to step down and stop campaigning
	var locks *sqllock.Client   // from sqllock.New

	err := locks.Elect(ctx, "scheduler", 15*time.Second, sqllock.Callbacks{
		OnStartedLeading: func(ctx context.Context, _ *sqllock.Lock) error {
			runScheduler(ctx) // returns when ctx ends: the lead is over
			return nil
		},
		OnStoppedLeading: func() { log.Print("no longer leading") },
		OnNewLeader:      func(holder string) { log.Printf("%s leads", holder) },
	})
	log.Print(err) // ctx's error once ctx has ended
}

func ExampleClient_Once() {
	ctx := context.Background()
	var locks *sqllock.Client // from sqllock.New

	// However many replicas start, the seed data is loaded once; a failed
	// attempt is retried by the next replica to start or call.
	ran, err := locks.Once(ctx, "seed-v1", func(ctx context.Context, _ *sqllock.Lock) error {
		return loadSeedData(ctx)
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("loaded here:", ran)
}

func ExampleLock_Check() {
	ctx := context.Background()
	var (
		db   *sql.DB       // the application's database, which holds the lock table
		lock *sqllock.Lock // from TryAcquire or Acquire
	)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	// No takeover of the lease can commit before tx ends.
	if err := lock.Check(ctx, tx); err != nil {
		log.Fatal(err) // ErrNotHeld: write nothing
	}
	if _, err := tx.ExecContext(ctx, "UPDATE accounts SET balance = balance - 10 WHERE id = 1"); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
}

func runReport(context.Context) error    { return nil }
func runScheduler(ctx context.Context)   { <-ctx.Done() }
func loadSeedData(context.Context) error { return nil }

func ExampleWithLogger() {
	var db *sql.DB // from sql.Open
	// Info and above: lead changes, lost leases, failed renewals; never a
	// line per successful operation.
	logger := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	locks, err := sqllock.New(db, sqllock.WithLogger(logger))
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close()
}

func ExampleClient_ForceRelease() {
	ctx := context.Background()
	var locks *sqllock.Client // from sqllock.New

	// An operator frees a name whose holder is stuck.
	was, err := locks.ForceRelease(ctx, "nightly-report")
	if errors.Is(err, sqllock.ErrNotHeld) {
		fmt.Println("nobody held it")
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	// A live lease stays taken by a lock-delay, until its holder has seen
	// the loss and stopped (sqllock.WithLockDelay(0) frees it at once).
	fmt.Printf("released the lease of %s (fence %d, live: %v); nobody can take it for %v\n",
		was.Holder, was.Fence, was.Held, was.LockDelay)
}

// Wake-up channels are on by default: processes that wait for a name
// another process holds block on the server instead of polling, and take it
// in the order they came, within a round trip of its release. Each channel
// takes a connection of the pool; WithWakeups sets how many a Client holds
// at once, and 0 turns them off.
func ExampleWithWakeups() {
	db, err := sql.Open("mysql", "app:secret@tcp(db:3306)/app")
	if err != nil {
		log.Fatal(err)
	}
	// This process waits for many names at once: up to 8 of them wait on
	// channels, on 8 connections of the pool; the others poll.
	db.SetMaxOpenConns(20)
	locks, err := sqllock.New(db, sqllock.WithWakeups(8))
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close()
	ctx := context.Background()
	for range 3 {
		l, err := locks.Acquire(ctx, "queue-drain", 30*time.Second)
		if err != nil {
			log.Fatal(err)
		}
		// ... a turn of work; other processes wait on the channel ...
		if err := l.Release(ctx); err != nil {
			log.Print(err)
		}
	}
}

// At most three replicas run the export at once: each takes one of the
// name's three slots, or hears that all are held.
func ExampleSemaphore_TryAcquire() {
	db, _ := sql.Open("mysql", "app:secret@tcp(db:3306)/app")
	locks, _ := sqllock.New(db)
	ctx := context.Background()
	lock, err := locks.Semaphore("export", 3).TryAcquire(ctx, time.Minute)
	if errors.Is(err, sqllock.ErrNotAcquired) {
		fmt.Println("three exports run already")
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	defer lock.Release(ctx)
	fmt.Printf("slot %d of %s, fence %d\n", lock.Slot(), lock.Name(), lock.Fence())
}
