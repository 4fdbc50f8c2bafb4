package sqllock

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkFloorRatio sets sqllock's uncontended pair (TryAcquire and
// Release of a free name) beside the durable floor (two prepared
// single-row UPDATE commits), interleaved finely enough that a slow spell
// of a shared machine falls on both alike:
//
//   - pair: one goroutine; each iteration runs one floor pair and one
//     sqllock pair, in alternating order, and times each. ns/op is the
//     two together; x-floor is sqllock's time over the floor's.
//   - names=64/idle=N: 64 goroutines, each on a name (and a floor row) of
//     its own, in rounds of 16 pairs per goroutine that alternate between
//     the floor and sqllock, with N idle connections kept in the pool.
//     x-floor-rate is sqllock's pairs per second over the floor's.
//   - cost/VARIANT: the driver's pair with the library's ingredients added
//     one at a time, each interleaved with the floor (bench_cost_test.go).
//
// BenchmarkPair and BenchmarkNames time the variants one after another;
// their ratios move with the load, these much less. Run with -count 6 and
// compare with benchstat.
func BenchmarkFloorRatio(b *testing.B) {
	e := benchEnv(b)
	ctx := context.Background()
	floor := func(b *testing.B, rows int) *sql.Stmt {
		t := e.scratchTable(b, "id INT PRIMARY KEY, v BIGINT NOT NULL")
		for i := range rows {
			if _, err := e.db.Exec("INSERT INTO "+t+" VALUES (?, 0)", i); err != nil {
				b.Fatal(err)
			}
		}
		return mustPrepare(b, e.db, "UPDATE "+t+" SET v = v + 1 WHERE id = ?")
	}
	floorPair := func(up *sql.Stmt, id int) error {
		for range 2 {
			if _, err := up.ExecContext(ctx, id); err != nil {
				return err
			}
		}
		return nil
	}
	sqllockPair := func(c *Client, name string) error {
		l, err := c.TryAcquire(ctx, name, benchTTL)
		if err != nil {
			return err
		}
		return l.Release(ctx)
	}

	b.Run("pair", func(b *testing.B) {
		up := floor(b, 1)
		c := e.newClient(b)
		if err := sqllockPair(c, "warm"); err != nil {
			b.Fatal(err)
		}
		inFloor, inLock := interleaved(b, func() error { return floorPair(up, 0) }, func() error { return sqllockPair(c, "bench") })
		b.ReportMetric(float64(inLock)/float64(inFloor), "x-floor")
	})

	b.Run("cost", func(b *testing.B) { benchCost(b, e, floor, floorPair) })

	for _, idle := range []int{2, 64} {
		b.Run(fmt.Sprintf("names=64/idle=%d", idle), func(b *testing.B) {
			benchNames64(b, e, idle, floor, floorPair, sqllockPair)
		})
	}
}

// benchNames64 is BenchmarkFloorRatio's names=64 with idle connections
// kept in the pool: 2 is database/sql's default, with which most of the
// 64 goroutines' statements open a connection (and prepare on it) first.
func benchNames64(b *testing.B, e *testEnv, idle int, floor func(*testing.B, int) *sql.Stmt,
	floorPair func(*sql.Stmt, int) error, sqllockPair func(*Client, string) error) {
	const k, round = 64, 16
	e.db.SetMaxIdleConns(idle)
	b.Cleanup(func() { e.db.SetMaxIdleConns(2) })
	up := floor(b, k)
	c := e.newClient(b)
	if err := sqllockPair(c, "warm"); err != nil {
		b.Fatal(err)
	}
	// One round: every goroutine runs round pairs of one kind; rounds
	// alternate until each kind has run at least b.N pairs.
	run := func(lock bool) time.Duration {
		start := time.Now()
		var wg sync.WaitGroup
		var failed atomic.Bool
		for g := range k {
			wg.Add(1)
			go func() {
				defer wg.Done()
				name := fmt.Sprintf("name-%d", g)
				for range round {
					var err error
					if lock {
						err = sqllockPair(c, name)
					} else {
						err = floorPair(up, g)
					}
					if err != nil {
						if !failed.Swap(true) {
							b.Error(err)
						}
						return
					}
				}
			}()
		}
		wg.Wait()
		if failed.Load() {
			b.FailNow()
		}
		return time.Since(start)
	}
	var inFloor, inLock time.Duration
	for done := 0; done < b.N; done += k * round {
		if done/(k*round)%2 == 0 {
			inFloor += run(false)
			inLock += run(true)
		} else {
			inLock += run(true)
			inFloor += run(false)
		}
	}
	b.ReportMetric(float64(inFloor)/float64(inLock), "x-floor-rate")
}

// interleaved runs b's loop, each iteration one floor pair and one pair,
// in alternating order, and returns the time spent in each, so that a slow
// spell of a shared machine falls on both alike.
func interleaved(b *testing.B, floor, pair func() error) (inFloor, inPair time.Duration) {
	b.Helper()
	i := 0
	for b.Loop() {
		for k := range 2 {
			start := time.Now()
			if (i+k)%2 == 0 {
				if err := floor(); err != nil {
					b.Fatal(err)
				}
				inFloor += time.Since(start)
			} else {
				if err := pair(); err != nil {
					b.Fatal(err)
				}
				inPair += time.Since(start)
			}
		}
		i++
	}
	return inFloor, inPair
}
