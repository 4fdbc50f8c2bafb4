package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	mrand "math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sqllock/sqllock"
)

// The semaphore mode (-slots N): -procs Clients, each on a pool of its own
// (as separate processes would be), run -goroutines goroutines that take a
// slot of one of -names semaphores of N slots with Semaphore.TryAcquire, hold it
// for a while (a -stall-fraction of them past the lease, without renewing),
// and release it. A holder counts its section from the acquire's return to
// the release, cut at the Lock's ValidUntil, before which the lease cannot
// have expired: so on one host's clock, more than N overlapping sections of
// one semaphore, two overlapping sections of one slot, a fence issued twice,
// or an acquire called after another returned that holds the lower fence
// are violations. (A section that began after another ended may hold the
// lower fence: its statement committed first, on another slot, and its
// reply came back later than the other's whole section.)

// A slotSection is one holder's time on a slot.
type slotSection struct {
	name  string
	slot  int
	fence uint64
	// called is when the acquire was called, start when it returned: the
	// statement committed between the two.
	called, start, end time.Time
}

// slotRun is what a semaphore run gathered.
type slotRun struct {
	mu       sync.Mutex
	sections []slotSection
	refused  int
	errs     map[string]int
	hist     *history // -history, or nil
}

func (r *slotRun) add(s slotSection) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sections = append(r.sections, s)
}

func (r *slotRun) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs[err.Error()]++
}

// runSlots runs the semaphore mode and prints its summary; it returns the
// exit status.
func runSlots(ctx context.Context, cfg config, stdout, stderr io.Writer) int {
	sum, pass, err := slotStress(ctx, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "sqllock-stress: %v\n", err)
		return 1
	}
	fmt.Fprint(stdout, sum)
	if cfg.record != "" {
		if err := os.WriteFile(cfg.record, []byte(sum), 0o644); err != nil {
			fmt.Fprintf(stderr, "sqllock-stress: %v\n", err)
			return 1
		}
	}
	if !pass {
		return 1
	}
	return 0
}

func slotStress(ctx context.Context, cfg config) (summary string, pass bool, err error) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	table := cfg.table + "_slots_" + hex.EncodeToString(b[:])
	var clients []*sqllock.Client
	for p := range cfg.procs {
		db, err := sql.Open("mysql", cfg.dsns[p%len(cfg.dsns)])
		if err != nil {
			return "", false, err
		}
		defer db.Close()
		c, err := sqllock.New(db, sqllock.WithTable(table), sqllock.WithHolder(fmt.Sprintf("proc%d", p)))
		if err != nil {
			return "", false, err
		}
		defer c.Close()
		if p == 0 {
			if err := c.CreateTable(ctx); err != nil {
				return "", false, err
			}
			if !cfg.keep {
				defer db.Exec("DROP TABLE IF EXISTS `" + table + "`")
			}
		}
		clients = append(clients, c)
	}
	run := &slotRun{errs: map[string]int{}}
	if cfg.history != "" {
		if run.hist, err = createHistory(cfg.history); err != nil {
			return "", false, err
		}
		defer run.hist.close()
	}
	stop := time.Now().Add(cfg.duration)
	var wg sync.WaitGroup
	for p, c := range clients {
		for g := range cfg.goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				slotWorker(ctx, cfg, c, p, g, stop, run)
			}()
		}
	}
	wg.Wait()
	if err := run.hist.close(); err != nil {
		return "", false, fmt.Errorf("-history: %w", err)
	}
	violations := checkSlots(run.sections, cfg.slots)
	var sb strings.Builder
	fmt.Fprintf(&sb, "semaphores:               %d of %d slots\n", cfg.names, cfg.slots)
	fmt.Fprintf(&sb, "acquisitions:             %d\n", len(run.sections))
	fmt.Fprintf(&sb, "refused (all held):       %d\n", run.refused)
	fmt.Fprintf(&sb, "most holders at once:     %d\n", mostAtOnce(run.sections))
	errs := 0
	for _, msg := range slices.Sorted(maps.Keys(run.errs)) {
		fmt.Fprintf(&sb, "error (%d): %s\n", run.errs[msg], msg)
		errs += run.errs[msg]
	}
	fmt.Fprintf(&sb, "violations:               %d\n", len(violations))
	for _, v := range violations[:min(len(violations), 20)] {
		fmt.Fprintf(&sb, "  %s\n", v)
	}
	if cfg.history != "" {
		fmt.Fprintf(&sb, "history:                  %d operations in %s (checked by the linearize module)\n", run.hist.n, cfg.history)
	}
	pass = len(violations) == 0 && len(run.sections) > 0 && (errs == 0 || cfg.allowErrors)
	if pass {
		sb.WriteString("PASS\n")
	} else {
		sb.WriteString("FAIL\n")
	}
	return sb.String(), pass, nil
}

