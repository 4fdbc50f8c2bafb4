package sqllockotel

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"os"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/testdsn"
	"github.com/sqllock/sqllock/observe"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// setup is a Client on a fresh table, observed through an in-memory metric
// reader and span recorder, and a second Client on the table, unobserved.
type setup struct {
	db     *sql.DB
	table  string
	c      *sqllock.Client
	other  *sqllock.Client
	reader *sdkmetric.ManualReader
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
}

func newSetup(t *testing.T, dsn string, opts ...Option) *setup {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	var b [4]byte
	_, _ = rand.Read(b[:])
	s := &setup{db: db, table: "otel_" + hex.EncodeToString(b[:]), reader: sdkmetric.NewManualReader(),
		spans: tracetest.NewSpanRecorder()}
	t.Cleanup(func() { db.Exec("DROP TABLE IF EXISTS `" + s.table + "`") })
	s.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(s.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(s.reader))
	obs, err := NewObserver(append([]Option{WithMeterProvider(mp), WithTracerProvider(s.tp)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if s.c, err = sqllock.New(db, sqllock.WithTable(s.table), sqllock.WithObserver(obs)); err != nil {
		t.Fatal(err)
	}
	if s.other, err = sqllock.New(db, sqllock.WithTable(s.table)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.c.Close(); s.other.Close() }) // before the table is dropped
	if err := s.c.CreateTable(t.Context()); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *setup) collect(t *testing.T) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := s.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	return rm
}

func find(rm metricdata.ResourceMetrics, name string) (metricdata.Metrics, bool) {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m, true
			}
		}
	}
	return metricdata.Metrics{}, false
}

// count returns the number of measurements of histogram name, or the sum of
// counter name, whose attributes include kv.
func count(t *testing.T, rm metricdata.ResourceMetrics, name string, kv ...attribute.KeyValue) int64 {
	t.Helper()
	m, ok := find(rm, name)
	if !ok {
		return 0
	}
	match := func(set attribute.Set) bool {
		for _, want := range kv {
			if got, ok := set.Value(want.Key); !ok || got != want.Value {
				return false
			}
		}
		return true
	}
	var n int64
	switch d := m.Data.(type) {
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			if match(p.Attributes) {
				n += int64(p.Count)
			}
		}
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			if match(p.Attributes) {
				n += p.Value
			}
		}
	default:
		t.Fatalf("%s: unexpected data %T", name, m.Data)
	}
	return n
}

func wantCount(t *testing.T, rm metricdata.ResourceMetrics, want int64, name string, kv ...attribute.KeyValue) {
	t.Helper()
	if got := count(t, rm, name, kv...); got != want {
		t.Errorf("%s %v: got %d, want %d", name, kv, got, want)
	}
}

