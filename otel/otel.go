// Package sqllockotel reports what a sqllock Client does as OpenTelemetry
// metrics and traces: [NewObserver] returns a [observe.Observer] to pass to
// [sqllock.WithObserver].
//
//	obs, err := sqllockotel.NewObserver() // the global providers
//	locks, err := sqllock.New(db, sqllock.WithObserver(obs))
//
// The instruments, all under the meter "github.com/sqllock/sqllock/otel":
//
//   - sqllock.acquire.duration (histogram, s): how long each TryAcquire or
//     Acquire call (also Do's and Once's) and each attempt of an Elect
//     campaign took, waits included, by sqllock.outcome
//     (acquired, held, canceled, closed, rolled_back, broken, refused,
//     failed);
//   - sqllock.acquire.attempts (counter, {attempt}): the acquire statements
//     those calls sent, by sqllock.outcome;
//   - sqllock.lease.held (up-down counter, {lease}): the leases this process
//     holds now;
//   - sqllock.lease.duration (histogram, s): how long each lease was held,
//     by sqllock.lease.end (released, lost, lapsed, closed);
//   - sqllock.lease.lost (counter, {lease}): leases lost while held, the one
//     to alert on: work ran on without its lock, or was stopped;
//   - sqllock.lease.age (gauge, s): how long the oldest lease held now
//     has been held, 0 when none is: a lease held far longer than its job
//     takes is stuck;
//   - sqllock.refresh.remaining (histogram, s): how much of the lease was
//     left when each renewal was sent, by sqllock.outcome (acquired:
//     renewed, held: found lost, or an error's);
//   - sqllock.refresh.remaining.fraction (histogram, 1): the same as a
//     fraction of the ttl renewed for, the same for every ttl: a keep-alive
//     sends at about 2/3, so values near 0 (0: the lease could have
//     expired) mean renewals run late;
//   - sqllock.statement.retries (counter, {retry}): statements that failed
//     in a way the Client retries, by sqllock.statement and sqllock.outcome
//     (rolled_back, broken); and, as sqllock.statement frozen_holder, each
//     acquire that met a holder's transaction keeping the lease row locked
//     after the lease ended (a process stopped inside Lock.Check) and ended
//     it (rolled_back) or could not (refused: see the Client's warning);
//   - sqllock.acquire.unknown (counter, {acquire}): acquires whose outcome
//     stayed unknown (sqllock.settled false) and deletes that settled one
//     (true);
//   - sqllock.wakeups (counter, {wakeup}): waits on a wake-up channel that
//     ended, by sqllock.wakeup.state (granted, timed_out, failed), and the
//     Client turning its channels off (off).
//
// Every counter and the gauges read 0 from [NewObserver] on, for each
// value of their attributes an alert is written on (the lease counters
// for each lock name [WithLockNames] maps to, from the name's first
// acquire on), so that increase() over a window sees the first lease lost
// and a dashboard shows 0, not "no data". Histograms appear with their
// first measurement.
//
// Lock names may be unbounded (a name per user or per job run), and every
// distinct attribute value is a time series a metrics backend keeps: so
// metrics carry no lock name unless [WithLockNames] says how to map names
// to a bounded set. Spans, which are not aggregated, always carry it.
//
// Each acquire call is a span, "sqllock.acquire", from the call's start to
// its return, a child of the span in the call's context, with the name,
// the outcome, the attempts and the fence as attributes; a call that failed
// other than by finding the name held has an error status. The span is
// made when the call returns, with the call's start as its start time, so
// statements the call sent are not its children.
//
// It is a module of its own, so that the sqllock library depends on nothing
// outside the standard library.
package sqllockotel

import (
	"context"
	"errors"
	"time"

	"github.com/sqllock/sqllock/observe"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the name of the meter and the tracer.
const ScopeName = "github.com/sqllock/sqllock/otel"

// Attribute keys.
const (
	KeyLockName  = attribute.Key("sqllock.lock.name")
	KeyOutcome   = attribute.Key("sqllock.outcome")
	KeyLeaseEnd  = attribute.Key("sqllock.lease.end")
	KeyStatement = attribute.Key("sqllock.statement")
	KeySettled   = attribute.Key("sqllock.settled")
	KeyWakeup    = attribute.Key("sqllock.wakeup.state")
	KeyAttempts  = attribute.Key("sqllock.attempts")
	KeyFence     = attribute.Key("sqllock.fence")
)

// An Option configures [NewObserver].
type Option func(*config)

type config struct {
	mp    metric.MeterProvider
	tp    trace.TracerProvider
	names func(string) string
}

// WithMeterProvider makes the observer take its meter from mp instead of
// otel.GetMeterProvider().
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.mp = mp }
}

// WithTracerProvider makes the observer take its tracer from tp instead of
// otel.GetTracerProvider().
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tp = tp }
}

// WithLockNames adds sqllock.lock.name to the metrics of one lock, with the
// value f returns for its name; "" leaves the attribute off. f must map the
// names the process uses to a small set: each value is a time series of
// its own in each metric. For a fixed set of job names,
// func(n string) string { return n } will do; for names with an id in them,
// cut the id off.
func WithLockNames(f func(name string) string) Option {
	return func(c *config) { c.names = f }
}

