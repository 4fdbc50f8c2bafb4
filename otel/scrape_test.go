package sqllockotel

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/testdsn"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// promSetup is a Client observed through the Prometheus exporter, served
// as a scrape would read it.
type promSetup struct {
	*setup
	url string
}

func newPromSetup(t *testing.T, dsn string, opts ...Option) *promSetup {
	t.Helper()
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	t.Cleanup(func() { mp.Shutdown(context.Background()) })
	s := newSetup(t, dsn, append([]Option{WithMeterProvider(mp)}, opts...)...)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(srv.Close)
	return &promSetup{setup: s, url: srv.URL}
}

// scraped is one scrape, parsed: the families by name.
type scraped map[string]*dto.MetricFamily

func (p *promSetup) scrape(t *testing.T) scraped {
	t.Helper()
	resp, err := http.Get(p.url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("the scrape does not parse: %v\n%s", err, body)
	}
	return fams
}

// value returns the value of the series of family name whose labels
// include those of kv (name, value, ...), and whether there is one; with
// several, their sum.
func (s scraped) value(name string, kv ...string) (float64, bool) {
	f := s[name]
	if f == nil {
		return 0, false
	}
	var sum float64
	found := false
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		match := true
		for i := 0; i+1 < len(kv); i += 2 {
			if have[kv[i]] != kv[i+1] {
				match = false
			}
		}
		if !match {
			continue
		}
		found = true
		switch {
		case m.Counter != nil:
			sum += m.Counter.GetValue()
		case m.Gauge != nil:
			sum += m.Gauge.GetValue()
		case m.Histogram != nil:
			sum += float64(m.Histogram.GetSampleCount())
		}
	}
	return sum, found
}

func (s scraped) want(t *testing.T, want float64, name string, kv ...string) {
	t.Helper()
	got, ok := s.value(name, kv...)
	switch {
	case !ok:
		t.Errorf("%s%v: not in the scrape, want %v", name, kv, want)
	case got != want:
		t.Errorf("%s%v: got %v, want %v", name, kv, got, want)
	}
}

// unnamed is the label set of a series without a lock name: only the
// exporter's otel_scope labels.
func unnamed(s scraped, name string) (float64, bool) {
	f := s[name]
	if f == nil {
		return 0, false
	}
	for _, m := range f.GetMetric() {
		named := false
		for _, l := range m.GetLabel() {
			named = named || l.GetName() == "sqllock_lock_name"
		}
		if !named {
			if m.Counter != nil {
				return m.Counter.GetValue(), true
			}
			return m.Gauge.GetValue(), true
		}
	}
	return 0, false
}

// Scraped by Prometheus, a fresh Client's counters read 0 before anything
// happens, a name's lease counters read 0 from its first acquire, and the
// lost counter reads 1 after a real lease is lost: so increase() over a
// window sees the first loss. The lease age grows while a lease is held,
// and a renewal's lease left shows as a fraction of the ttl.
func TestPrometheus_firstLossScraped(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, srv testdsn.Server) {
		p := newPromSetup(t, srv.DSN, WithLockNames(func(n string) string { return n }))
		ctx := t.Context()

		s := p.scrape(t)
		for _, name := range []string{"sqllock_lease_lost_total", "sqllock_lease_held", "sqllock_lease_age_seconds"} {
			if v, ok := unnamed(s, name); !ok || v != 0 {
				t.Errorf("%s before any lease: got %v (present %v), want 0", name, v, ok)
			}
		}
		s.want(t, 0, "sqllock_acquire_attempts_total", "sqllock_outcome", "acquired")
		s.want(t, 0, "sqllock_acquire_attempts_total", "sqllock_outcome", "held")
		s.want(t, 0, "sqllock_acquire_unknown_total", "sqllock_settled", "false")
		s.want(t, 0, "sqllock_wakeups_total", "sqllock_wakeup_state", "granted")
		s.want(t, 0, "sqllock_statement_retries_total", "sqllock_statement", "acquire", "sqllock_outcome", "rolled_back")
		s.want(t, 0, "sqllock_statement_retries_total", "sqllock_statement", "frozen_holder", "sqllock_outcome", "refused")

		// Long enough for a renewal to get through on a loaded machine: at
		// 900 ms each had 225 ms, and at a load average of 25 none did
		// before the keep-alive gave the lease up.
		const ttl = 3 * time.Second
		l, err := p.c.TryAcquire(ctx, "job", ttl)
		if err != nil {
			t.Fatal(err)
		}
		kctx := l.KeepAlive(ctx)
		// Wait for the renewal as the scrape shows it: the Lock's
		// ValidUntil moves before the Observer is told, and under load
		// a scrape between the two saw no renewal (CI, mysql-9.7).
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			s = p.scrape(t)
			if n, _ := s.value("sqllock_refresh_remaining_fraction", "sqllock_outcome", "acquired"); n >= 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("no renewal scraped in 10s")
			}
		}
		s.want(t, 0, "sqllock_lease_lost_total", "sqllock_lock_name", "job")
		s.want(t, 1, "sqllock_lease_held", "sqllock_lock_name", "job")
		if age, _ := s.value("sqllock_lease_age_seconds", "sqllock_lock_name", "job"); age <= 0 || age > 60 {
			t.Errorf("sqllock_lease_age_seconds of a lease held since the renewal: got %v, want in (0, 60]", age)
		}
		if n, _ := s.value("sqllock_refresh_remaining_fraction", "sqllock_outcome", "acquired"); n < 1 {
			t.Errorf("renewals in sqllock_refresh_remaining_fraction: got %v, want at least 1", n)
		}
		// On time, a keep-alive renews with about 2/3 of the lease left:
		// the fraction's sum is between 0 and 1 per renewal.
		f := s["sqllock_refresh_remaining_fraction"].GetMetric()[0].GetHistogram()
		if avg := f.GetSampleSum() / float64(f.GetSampleCount()); avg <= 0 || avg > 1 {
			t.Errorf("sqllock_refresh_remaining_fraction's mean: got %v, want in (0, 1]", avg)
		}

		// Another owner takes the lease over, as an expiry and another
		// host's acquire, or an operator's force release, would.
		if _, err := p.db.ExecContext(ctx, "UPDATE `"+p.table+"` SET owner = 'someone else' WHERE name = 'job' AND kind = 'L'"); err != nil {
			t.Fatal(err)
		}
		select {
		case <-kctx.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("the keep-alive's context is live 10s after the takeover")
		}
		s = p.scrape(t)
		s.want(t, 1, "sqllock_lease_lost_total", "sqllock_lock_name", "job")
		s.want(t, 0, "sqllock_lease_held", "sqllock_lock_name", "job")
		s.want(t, 0, "sqllock_lease_age_seconds", "sqllock_lock_name", "job")
		if v, _ := unnamed(s, "sqllock_lease_lost_total"); v != 0 {
			t.Errorf("sqllock_lease_lost_total without a name: got %v, want 0 (the loss has its name)", v)
		}
		// Every series the dashboard reads is there, now that each kind of
		// event has happened once.
		checkDashboard(t, s)
	})
}

