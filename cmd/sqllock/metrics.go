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
	"sync"
	"time"

	"github.com/sqllock/sqllock/observe"
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
	buckets         []float64          // a histogram's bounds: metricsBuckets unless set
	series          map[string]*series // by the labels' text, "" for none
}

// fractionBuckets are the bounds of the lease left at a renewal as a
// fraction of the ttl, the otel module's: a keep-alive renews at about 2/3.
var fractionBuckets = []float64{0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.65, 0.7, 0.8, 0.9, 1}

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
	since    map[holdKey]time.Time // when each lease held now was taken
	changed  func()                // called after each change, outside mu; may be nil
}

type holdKey struct {
	name  string
	fence uint64
}

func newMetrics() *metrics {
	m := &metrics{families: make(map[string]*metric), since: make(map[holdKey]time.Time)}
	for _, f := range []metric{
		{name: "sqllock_acquire_duration_seconds", typ: "histogram", help: "How long each acquire call took, waits included."},
		{name: "sqllock_acquire_attempts_total", typ: "counter", help: "The acquire statements the acquire calls sent."},
		{name: "sqllock_lease_held", typ: "gauge", help: "The leases this process holds now."},
		{name: "sqllock_lease_duration_seconds", typ: "histogram", help: "How long each lease was held."},
		{name: "sqllock_lease_lost_total", typ: "counter", help: "Leases lost while held."},
		{name: "sqllock_lease_age_seconds", typ: "gauge", help: "How long the oldest lease held now has been held; 0 when none is."},
		{name: "sqllock_refresh_remaining_seconds", typ: "histogram", help: "How much of the lease was left when each renewal was sent."},
		{name: "sqllock_refresh_remaining_fraction", typ: "histogram", help: "The lease left when each renewal was sent, as a fraction of the ttl.", buckets: fractionBuckets},
		{name: "sqllock_run_start_time_seconds", typ: "gauge", help: "When sqllock run started, in seconds since the epoch."},
		{name: "sqllock_run_end_time_seconds", typ: "gauge", help: "When sqllock run ended, in seconds since the epoch."},
		{name: "sqllock_run_exit_status", typ: "gauge", help: "The status sqllock run exited with: the command's, or 75 held, 124 lease lost, 125 sqllock failed."},
		{name: "sqllock_statement_retries_total", typ: "counter", help: "Statements that failed in a way the Client retries."},
		{name: "sqllock_acquire_unknown_total", typ: "counter", help: "Acquires whose outcome stayed unknown, and deletes that settled one."},
		{name: "sqllock_wakeups_total", typ: "counter", help: "Waits on a wake-up channel that ended, and the channels turned off."},
	} {
		f.series = make(map[string]*series)
		if f.buckets == nil {
			f.buckets = metricsBuckets
		}
		m.families[f.name] = &f
	}
	// The counters and gauges read 0 from the start, not nothing, so that
	// an alert on an increase of the lost sees the first one.
	for _, name := range []string{"sqllock_lease_held", "sqllock_lease_lost_total", "sqllock_lease_age_seconds"} {
		m.families[name].series[""] = &series{}
	}
	for out := observe.OutcomeAcquired; out <= observe.OutcomeFailed; out++ {
		m.at("sqllock_acquire_attempts_total", labels("sqllock_outcome", out.String()))
	}
	for _, settled := range []string{"false", "true"} {
		m.at("sqllock_acquire_unknown_total", labels("sqllock_settled", settled))
	}
	for st := observe.WakeupGranted; st <= observe.WakeupOff; st++ {
		m.at("sqllock_wakeups_total", labels("sqllock_wakeup_state", st.String()))
	}
	m.set("sqllock_run_start_time_seconds", float64(time.Now().UnixMilli())/1000)
	return m
}

// set sets gauge name, without labels, to v.
func (m *metrics) set(name string, v float64) {
	m.mu.Lock()
	m.at(name, "").value = v
	m.mu.Unlock()
	m.change()
}

// change tells m.changed, if set, that m changed.
func (m *metrics) change() {
	if m.changed != nil {
		m.changed()
	}
}

// labels renders label pairs (name, value, ...) in the text format.
func labels(kv ...string) string { return promLabels(kv...) }

