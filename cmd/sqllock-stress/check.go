package main

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
)

// A record is one critical section: a holder that acquired a name, as a
// child process reports it to the parent. Times are the server's clock
// (UTC_TIMESTAMP(6)) in microseconds since 1970.
type record struct {
	Proc      int    `json:"p"`
	Goroutine int    `json:"g"`
	Name      string `json:"n"`
	Fence     uint64 `json:"f"`
	// Start and End are read by a SELECT after the acquire and before the
	// release; 0 when the section ended in an error before it read them.
	Start int64 `json:"s"`
	End   int64 `json:"e"`
	// Expiry is the lease's expiry as the server held it: the expires_at of
	// the holder's own row read at Start, or at End when the row was still
	// the holder's then (a refresh only extends a live lease, so the lease
	// was live throughout). When the row was not the holder's at Start, it
	// is the holder's belief (Lock.ValidUntil) mapped onto the server's
	// clock, conservatively.
	Expiry int64 `json:"x"`
	// Acquired is when the acquire returned, on this machine's clock (µs
	// since 1970): a fault run counts the sections under way at the fault.
	Acquired int64 `json:"ac,omitempty"`
	// Belief is the latest Lock.ValidUntil the holder had, after its
	// acquire or a refresh: until when it believed it held the name, on
	// this machine's clock, which the servers on it share (0: unknown).
	Belief int64 `json:"b,omitempty"`
	// KeepAliveLost: with -keepalive, the keep-alive's context had ended
	// (the loss reported) when the section read End.
	KeepAliveLost bool `json:"kl,omitempty"`
	// Stalled holders slept past their lease without refreshing.
	Stalled bool `json:"st,omitempty"`
	// Accepted and Rejected count the holder's protected writes.
	Accepted int `json:"a"`
	Rejected int `json:"r"`
	// Conflicts counts attempts of writes the server rolled back for a
	// conflict with another writer (not applied, sent again); Maybe, writes
	// whose outcome is unknown (the connection broke: applied or not).
	Conflicts int `json:"c,omitempty"`
	Maybe     int `json:"m,omitempty"`
	// Err is the class of the error that ended the section early, if one
	// did. Such a section is checked all the same, for as long as it was
	// live.
	Err string `json:"err,omitempty"`
	// TakenOver: Release reported ErrNotHeld, so the next holder of the
	// name took the lease over before it was released.
	TakenOver bool `json:"to,omitempty"`
	// Released is when the holder of a section an error cut short called
	// Release, on this machine's clock (µs since 1970), which the servers
	// on it share: it worked under the lease no longer, whether or not the
	// release reached the server (0: not cut short).
	Released int64 `json:"rl,omitempty"`
}

// end is when the section ended as its holder saw it: End, or when it
// released the lease after an error cut it short; 0 when neither is known.
func (r record) end() int64 {
	if r.End != 0 {
		return r.End
	}
	return r.Released
}

// live returns the part of the critical section during which the holder's
// lease was live by the server's clock, and false when there was none or
// its start is unknown. A section cut short by an error before it read the
// clock again ends when its holder released the lease, or when the lease
// expired if it did not: the holder may have gone on working until then.
func (r record) live() (from, to int64, ok bool) {
	if r.Start == 0 {
		return 0, 0, false
	}
	to = r.Expiry
	if end := r.end(); end != 0 {
		to = min(end, r.Expiry)
	}
	return r.Start, to, to > r.Start
}

// A childReport ends each child's output: its counters, and the errors it
// did not expect.
type childReport struct {
	Done     bool `json:"done"`
	Attempts int  `json:"attempts"`
	Refused  int  `json:"refused"`
	Refresh  int  `json:"refreshes"`
	// Classes counts the errors operations returned, by operation and
	// class ("acquire: Error 1213"); Errors keeps the first few in full.
	Classes map[string]int `json:"classes,omitempty"`
	Errors  []string       `json:"errors,omitempty"`
}