// Every acquire is scraped alike (issue 43): Once's acquire, and each
// attempt of an Elect campaign, a candidate's while another leads and the
// one that takes the lead, count in the acquire series as TryAcquire's do.
// Before, a service that only campaigned showed its acquire attempts at 0.
func TestPrometheus_electAndOnceScraped(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, srv testdsn.Server) {
		p := newPromSetup(t, srv.DSN, WithLockNames(func(n string) string { return n }))
		ctx := t.Context()

		if ran, err := p.c.Once(ctx, "once", func(context.Context, *sqllock.Lock) error { return nil }); !ran || err != nil {
			t.Fatalf("Once: got %v, %v, want true, nil", ran, err)
		}
		s := p.scrape(t)
		s.want(t, 1, "sqllock_acquire_attempts_total", "sqllock_lock_name", "once", "sqllock_outcome", "acquired")
		s.want(t, 1, "sqllock_acquire_duration_seconds", "sqllock_lock_name", "once", "sqllock_outcome", "acquired")

		// Another Client leads first, so that the campaign's attempts meet
		// its lease, then gives the lead up.
		const ttl = 3 * time.Second
		held, err := p.other.TryAcquire(ctx, "leader", ttl)
		if err != nil {
			t.Fatal(err)
		}
		ectx, cancel := context.WithCancel(ctx)
		led := make(chan struct{})
		elected := make(chan error, 1)
		go func() {
			elected <- p.c.Elect(ectx, "leader", ttl, sqllock.Callbacks{
				OnStartedLeading: func(ctx context.Context, _ *sqllock.Lock) error {
					close(led)
					<-ctx.Done()
					return nil
				},
			})
		}()
		defer func() {
			cancel()
			<-elected
		}()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			s = p.scrape(t)
			if n, _ := s.value("sqllock_acquire_attempts_total", "sqllock_lock_name", "leader", "sqllock_outcome", "held"); n >= 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("no campaign attempt scraped in 30s while another Client led")
			}
		}
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case <-led:
		case err := <-elected:
			t.Fatalf("Elect returned %v before leading", err)
		case <-time.After(30 * time.Second):
			t.Fatal("the campaign did not lead within 30s of the release")
		}
		s = p.scrape(t)
		// One statement: the attempt that took the lead, not the campaign's.
		s.want(t, 1, "sqllock_acquire_attempts_total", "sqllock_lock_name", "leader", "sqllock_outcome", "acquired")
		s.want(t, 1, "sqllock_acquire_duration_seconds", "sqllock_lock_name", "leader", "sqllock_outcome", "acquired")
		s.want(t, 1, "sqllock_lease_held", "sqllock_lock_name", "leader")
	})
}