func (m *metrics) at(name, lbl string) *series {
	f := m.families[name]
	s := f.series[lbl]
	if s == nil {
		s = &series{}
		if f.typ == "histogram" {
			s.counts = make([]uint64, len(f.buckets)+1)
		}
		f.series[lbl] = s
	}
	return s
}

func (m *metrics) add(name, lbl string, v float64) {
	m.mu.Lock()
	m.at(name, lbl).value += v
	m.mu.Unlock()
	m.change()
}

func (m *metrics) observe(name, lbl string, d time.Duration) {
	m.observeValue(name, lbl, d.Seconds())
}

func (m *metrics) observeValue(name, lbl string, v float64) {
	m.mu.Lock()
	s := m.at(name, lbl)
	i, _ := slices.BinarySearch(m.families[name].buckets, v) // the first bound >= v
	s.counts[i]++
	s.sum += v
	s.count++
	m.mu.Unlock()
	m.change()
}

// hold notes the start (end false) or the end of a lease, for its age.
func (m *metrics) hold(e observe.HoldEvent, end bool) {
	m.mu.Lock()
	if end {
		delete(m.since, holdKey{e.Name, e.Fence})
	} else {
		m.since[holdKey{e.Name, e.Fence}] = time.Now()
	}
	m.mu.Unlock()
}

// observer reports the Client's events into m.
func (m *metrics) observer() observe.Observer {
	return observe.Observer{
		AcquireDone: func(e observe.AcquireEvent) {
			l := labels("sqllock_outcome", e.Outcome.String())
			m.observe("sqllock_acquire_duration_seconds", l, e.Wait)
			m.add("sqllock_acquire_attempts_total", l, float64(e.Attempts))
		},
		HoldStart: func(e observe.HoldEvent) {
			m.hold(e, false)
			m.add("sqllock_lease_held", "", 1)
		},
		HoldEnd: func(e observe.HoldEvent) {
			m.hold(e, true)
			m.add("sqllock_lease_held", "", -1)
			m.observe("sqllock_lease_duration_seconds", labels("sqllock_lease_end", e.End.String()), e.Held)
			if e.End == observe.HoldLost {
				m.add("sqllock_lease_lost_total", "", 1)
			}
		},
		Refreshed: func(e observe.RefreshEvent) {
			l := labels("sqllock_outcome", e.Outcome.String())
			m.observe("sqllock_refresh_remaining_seconds", l, max(e.Left, 0))
			if e.TTL > 0 {
				m.observeValue("sqllock_refresh_remaining_fraction", l, min(max(e.Left.Seconds()/e.TTL.Seconds(), 0), 1))
			}
		},
		Retried: func(e observe.RetryEvent) {
			m.add("sqllock_statement_retries_total", labels("sqllock_statement", e.Statement, "sqllock_outcome", e.Outcome.String()), 1)
		},
		Unknown: func(e observe.UnknownEvent) {
			m.add("sqllock_acquire_unknown_total", labels("sqllock_settled", strconv.FormatBool(e.Settled)), 1)
		},
		Wakeup: func(e observe.WakeupEvent) {
			m.add("sqllock_wakeups_total", labels("sqllock_wakeup_state", e.State.String()), 1)
		},
	}
}

// write writes every family with a series in the text format, in name
// order, each series with the labels of constant (text-format labels, ""
// for none) first.
func (m *metrics) write(w io.Writer, constant string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var oldest time.Duration
	for _, at := range m.since {
		oldest = max(oldest, time.Since(at))
	}
	m.at("sqllock_lease_age_seconds", "").value = oldest.Seconds()
	for _, name := range slices.Sorted(maps.Keys(m.families)) {
		f := m.families[name]
		if len(f.series) == 0 {
			continue
		}
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n", f.name, f.help, f.name, f.typ)
		for _, lbl := range slices.Sorted(maps.Keys(f.series)) {
			s := f.series[lbl]
			lbl := join(constant, lbl)
			if f.typ != "histogram" {
				fmt.Fprintf(w, "%s%s %s\n", f.name, braces(lbl), num(s.value))
				continue
			}
			var cum uint64
			for i, bound := range f.buckets {
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
	switch {
	case a == "":
		return b
	case b == "":
		return a
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
		m.write(w, "")
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}