// A scripted run: two leases taken and one refused, a Do, a lease lost
// under KeepAlive, then Close with one lease held. Every number the
// metrics and spans report is what the run did.
func TestObserver_scripted(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, srv testdsn.Server) {
		s := newSetup(t, srv.DSN)
		tracer := s.tp.Tracer("test")
		ctx, parent := tracer.Start(t.Context(), "test")

		a, err := s.c.TryAcquire(ctx, "a", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.other.TryAcquire(ctx, "b", time.Minute); err != nil {
			t.Fatal(err)
		}
		_, err = s.c.TryAcquire(ctx, "b", time.Minute)
		if !errors.Is(err, sqllock.ErrNotAcquired) {
			t.Fatalf("TryAcquire of a held name: got %v, want ErrNotAcquired", err)
		}
		if err := s.c.Do(ctx, "c", time.Minute, func(_ context.Context, _ *sqllock.Lock) error { return nil }); err != nil {
			t.Fatal(err)
		}
		rm := s.collect(t)
		outcome := func(o observe.Outcome) attribute.KeyValue { return KeyOutcome.String(o.String()) }
		wantCount(t, rm, 2, "sqllock.acquire.duration", outcome(observe.OutcomeAcquired))
		wantCount(t, rm, 1, "sqllock.acquire.duration", outcome(observe.OutcomeHeld))
		wantCount(t, rm, 3, "sqllock.acquire.attempts")
		wantCount(t, rm, 1, "sqllock.lease.held")
		wantCount(t, rm, 1, "sqllock.lease.duration", KeyLeaseEnd.String("released"))
		wantCount(t, rm, 0, "sqllock.lease.lost")

		// A lease taken over under its keep-alive. Each renewal has ttl/4
		// to answer: with 600 ms, a loaded machine (the tests of several
		// packages beside it) timed the first one out and the lease lapsed
		// before any renewal had passed.
		const ttl = 3 * time.Second
		d, err := s.c.TryAcquire(ctx, "d", ttl)
		if err != nil {
			t.Fatal(err)
		}
		acquired := d.ValidUntil()
		kctx := d.KeepAlive(ctx)
		for deadline := time.Now().Add(10 * time.Second); !d.ValidUntil().After(acquired); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("no renewal in 10s")
			}
		}
		if _, err := s.db.ExecContext(ctx, "UPDATE `"+s.table+"` SET owner = 'someone else' WHERE name = 'd' AND kind = 'L'"); err != nil {
			t.Fatal(err)
		}
		select {
		case <-kctx.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("the keep-alive's context is live 10s after the takeover")
		}
		rm = s.collect(t)
		wantCount(t, rm, 1, "sqllock.lease.lost")
		wantCount(t, rm, 1, "sqllock.lease.duration", KeyLeaseEnd.String("lost"))
		wantCount(t, rm, 1, "sqllock.lease.held") // "a"
		wantCount(t, rm, 1, "sqllock.refresh.remaining", outcome(observe.OutcomeHeld))
		if n := count(t, rm, "sqllock.refresh.remaining", outcome(observe.OutcomeAcquired)); n < 1 {
			t.Errorf("renewals recorded: got %d, want at least 1", n)
		}
		if m, _ := find(rm, "sqllock.lease.lost"); m.Unit != "{lease}" {
			t.Errorf("sqllock.lease.lost's unit: got %q, want {lease}", m.Unit)
		}
		if m, _ := find(rm, "sqllock.acquire.duration"); m.Unit != "s" {
			t.Errorf("sqllock.acquire.duration's unit: got %q, want s", m.Unit)
		}

		if err := s.c.Close(); err != nil {
			t.Fatal(err)
		}
		rm = s.collect(t)
		wantCount(t, rm, 0, "sqllock.lease.held")
		wantCount(t, rm, 1, "sqllock.lease.duration", KeyLeaseEnd.String("closed"))
		// No metric carries a lock name unless WithLockNames says so.
		wantCount(t, rm, 0, "sqllock.acquire.duration", KeyLockName.String("a"))
		_ = a

		parent.End()
		var acquires []sdktrace.ReadOnlySpan
		for _, sp := range s.spans.Ended() {
			if sp.Name() == "sqllock.acquire" {
				acquires = append(acquires, sp)
			}
		}
		if len(acquires) != 4 {
			t.Fatalf("acquire spans: got %d, want 4", len(acquires))
		}
		wantNames := []string{"a", "b", "c", "d"}
		for i, sp := range acquires {
			attrs := attribute.NewSet(sp.Attributes()...)
			if v, _ := attrs.Value(KeyLockName); v.AsString() != wantNames[i] {
				t.Errorf("span %d's name: got %q, want %q", i, v.AsString(), wantNames[i])
			}
			if sp.Parent().SpanID() != parent.SpanContext().SpanID() {
				t.Errorf("span %d's parent: got %v, want the test's span", i, sp.Parent().SpanID())
			}
			if sp.Status().Code == codes.Error {
				t.Errorf("span %d: got an error status, want none (held is not an error)", i)
			}
			if !sp.EndTime().After(sp.StartTime()) {
				t.Errorf("span %d: ends at %v, not after its start %v", i, sp.EndTime(), sp.StartTime())
			}
		}
		refused := attribute.NewSet(acquires[1].Attributes()...)
		if v, _ := refused.Value(KeyOutcome); v.AsString() != "held" {
			t.Errorf("span of the refused acquire: outcome %q, want held", v.AsString())
		}
	})
}

