package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sqllock/sqllock"
)

// With --metrics ADDR, run serves what its Client does at
// http://ADDR/metrics, in Prometheus's text format, while the command runs:
// the instruments of the otel module (github.com/sqllock/sqllock/otel)
// under the names its Prometheus exporter gives them, without the exporter's
// otel_scope labels. They are made here from the library's Observer, so the
// command needs nothing beyond the standard library and its driver; and,
// as in the otel module, they carry no lock name.

// metricsBuckets are the histograms' bounds, in seconds: the otel module's.
var metricsBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600}

// A metric is one family: its name, help, type and series by labels.
type metric struct {
	name, help, typ string
	series          map[string]*series // by the labels' text, "" for none
}

type series struct {
	value  float64  // a counter's or a gauge's
	counts []uint64 // a histogram's, per bucket, not cumulative
	sum    float64
	count  uint64
}

// metrics is what run's Client did, by family name.
type metrics struct {
	mu       sync.Mutex
	families map[string]*metric
}

func newMetrics() *metrics {
	m := &metrics{families: make(map[string]*metric)}
	for _, f := range []metric{
		{name: "sqllock_acquire_duration_seconds", typ: "histogram", help: "How long each acquire call took, waits included."},
		{name: "sqllock_acquire_attempts_total", typ: "counter", help: "The acquire statements the acquire calls sent."},
		{name: "sqllock_lease_held", typ: "gauge", help: "The leases this process holds now."},
		{name: "sqllock_lease_duration_seconds", typ: "histogram", help: "How long each lease was held."},
		{name: "sqllock_lease_lost_total", typ: "counter", help: "Leases lost while held."},
		{name: "sqllock_refresh_remaining_seconds", typ: "histogram", help: "How much of the lease was left when each renewal was sent."},
		{name: "sqllock_statement_retries_total", typ: "counter", help: "Statements that failed in a way the Client retries."},
		{name: "sqllock_acquire_unknown_total", typ: "counter", help: "Acquires whose outcome stayed unknown, and deletes that settled one."},
		{name: "sqllock_wakeups_total", typ: "counter", help: "Waits on a wake-up channel that ended, and the channels turned off."},
	} {
		f.series = make(map[string]*series)
		m.families[f.name] = &f
	}
	// The leases held and lost read 0 from the start, not nothing, so that
	// an alert on an increase of the lost sees the first one.
	m.families["sqllock_lease_held"].series[""] = &series{}
	m.families["sqllock_lease_lost_total"].series[""] = &series{}
	return m
}

// labels renders label pairs (name, value, ...) in the text format.
func labels(kv ...string) string {
	var b strings.Builder
	for i := 0; i+1 < len(kv); i += 2 {
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(kv[i] + "=" + strconv.Quote(kv[i+1]))
	}
	return b.String()
}

func (m *metrics) at(name, lbl string) *series {
	f := m.families[name]
	s := f.series[lbl]
	if s == nil {
		s = &series{}
		if f.typ == "histogram" {
			s.counts = make([]uint64, len(metricsBuckets)+1)
		}
		f.series[lbl] = s
	}
	return s
}

func (m *metrics) add(name, lbl string, v float64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.at(name, lbl).value += v
}

func (m *metrics) observe(name, lbl string, d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, v := m.at(name, lbl), d.Seconds()
	i, _ := slices.BinarySearch(metricsBuckets, v) // the first bound >= v
	s.counts[i]++
	s.sum += v
	s.count++
}

// observer reports the Client's events into m.
func (m *metrics) observer() sqllock.Observer {
	return sqllock.Observer{
		AcquireDone: func(e sqllock.AcquireEvent) {
			l := labels("sqllock_outcome", e.Outcome.String())
			m.observe("sqllock_acquire_duration_seconds", l, e.Wait)
			m.add("sqllock_acquire_attempts_total", l, float64(e.Attempts))
		},
		HoldStart: func(sqllock.HoldEvent) { m.add("sqllock_lease_held", "", 1) },
		HoldEnd: func(e sqllock.HoldEvent) {
			m.add("sqllock_lease_held", "", -1)
			m.observe("sqllock_lease_duration_seconds", labels("sqllock_lease_end", e.End.String()), e.Held)
			if e.End == sqllock.HoldLost {
				m.add("sqllock_lease_lost_total", "", 1)
			}
		},
		Refreshed: func(e sqllock.RefreshEvent) {
			m.observe("sqllock_refresh_remaining_seconds", labels("sqllock_outcome", e.Outcome.String()), e.Left)
		},
		Retried: func(e sqllock.RetryEvent) {
			m.add("sqllock_statement_retries_total", labels("sqllock_statement", e.Statement, "sqllock_outcome", e.Outcome.String()), 1)
		},
		Unknown: func(e sqllock.UnknownEvent) {
			m.add("sqllock_acquire_unknown_total", labels("sqllock_settled", strconv.FormatBool(e.Settled)), 1)
		},
		Wakeup: func(e sqllock.WakeupEvent) {
			m.add("sqllock_wakeups_total", labels("sqllock_wakeup_state", e.State.String()), 1)
		},
	}
}

// write writes every family in the text format, in name order.
func (m *metrics) write(w io.Writer) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, name := range slices.Sorted(maps.Keys(m.families)) {
		f := m.families[name]
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n", f.name, f.help, f.name, f.typ)
		for _, lbl := range slices.Sorted(maps.Keys(f.series)) {
			s := f.series[lbl]
			if f.typ != "histogram" {
				fmt.Fprintf(w, "%s%s %s\n", f.name, braces(lbl), num(s.value))
				continue
			}
			var cum uint64
			for i, bound := range metricsBuckets {
				cum += s.counts[i]
				fmt.Fprintf(w, "%s_bucket%s %d\n", f.name, braces(join(lbl, labels("le", num(bound)))), cum)
			}
			fmt.Fprintf(w, "%s_bucket%s %d\n", f.name, braces(join(lbl, labels("le", "+Inf"))), s.count)
			fmt.Fprintf(w, "%s_sum%s %s\n%s_count%s %d\n", f.name, braces(lbl), num(s.sum), f.name, braces(lbl), s.count)
		}
	}
}

func braces(lbl string) string {
	if lbl == "" {
		return ""
	}
	return "{" + lbl + "}"
}

func join(a, b string) string {
	if a == "" {
		return b
	}
	return a + "," + b
}

func num(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

// serveMetrics listens on addr at once, so that a bad address fails the
// command before it takes the name, and serves m at /metrics until the
// returned stop is called.
func serveMetrics(addr string, m *metrics) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		m.write(w)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}
