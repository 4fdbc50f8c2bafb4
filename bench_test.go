package sqllock

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// Benchmarks need a server, found as for the tests (server_test.go); without
// one they skip. Run them with
//
//	SQLLOCK_TEST_DSN='root@tcp(127.0.0.1:3306)/test' go test -run '^$' -bench . -benchmem

func benchEnv(b *testing.B) *testEnv {
	b.Helper()
	requireServers(b)
	return newEnv(b, testServers[0], variants[0])
}

// BenchmarkTryAcquireRelease is one uncontended acquire and release, the
// cost every lock user pays.
func BenchmarkTryAcquireRelease(b *testing.B) {
	e := benchEnv(b)
	c := e.newClient(b)
	ctx := context.Background()
	mustAcquire(b, c, "warm", time.Second).Release(ctx)
	b.ReportAllocs()
	for b.Loop() {
		l, err := c.TryAcquire(ctx, "bench", 10*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTryAcquireContended is goroutines racing for one name: each
// attempt either takes the lock (and releases it) or is refused.
func BenchmarkTryAcquireContended(b *testing.B) {
	e := benchEnv(b)
	c := e.newClient(b)
	ctx := context.Background()
	var won atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(4)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			l, err := c.TryAcquire(ctx, "contended", 10*time.Second)
			if errors.Is(err, ErrNotAcquired) {
				continue
			}
			if err != nil {
				b.Error(err)
				return
			}
			won.Add(1)
			if err := l.Release(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(won.Load())/float64(b.N), "acquired/op")
}
