package sqllockotel

import (
	"context"
	"sync"
	"time"

	"github.com/sqllock/sqllock/observe"
	"go.opentelemetry.io/otel/metric"
)

// holds is what sqllock.lease.age reads: when each lease held now was
// taken, and the label values (the mapped lock names, "" for none) seen so
// far, so that a name whose leases all ended reads 0, not nothing.
type holds struct {
	mu    sync.Mutex
	since map[holdKey][]time.Time // a fence may repeat across a set's names
	seen  map[string]bool
}

type holdKey struct {
	name  string // the lock's, not the mapped one
	fence uint64
}

func newHolds() *holds {
	return &holds{since: make(map[holdKey][]time.Time), seen: map[string]bool{"": true}}
}

// see records label value v; it reports whether v is new.
func (h *holds) see(v string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.seen[v] {
		return false
	}
	h.seen[v] = true
	return true
}

func (h *holds) start(ev observe.HoldEvent, at time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	k := holdKey{ev.Name, ev.Fence}
	h.since[k] = append(h.since[k], at)
}

func (h *holds) end(ev observe.HoldEvent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	k := holdKey{ev.Name, ev.Fence}
	switch s := h.since[k]; len(s) {
	case 0:
	case 1:
		delete(h.since, k)
	default:
		h.since[k] = s[1:]
	}
}

// oldest returns, for each label value seen, the age at now of the oldest
// lease held under it, 0 when none is.
func (h *holds) oldest(now time.Time, label func(name string) string) map[string]time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	ages := make(map[string]time.Duration, len(h.seen))
	for v := range h.seen {
		ages[v] = 0
	}
	for k, starts := range h.since {
		v := label(k.name)
		for _, at := range starts {
			ages[v] = max(ages[v], now.Sub(at))
		}
	}
	return ages
}

// observeAge reports sqllock.lease.age at each collection.
func (o *observer) observeAge(_ context.Context, m metric.Float64Observer) error {
	for v, age := range o.holds.oldest(time.Now(), o.label) {
		m.Observe(age.Seconds(), o.attrsOf(v))
	}
	return nil
}