// WithLockNames puts the name it maps to on the metrics; "" leaves it off.
func TestWithLockNames(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, srv testdsn.Server) {
		s := newSetup(t, srv.DSN, WithLockNames(func(n string) string {
			if n == "secret" {
				return ""
			}
			return "job-" + n
		}))
		ctx := t.Context()
		for _, n := range []string{"x", "secret"} {
			l, err := s.c.TryAcquire(ctx, n, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		rm := s.collect(t)
		wantCount(t, rm, 1, "sqllock.acquire.duration", KeyLockName.String("job-x"))
		wantCount(t, rm, 2, "sqllock.acquire.duration")
		wantCount(t, rm, 1, "sqllock.lease.duration", KeyLockName.String("job-x"), KeyLeaseEnd.String("released"))
		m, _ := find(rm, "sqllock.acquire.duration")
		for _, p := range m.Data.(metricdata.Histogram[float64]).DataPoints {
			if v, ok := p.Attributes.Value(KeyLockName); ok && v.AsString() != "job-x" {
				t.Errorf("a data point named %q, want only job-x", v.AsString())
			}
		}
	})
}

// The events a real server cannot be made to give on demand (a retried
// deadlock, an unknown outcome, wake-ups) land on their instruments with
// their attributes. No server: the Observer's funcs are called directly.
func TestObserver_eventsWithoutServer(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	obs, err := NewObserver(WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	if err != nil {
		t.Fatal(err)
	}
	obs.Retried(observe.RetryEvent{Statement: "acquire", Name: "n", Outcome: observe.OutcomeRolledBack})
	obs.Retried(observe.RetryEvent{Statement: "refresh", Name: "n", Outcome: observe.OutcomeBroken})
	obs.Unknown(observe.UnknownEvent{Name: "n"})
	obs.Unknown(observe.UnknownEvent{Name: "n", Settled: true})
	obs.Unknown(observe.UnknownEvent{Name: "n", Settled: true})
	obs.Wakeup(observe.WakeupEvent{Name: "n", State: observe.WakeupGranted, Wait: time.Second})
	obs.Wakeup(observe.WakeupEvent{State: observe.WakeupOff})
	obs.Refreshed(observe.RefreshEvent{Name: "n", Left: -time.Second, Outcome: observe.OutcomeHeld})
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	wantCount(t, rm, 1, "sqllock.statement.retries", KeyStatement.String("acquire"), KeyOutcome.String("rolled_back"))
	wantCount(t, rm, 1, "sqllock.statement.retries", KeyStatement.String("refresh"), KeyOutcome.String("broken"))
	wantCount(t, rm, 1, "sqllock.acquire.unknown", KeySettled.Bool(false))
	wantCount(t, rm, 2, "sqllock.acquire.unknown", KeySettled.Bool(true))
	wantCount(t, rm, 1, "sqllock.wakeups", KeyWakeup.String("granted"))
	wantCount(t, rm, 1, "sqllock.wakeups", KeyWakeup.String("off"))
	// A renewal sent after the lease could have expired counts as 0.
	m, _ := find(rm, "sqllock.refresh.remaining")
	if p := m.Data.(metricdata.Histogram[float64]).DataPoints; len(p) != 1 || p[0].Sum != 0 || p[0].Count != 1 {
		t.Errorf("sqllock.refresh.remaining: got %+v, want one measurement of 0", p)
	}
}

func TestMain(m *testing.M) {
	testdsn.QuietDriver()
	testdsn.Parallel() // several tests at once on every server
	os.Exit(m.Run())
}
