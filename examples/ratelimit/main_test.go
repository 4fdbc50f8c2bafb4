package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/exampletest"
	"github.com/sqllock/sqllock/internal/testdsn"
)

func TestMain(m *testing.M) { exampletest.Main(m) }

// partner is the partner's API: it counts the calls under way, and
// remembers the most it saw at once.
type partner struct {
	mu           sync.Mutex
	now, most, n int
}

func (p *partner) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	p.now++
	p.n++
	p.most = max(p.most, p.now)
	p.mu.Unlock()
	time.Sleep(20 * time.Millisecond) // the call's work, so that calls overlap unless held apart
	p.mu.Lock()
	p.now--
	p.mu.Unlock()
	fmt.Fprintln(w, "ok")
}

// Three replicas, four goroutines each, call the partner through limited:
// every call is made, and never more than slots at once.
func TestLimited_atMostSlotsAtOnce(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		dsn, _ := testdsn.Database(t, s)
		p := &partner{}
		api := httptest.NewServer(p)
		defer api.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		const replicas, goroutines, calls = 3, 4, 6
		var wg sync.WaitGroup
		errs := make(chan error, replicas*goroutines*calls)
		for i := range replicas {
			_, locks := exampletest.Replica(t, dsn, fmt.Sprintf("replica-%d", i))
			for range goroutines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range calls {
						if err := limited(ctx, locks, func(ctx context.Context) error { return fetch(ctx, api.URL) }); err != nil {
							errs <- err
						}
					}
				}()
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if want := replicas * goroutines * calls; p.n != want {
			t.Errorf("calls made: got %d, want %d", p.n, want)
		}
		if p.most > slots {
			t.Errorf("calls at once: got %d, want at most %d", p.most, slots)
		}
		t.Logf("at most %d calls at once, of %d", p.most, p.n)
	})
}
