package gocronlock

import (
	"bufio"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	_ "github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/testdsn"
)

// The test binary is also the scheduler process: with childEnv set to
// "locker" or "elector" it runs a gocron scheduler instead of the tests, so
// each scheduler is a process of its own, as on separate hosts.
const (
	childEnv  = "GOCRONLOCK_TEST_CHILD"
	tableEnv  = "GOCRONLOCK_TEST_TABLE"
	stopAtEnv = "GOCRONLOCK_TEST_STOP_AT" // unix ms
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		if err := runScheduler(mode); err != nil {
			fmt.Fprintf(os.Stderr, "scheduler %d: %v\n", os.Getpid(), err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runScheduler runs a job every second, on whole seconds, until the stop
// time, under a Locker or an Elector, and prints "ready" once it is set up
// and "ran SECOND" for every run.
func runScheduler(mode string) error {
	stopAt, err := strconv.ParseInt(os.Getenv(stopAtEnv), 10, 64)
	if err != nil {
		return err
	}
	db, err := sql.Open("mysql", os.Getenv(testdsn.Env))
	if err != nil {
		return err
	}
	defer db.Close()
	c, err := sqllock.New(db, sqllock.WithTable(os.Getenv(tableEnv)))
	if err != nil {
		return err
	}
	defer c.Close()
	var opt gocron.SchedulerOption
	var elector *Elector
	switch mode {
	case "locker":
		locker, err := NewLocker(c, WithMinHold(800*time.Millisecond), WithTTL(5*time.Second))
		if err != nil {
			return err
		}
		opt = gocron.WithDistributedLocker(locker)
	case "elector":
		elector, err = NewElector(context.Background(), c, "scheduler", WithTTL(5*time.Second))
		if err != nil {
			return err
		}
		defer elector.Close()
		opt = gocron.WithDistributedElector(elector)
	default:
		return fmt.Errorf("unknown mode %q", mode)
	}
	s, err := gocron.NewScheduler(opt)
	if err != nil {
		return err
	}
	var mu sync.Mutex
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	_, err = s.NewJob(gocron.CronJob("* * * * * *", true), gocron.NewTask(func() {
		tick := time.Now().Round(time.Second).Unix()
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, "ran %d\n", tick)
	}), gocron.WithName("tick"))
	if err != nil {
		return err
	}
	s.Start()
	fmt.Fprintf(os.Stdout, "ready %d\n", time.Now().UnixMilli())
	time.Sleep(time.Until(time.UnixMilli(stopAt)))
	err = s.Shutdown()
	mu.Lock()
	defer mu.Unlock()
	return err
}

// schedulers runs n scheduler processes in mode for about d and returns the
// runs of each tick, and the ticks every scheduler was up for.
func schedulers(t *testing.T, dsn string, mode string, n int, d time.Duration) (runs map[int64]int, from, to int64) {
	t.Helper()
	_, table := newClient(t, dsn)

	stopAt := time.Now().Add(d)
	outs := make([]strings.Builder, n)
	cmds := make([]*exec.Cmd, n)
	for i := range cmds {
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), testdsn.Env+"="+dsn, childEnv+"="+mode, tableEnv+"="+table,
			stopAtEnv+"="+strconv.FormatInt(stopAt.UnixMilli(), 10))
		cmd.Stdout, cmd.Stderr = &outs[i], os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds[i] = cmd
	}
	runs = make(map[int64]int)
	var lastReady int64
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("scheduler %d: %v", i, err)
		}
		for _, line := range strings.Split(outs[i].String(), "\n") {
			var (
				v   int64
				err error
			)
			switch {
			case strings.HasPrefix(line, "ready "):
				v, err = strconv.ParseInt(line[len("ready "):], 10, 64)
				lastReady = max(lastReady, v)
			case strings.HasPrefix(line, "ran "):
				v, err = strconv.ParseInt(line[len("ran "):], 10, 64)
				runs[v]++
			}
			if err != nil {
				t.Fatalf("scheduler %d printed %q: %v", i, line, err)
			}
		}
	}
	// Whole seconds after every scheduler was up and before any stopped.
	return runs, lastReady/1000 + 2, stopAt.Unix() - 1
}

// checkOncePerTick fails the test unless every tick between from and to ran
// exactly once, and no tick ran twice.
func checkOncePerTick(t *testing.T, runs map[int64]int, from, to int64) {
	t.Helper()
	if to-from < 3 {
		t.Fatalf("only ticks %d to %d had every scheduler up: the machine is too slow for this test", from, to)
	}
	for tick, n := range runs {
		if n > 1 {
			t.Errorf("tick %d ran %d times, want once", tick, n)
		}
	}
	for tick := from; tick <= to; tick++ {
		if runs[tick] != 1 {
			t.Errorf("tick %d ran %d times, want once", tick, runs[tick])
		}
	}
	t.Logf("ticks %d to %d each ran once", from, to)
}

