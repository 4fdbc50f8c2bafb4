package main

import (
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/testdsn"
	"github.com/sqllock/sqllock/observe"
)

// freeAddr returns a loopback address nothing listens on just now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// scrape returns the text at http://addr/metrics, or "" while nothing
// answers there.
func scrape(addr string) string {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// run --metrics serves, while the command runs, what its Client did: the
// lease it holds, the one acquire that took it, and nothing lost.
func TestRun_metrics(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		e := newEnv(t, s.DSN)
		addr := freeAddr(t)
		_, wait := e.start("run", "--metrics", addr, "job", "--", "sh", "-c", "sleep 3")
		var text string
		waitFor(t, 10*time.Second, "the metrics to show the lease held", func() bool {
			text = scrape(addr)
			return strings.Contains(text, "\nsqllock_lease_held 1\n")
		})
		for _, want := range []string{
			"# TYPE sqllock_acquire_duration_seconds histogram\n",
			`sqllock_acquire_duration_seconds_count{sqllock_outcome="acquired"} 1` + "\n",
			`sqllock_acquire_duration_seconds_bucket{sqllock_outcome="acquired",le="+Inf"} 1` + "\n",
			`sqllock_acquire_attempts_total{sqllock_outcome="acquired"} 1` + "\n",
			"# TYPE sqllock_lease_lost_total counter\n",
			"\nsqllock_lease_lost_total 0\n",
		} {
			if !strings.Contains(text, want) {
				t.Errorf("metrics: want %q in:\n%s", want, text)
			}
		}
		if r := wait(); r.status != 0 {
			t.Fatalf("status %d, want 0", r.status)
		}
		if scrape(addr) != "" {
			t.Error("metrics still served after the command ended")
		}
	})
}

// An address run cannot listen on is refused before the name is taken.
func TestRun_metricsBadAddress(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		e := newEnv(t, s.DSN)
		r := e.run("run", "--metrics", "127.0.0.1:notaport", "job", "--", "true")
		if r.status != exitUsage || !strings.Contains(r.stderr, "--metrics 127.0.0.1:notaport") {
			t.Errorf("got status %d, %q; want %d naming --metrics", r.status, r.stderr, exitUsage)
		}
		if e.inspect("job").Held {
			t.Error("the name was taken")
		}
	})
}

// Histogram buckets count cumulatively, a value on a bound falls in it, and
// a counter's series carry their labels.
func TestMetrics_text(t *testing.T) {
	m := newMetrics()
	o := m.observer()
	for _, d := range []time.Duration{3 * time.Millisecond, 5 * time.Millisecond, 2 * time.Second} {
		o.AcquireDone(observe.AcquireEvent{Outcome: observe.OutcomeAcquired, Wait: d, Attempts: 2})
	}
	o.HoldStart(observe.HoldEvent{})
	o.HoldEnd(observe.HoldEvent{End: observe.HoldLost, Held: time.Second})
	o.Refreshed(observe.RefreshEvent{Left: 2 * time.Second, TTL: 3 * time.Second})
	var b strings.Builder
	m.write(&b, "")
	text := b.String()
	parseText(t, text)
	for _, want := range []string{
		`sqllock_acquire_duration_seconds_bucket{sqllock_outcome="acquired",le="0.0025"} 0` + "\n",
		`sqllock_acquire_duration_seconds_bucket{sqllock_outcome="acquired",le="0.005"} 2` + "\n",
		`sqllock_acquire_duration_seconds_bucket{sqllock_outcome="acquired",le="2.5"} 3` + "\n",
		`sqllock_acquire_duration_seconds_bucket{sqllock_outcome="acquired",le="+Inf"} 3` + "\n",
		`sqllock_acquire_duration_seconds_sum{sqllock_outcome="acquired"} 2.008` + "\n",
		`sqllock_acquire_attempts_total{sqllock_outcome="acquired"} 6` + "\n",
		"\nsqllock_lease_held 0\n",
		"\nsqllock_lease_lost_total 1\n",
		`sqllock_lease_duration_seconds_count{sqllock_lease_end="lost"} 1` + "\n",
		"\nsqllock_lease_age_seconds 0\n",
		`sqllock_refresh_remaining_fraction_bucket{sqllock_outcome="acquired",le="0.6"} 0` + "\n",
		`sqllock_refresh_remaining_fraction_bucket{sqllock_outcome="acquired",le="0.7"} 1` + "\n",
		`sqllock_acquire_attempts_total{sqllock_outcome="held"} 0` + "\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("want %q in:\n%s", want, text)
		}
	}
}