// slotWorker, goroutine g of Client p, takes, holds and releases slots
// until stop.
func slotWorker(ctx context.Context, cfg config, c *sqllock.Client, p, g int, stop time.Time, run *slotRun) {
	for time.Now().Before(stop) && ctx.Err() == nil {
		name := fmt.Sprintf("sem%d", mrand.IntN(cfg.names))
		called, call := time.Now(), stamp()
		l, err := c.Semaphore(name, cfg.slots).TryAcquire(ctx, cfg.ttl)
		acq := histOp{Kind: "acquire", Name: name, Proc: p, Goroutine: g, Result: opResult(err, "refused"), Call: call, Return: stamp(),
			TTL: int64(cfg.ttl), Slots: cfg.slots}
		if err == nil {
			acq.Fence, acq.Slot = l.Fence(), l.Slot()
		}
		run.hist.addOp(acq)
		if errors.Is(err, sqllock.ErrNotAcquired) && !errors.Is(err, sqllock.ErrSlotCount) {
			run.mu.Lock()
			run.refused++
			run.mu.Unlock()
			if cfg.broken {
				// The self-test: work as if the refusal were a slot.
				start := time.Now()
				time.Sleep(cfg.ttl / 4)
				run.add(slotSection{name: name, slot: cfg.slots + 1, fence: 0, called: called, start: start, end: time.Now()})
				continue
			}
			time.Sleep(time.Duration(mrand.Int64N(int64(cfg.ttl/10) + 1)))
			continue
		}
		if err != nil {
			run.fail(err)
			time.Sleep(cfg.ttl / 10)
			continue
		}
		start := time.Now()
		hold := time.Duration(mrand.Int64N(int64(cfg.ttl/2) + 1))
		if mrand.Float64() < cfg.stallFraction {
			hold = cfg.ttl + cfg.ttl/2 // past the lease, not renewed
		}
		time.Sleep(hold)
		end := time.Now()
		if vu := l.ValidUntil(); vu.Before(end) {
			end = vu // from here on the holder cannot count on its slot
		}
		if end.After(start) {
			run.add(slotSection{name: name, slot: l.Slot(), fence: l.Fence(), called: called, start: start, end: end})
		}
		call = stamp()
		err = l.Release(context.WithoutCancel(ctx))
		run.hist.addOp(histOp{Kind: "release", Name: name, Proc: p, Goroutine: g, Fence: l.Fence(), Slot: l.Slot(), Slots: cfg.slots,
			Result: opResult(err, "notheld"), Call: call, Return: stamp()})
		if err != nil && !errors.Is(err, sqllock.ErrNotHeld) {
			run.fail(err)
		}
	}
}

// checkSlots returns the violations among the sections of semaphores of n
// slots.
func checkSlots(sections []slotSection, n int) []string {
	var out []string
	byName := map[string][]slotSection{}
	for _, s := range sections {
		byName[s.name] = append(byName[s.name], s)
	}
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		ss := byName[name]
		slices.SortFunc(ss, func(a, b slotSection) int { return a.start.Compare(b.start) })
		if at, most := atOnce(ss); most > n {
			out = append(out, fmt.Sprintf("%s: %d holders at once at %s, more than %d", name, most, at.Format(time.RFC3339Nano), n))
		}
		fences := map[uint64]bool{}
		for i, a := range ss {
			if fences[a.fence] {
				out = append(out, fmt.Sprintf("%s: fence %d issued twice", name, a.fence))
			}
			fences[a.fence] = true
			for _, b := range ss[i+1:] {
				// Fences grow in the order the acquires commit. An acquire
				// called after another returned committed after it; one
				// that merely returned later may have committed first, on
				// another slot, its reply slower than the other's whole
				// section.
				if b.called.After(a.start) && b.fence <= a.fence {
					out = append(out, fmt.Sprintf("%s: fence %d acquired after fence %d was", name, b.fence, a.fence))
				}
				if !b.start.Before(a.end) {
					continue
				}
				if a.slot == b.slot {
					out = append(out, fmt.Sprintf("%s: slot %d held by fences %d and %d at once", name, a.slot, a.fence, b.fence))
				}
			}
		}
	}
	return out
}

// atOnce returns the most sections of ss (sorted by start) that overlap,
// and when.
func atOnce(ss []slotSection) (time.Time, int) {
	type edge struct {
		at    time.Time
		delta int
	}
	var edges []edge
	for _, s := range ss {
		edges = append(edges, edge{s.start, 1}, edge{s.end, -1})
	}
	// Ends before starts at one instant: touching sections do not overlap.
	slices.SortFunc(edges, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.delta - b.delta
	})
	var at time.Time
	cur, most := 0, 0
	for _, e := range edges {
		if cur += e.delta; cur > most {
			most, at = cur, e.at
		}
	}
	return at, most
}

// mostAtOnce is atOnce's count over every semaphore, the most for one.
func mostAtOnce(sections []slotSection) int {
	byName := map[string][]slotSection{}
	for _, s := range sections {
		byName[s.name] = append(byName[s.name], s)
	}
	most := 0
	for _, ss := range byName {
		_, m := atOnce(ss)
		most = max(most, m)
	}
	return most
}