// Three schedulers, each in a process of its own, fire a one-second job on
// the same whole seconds: with the Locker each tick runs once, though the
// job returns at once and gocron unlocks right after it.
func TestLocker_oncePerTick(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		runs, from, to := schedulers(t, s.DSN, "locker", 3, 10*time.Second)
		checkOncePerTick(t, runs, from, to)
	})
}

// With the Elector only the leader's scheduler runs jobs: each tick once.
func TestElector_oncePerTick(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		runs, from, to := schedulers(t, s.DSN, "elector", 3, 10*time.Second)
		checkOncePerTick(t, runs, from, to)
	})
}

// A run's lease is kept alive while the job runs, and kept after it for the
// minimum hold; meanwhile another Locker cannot take it.
func TestLocker_holdsWhileRunningAndAfter(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		c, _ := newClient(t, s.DSN)
		a, err := NewLocker(c, WithTTL(time.Second), WithMinHold(2*time.Second), WithJobMinHold("short", 0))
		if err != nil {
			t.Fatal(err)
		}
		b, err := NewLocker(c, WithTTL(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		lk, err := a.Lock(ctx, "job")
		if err != nil {
			t.Fatalf("Lock: %v", err)
		}
		time.Sleep(1500 * time.Millisecond) // past the ttl: only renewals keep it
		if _, err := b.Lock(ctx, "job"); !errors.Is(err, sqllock.ErrNotAcquired) {
			t.Fatalf("second Lock while the job runs: got %v, want ErrNotAcquired", err)
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatalf("Unlock: %v", err)
		}
		if info, err := c.Inspect(ctx, DefaultPrefix+"job"); err != nil || !info.Held {
			t.Fatalf("after Unlock within the minimum hold: got %+v, %v, want held", info, err)
		}
		time.Sleep(700 * time.Millisecond) // the minimum hold has passed
		lk, err = b.Lock(ctx, "job")
		if err != nil {
			t.Fatalf("Lock after the minimum hold: %v", err)
		}
		_ = lk.Unlock(ctx)

		// A job with a minimum hold of its own.
		lk, err = a.Lock(ctx, "short")
		if err != nil {
			t.Fatal(err)
		}
		_ = lk.Unlock(ctx)
		if lk, err = b.Lock(ctx, "short"); err != nil {
			t.Fatalf("Lock right after a run with no minimum hold: %v", err)
		}
		_ = lk.Unlock(ctx)
	})
}

// newClient returns a Client on a fresh table of its own, dropped when the
// test ends, and the table's name.
func newClient(t *testing.T, dsn string) (*sqllock.Client, string) {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	table := "gocron_" + hex.EncodeToString(b[:])
	c, err := sqllock.New(db, sqllock.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CreateTable(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		if _, err := db.Exec("DROP TABLE IF EXISTS `" + table + "`"); err != nil {
			t.Errorf("drop %s: %v", table, err)
		}
		db.Close()
	})
	return c, table
}

// IsLeader follows the lead: one of two Electors leads, and when it closes
// the other takes over.
func TestElector_handover(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		c, table := newClient(t, s.DSN)
		other, err := sqllock.New(openDB(t, s.DSN), sqllock.WithTable(table))
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()
		ctx := context.Background()
		a, err := NewElector(ctx, c, "lead", WithTTL(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		waitUntil(t, "a to lead", func() bool { return a.IsLeader(ctx) == nil })
		b, err := NewElector(ctx, other, "lead", WithTTL(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		time.Sleep(300 * time.Millisecond)
		if err := b.IsLeader(ctx); !errors.Is(err, ErrNotLeader) {
			t.Fatalf("b while a leads: got %v, want ErrNotLeader", err)
		}
		if err := a.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if err := a.IsLeader(ctx); !errors.Is(err, ErrNotLeader) {
			t.Fatalf("a after Close: got %v, want ErrNotLeader", err)
		}
		waitUntil(t, "b to take over", func() bool { return b.IsLeader(ctx) == nil })
	})
}

func openDB(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("still waiting after 10s for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A lease taken from a running job is reported by Unlock.
func TestLocker_Unlock_reportsLoss(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		c, _ := newClient(t, s.DSN)
		locker, err := NewLocker(c, WithTTL(time.Second), WithMinHold(0))
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
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
	})
}