// NewObserver returns an Observer that records a Client's events as the
// package documents. It fails only if an instrument cannot be made.
func NewObserver(opts ...Option) (observe.Observer, error) {
	cfg := config{mp: otel.GetMeterProvider(), tp: otel.GetTracerProvider()}
	for _, opt := range opts {
		opt(&cfg)
	}
	o, err := newObserver(cfg)
	if err != nil {
		return observe.Observer{}, err
	}
	return observe.Observer{
		AcquireDone: o.acquireDone,
		HoldStart:   o.holdStart,
		HoldEnd:     o.holdEnd,
		Refreshed:   o.refreshed,
		Retried:     o.retried,
		Unknown:     o.unknown,
		Wakeup:      o.wakeup,
	}, nil
}

// secondsBuckets are the histograms' bounds, in seconds: from a fast
// acquire's round trip (about a millisecond) to a wait of minutes.
var secondsBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600}

type observer struct {
	names    func(string) string
	holds    *holds
	tracer   trace.Tracer
	acquire  metric.Float64Histogram
	attempts metric.Int64Counter
	held     metric.Int64UpDownCounter
	leaseDur metric.Float64Histogram
	lost     metric.Int64Counter
	refresh  metric.Float64Histogram
	fraction metric.Float64Histogram
	retries  metric.Int64Counter
	unknowns metric.Int64Counter
	wakeups  metric.Int64Counter
}

func newObserver(cfg config) (*observer, error) {
	m := cfg.mp.Meter(ScopeName)
	o := &observer{names: cfg.names, holds: newHolds(), tracer: cfg.tp.Tracer(ScopeName)}
	var errs [11]error
	seconds := metric.WithExplicitBucketBoundaries(secondsBuckets...)
	o.acquire, errs[0] = m.Float64Histogram("sqllock.acquire.duration", metric.WithUnit("s"), seconds,
		metric.WithDescription("How long acquire calls took, waits included."))
	o.attempts, errs[1] = m.Int64Counter("sqllock.acquire.attempts", metric.WithUnit("{attempt}"),
		metric.WithDescription("Acquire statements sent by acquire calls."))
	o.held, errs[2] = m.Int64UpDownCounter("sqllock.lease.held", metric.WithUnit("{lease}"),
		metric.WithDescription("Leases held now."))
	o.leaseDur, errs[3] = m.Float64Histogram("sqllock.lease.duration", metric.WithUnit("s"), seconds,
		metric.WithDescription("How long leases were held, by how they ended."))
	o.lost, errs[4] = m.Int64Counter("sqllock.lease.lost", metric.WithUnit("{lease}"),
		metric.WithDescription("Leases lost while held."))
	o.refresh, errs[5] = m.Float64Histogram("sqllock.refresh.remaining", metric.WithUnit("s"), seconds,
		metric.WithDescription("Lease left when a renewal was sent."))
	o.retries, errs[6] = m.Int64Counter("sqllock.statement.retries", metric.WithUnit("{retry}"),
		metric.WithDescription("Statements that failed in a way that is retried."))
	o.unknowns, errs[7] = m.Int64Counter("sqllock.acquire.unknown", metric.WithUnit("{acquire}"),
		metric.WithDescription("Acquires whose outcome stayed unknown, and those settled."))
	o.wakeups, errs[8] = m.Int64Counter("sqllock.wakeups", metric.WithUnit("{wakeup}"),
		metric.WithDescription("Waits on wake-up channels that ended, by how."))
	o.fraction, errs[9] = m.Float64Histogram("sqllock.refresh.remaining.fraction", metric.WithUnit("1"),
		metric.WithExplicitBucketBoundaries(fractionBuckets...),
		metric.WithDescription("Lease left when a renewal was sent, as a fraction of the ttl."))
	_, errs[10] = m.Float64ObservableGauge("sqllock.lease.age", metric.WithUnit("s"),
		metric.WithDescription("How long the oldest lease held now has been held; 0 when none is."),
		metric.WithFloat64Callback(o.observeAge))
	if err := errors.Join(errs[:]...); err != nil {
		return nil, err
	}
	o.zeros()
	return o, nil
}

// fractionBuckets are sqllock.refresh.remaining.fraction's bounds: a
// keep-alive renews at about 2/3 of the ttl left.
var fractionBuckets = []float64{0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.65, 0.7, 0.8, 0.9, 1}

// retriedStatements are the statements whose retries read 0 from the
// start: those of a lock's acquire, renewal and release.
var retriedStatements = []string{"acquire", "refresh", "release"}