// findings is what check makes of the records.
type findings struct {
	Acquisitions  int
	Takeovers     int
	Stalled       int
	Accepted      int
	StaleRejected int
	Conflicts     int
	Maybe         int
	// Errored counts the sections an error ended early, all checked.
	Errored int
	// KeepAliveLost counts the keep-alives that reported a loss.
	KeepAliveLost int
	// Violations. Overlaps: two holders of one name whose live critical
	// sections overlapped. Duplicates: a fence issued twice for one name.
	// OutOfOrder: of two live critical sections of one name, the later
	// one has the lower fence (a live section starts after its acquire
	// committed and the lease stays live until it ends, so sections that do
	// not overlap are in acquisition order).
	Overlaps   []string
	Duplicates []string
	OutOfOrder []string
	// Beliefs: a holder believed it held the name (its ValidUntil) past the
	// start of another holder's live section, which Lock.ValidUntil
	// promises never happens.
	Beliefs []string
	// OrderedPairs is how many consecutive live sections were compared for
	// the order of their fences.
	OrderedPairs int
}

func (f findings) violations() int {
	return len(f.Overlaps) + len(f.Duplicates) + len(f.OutOfOrder) + len(f.Beliefs)
}

// check finds the violations in records.
func check(records []record) findings {
	var f findings
	byName := map[string][]record{}
	for _, r := range records {
		f.Acquisitions++
		f.Accepted += r.Accepted
		f.StaleRejected += r.Rejected
		f.Conflicts += r.Conflicts
		f.Maybe += r.Maybe
		if r.Err != "" {
			f.Errored++
		}
		if r.TakenOver {
			f.Takeovers++
		}
		if r.Stalled {
			f.Stalled++
		}
		if r.KeepAliveLost {
			f.KeepAliveLost++
		}
		byName[r.Name] = append(byName[r.Name], r)
	}
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		rs := byName[name]
		seen := map[uint64]record{}
		for _, r := range rs {
			if o, dup := seen[r.Fence]; dup {
				f.Duplicates = append(f.Duplicates, fmt.Sprintf("%q: fence %d issued to %s and %s", name, r.Fence, who(o), who(r)))
			}
			seen[r.Fence] = r
		}
		var live []record
		for _, r := range rs {
			if _, _, ok := r.live(); ok {
				live = append(live, r)
			}
		}
		if len(live) == 0 {
			continue
		}
		slices.SortFunc(live, func(a, b record) int { return cmp.Compare(a.Start, b.Start) })
		f.Beliefs = append(f.Beliefs, beliefs(name, live)...)
		last := live[0]
		// last is the live section that ends last among those started so
		// far: the next one must start after it ends.
		for i := 1; i < len(live); i++ {
			cur := live[i]
			_, lastTo, _ := last.live()
			if cur.Start < lastTo {
				f.Overlaps = append(f.Overlaps, fmt.Sprintf("%q: %s (fence %d, live %d..%d) and %s (fence %d, live from %d) overlap by %dµs",
					name, who(last), last.Fence, last.Start, lastTo, who(cur), cur.Fence, cur.Start, lastTo-cur.Start))
			} else {
				f.OrderedPairs++
				if cur.Fence <= last.Fence {
					f.OutOfOrder = append(f.OutOfOrder, fmt.Sprintf("%q: %s got fence %d after %s's %d", name, who(cur), cur.Fence, who(last), last.Fence))
				}
			}
			if _, curTo, _ := cur.live(); curTo > lastTo {
				last = cur
			}
		}
	}
	return f
}

func who(r record) string { return fmt.Sprintf("p%d/g%d", r.Proc, r.Goroutine) }

// beliefs finds, among live sections sorted by start, each holder that
// believed it held the name until after the next section of it began: the
// belief runs from the section's start to its end, or to its ValidUntil
// when that came first.
func beliefs(name string, live []record) []string {
	var bad []string
	for i, r := range live {
		if r.Belief == 0 || i+1 == len(live) {
			continue
		}
		to := r.Belief
		if end := r.end(); end != 0 {
			to = min(to, end)
		}
		if next := live[i+1]; next.Start < to && next.Start > r.Start {
			bad = append(bad, fmt.Sprintf("%q: %s (fence %d) believed it held the name until %d, %dµs into the section %s (fence %d) began at %d",
				name, who(r), r.Fence, r.Belief, to-next.Start, who(next), next.Fence, next.Start))
		}
	}
	return bad
}