// zeros makes every counter and gauge read 0 before its first event: the
// lease counters without a lock name, and the others for each value of
// their attributes.
func (o *observer) zeros() {
	ctx := context.Background()
	o.nameZeros("")
	for out := observe.OutcomeAcquired; out <= observe.OutcomeFailed; out++ {
		o.attempts.Add(ctx, 0, o.attrsOf("", KeyOutcome.String(out.String())))
	}
	for _, stmt := range retriedStatements {
		for _, out := range []observe.Outcome{observe.OutcomeRolledBack, observe.OutcomeBroken} {
			o.retries.Add(ctx, 0, o.attrsOf("", KeyStatement.String(stmt), KeyOutcome.String(out.String())))
		}
	}
	for _, out := range []observe.Outcome{observe.OutcomeRolledBack, observe.OutcomeRefused} {
		o.retries.Add(ctx, 0, o.attrsOf("", KeyStatement.String("frozen_holder"), KeyOutcome.String(out.String())))
	}
	for _, settled := range []bool{false, true} {
		o.unknowns.Add(ctx, 0, o.attrsOf("", KeySettled.Bool(settled)))
	}
	for st := observe.WakeupGranted; st <= observe.WakeupOff; st++ {
		o.wakeups.Add(ctx, 0, o.attrsOf("", KeyWakeup.String(st.String())))
	}
}

// nameZeros makes the lease counters of label value v read 0.
func (o *observer) nameZeros(v string) {
	ctx := context.Background()
	o.held.Add(ctx, 0, o.attrsOf(v))
	o.lost.Add(ctx, 0, o.attrsOf(v))
}

// seen makes the lease counters of lock name's label value read 0 the
// first time it is seen.
func (o *observer) seen(name string) {
	if v := o.label(name); v != "" && o.holds.see(v) {
		o.nameZeros(v)
	}
}

// label is the value of sqllock.lock.name for lock name: "" for none.
func (o *observer) label(name string) string {
	if o.names == nil {
		return ""
	}
	return o.names(name)
}

// attrs is the attribute set of a metric of lock name with extra.
func (o *observer) attrs(name string, extra ...attribute.KeyValue) metric.MeasurementOption {
	return o.attrsOf(o.label(name), extra...)
}

// attrsOf is the attribute set of a metric with label value v and extra.
func (o *observer) attrsOf(v string, extra ...attribute.KeyValue) metric.MeasurementOption {
	if v != "" {
		extra = append(extra, KeyLockName.String(v))
	}
	return metric.WithAttributes(extra...)
}

func (o *observer) acquireDone(ev observe.AcquireEvent) {
	ctx := ev.Ctx
	if ctx == nil {
		ctx = context.Background()
	}
	o.seen(ev.Name)
	outcome := KeyOutcome.String(ev.Outcome.String())
	o.acquire.Record(ctx, ev.Wait.Seconds(), o.attrs(ev.Name, outcome))
	o.attempts.Add(ctx, int64(ev.Attempts), o.attrs(ev.Name, outcome))

	_, span := o.tracer.Start(ctx, "sqllock.acquire", trace.WithTimestamp(ev.Start),
		trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(KeyLockName.String(ev.Name), outcome, KeyAttempts.Int(ev.Attempts)))
	if ev.Fence != 0 {
		span.SetAttributes(KeyFence.Int64(int64(ev.Fence)))
	}
	if ev.Err != nil && ev.Outcome != observe.OutcomeHeld {
		span.SetStatus(codes.Error, ev.Err.Error())
	}
	span.End(trace.WithTimestamp(ev.Start.Add(ev.Wait)))
}

func (o *observer) holdStart(ev observe.HoldEvent) {
	o.seen(ev.Name)
	o.holds.start(ev, time.Now())
	o.held.Add(context.Background(), 1, o.attrs(ev.Name))
}

func (o *observer) holdEnd(ev observe.HoldEvent) {
	ctx := context.Background()
	o.holds.end(ev)
	o.held.Add(ctx, -1, o.attrs(ev.Name))
	o.leaseDur.Record(ctx, ev.Held.Seconds(), o.attrs(ev.Name, KeyLeaseEnd.String(ev.End.String())))
	if ev.End == observe.HoldLost {
		o.lost.Add(ctx, 1, o.attrs(ev.Name))
	}
}

func (o *observer) refreshed(ev observe.RefreshEvent) {
	// A renewal sent after the lease could have expired counts as 0: a
	// histogram takes no negative values.
	ctx, attrs := context.Background(), o.attrs(ev.Name, KeyOutcome.String(ev.Outcome.String()))
	o.refresh.Record(ctx, max(ev.Left.Seconds(), 0), attrs)
	if ev.TTL > 0 {
		o.fraction.Record(ctx, min(max(ev.Left.Seconds()/ev.TTL.Seconds(), 0), 1), attrs)
	}
}

func (o *observer) retried(ev observe.RetryEvent) {
	o.retries.Add(context.Background(), 1, o.attrs(ev.Name,
		KeyStatement.String(ev.Statement), KeyOutcome.String(ev.Outcome.String())))
}

func (o *observer) unknown(ev observe.UnknownEvent) {
	o.unknowns.Add(context.Background(), 1, o.attrs(ev.Name, KeySettled.Bool(ev.Settled)))
}

func (o *observer) wakeup(ev observe.WakeupEvent) {
	o.wakeups.Add(context.Background(), 1, o.attrs(ev.Name, KeyWakeup.String(ev.State.String())))
}
