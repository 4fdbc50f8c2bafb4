package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"
)

type results struct {
	Command string
	Date    time.Time
	Machine machine
	Config  config
	Locks   []lockResult
}

type machine struct {
	CPUs               int
	CPU, Go, OS        string
	LoadStart, LoadEnd string // 1, 5 and 15 minute load averages
}

type lockResult struct {
	Key, Label, Server, Settings string
	Durability                   string // the server's settings that decide it
	Durable, Lease, Fence        bool
	PairOnly                     bool
	Pair                         *pairResult
	PairDelayed                  *pairResult // through a proxy adding Config.PairLatency each way
	Local                        *localResult
	Procs                        *procStats
}

type pairResult struct {
	N             int
	Median, P99   time.Duration
	Allocs, Bytes uint64 // per pair
	Trips         float64
}

type localResult struct {
	Goroutines   int
	Acquisitions int64
	PerSecond    float64
	Errors       int64
}

func (r *results) files(dir string) []string {
	return []string{filepath.Join(dir, "results.txt"), filepath.Join(dir, "results.json"), filepath.Join(dir, "chart.svg")}
}

// write writes results.txt, results.json and chart.svg into dir.
func (r *results) write(dir string) error {
	var txt bytes.Buffer
	r.text(&txt)
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	f := r.files(dir)
	for i, b := range [][]byte{txt.Bytes(), append(js, '\n'), []byte(r.chart())} {
		if err := os.WriteFile(f[i], b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func us(d time.Duration) string { return fmt.Sprintf("%.0f", float64(d)/float64(time.Microsecond)) }
func ms(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/float64(time.Millisecond)) }

func shares(s []float64) string {
	var parts []string
	for _, v := range s {
		parts = append(parts, fmt.Sprintf("%.0f", v))
	}
	return strings.Join(parts, " / ")
}

// shortServer is the server without its address, for table rows.
func shortServer(s string) string {
	f := strings.Fields(s)
	if len(f) >= 3 {
		return strings.Join(f[:len(f)-1], " ")
	}
	return s
}

func (r *results) conditions() string {
	c := r.Config
	s := "servers on loopback"
	if c.Latency > 0 {
		s = fmt.Sprintf("servers behind a proxy adding %v each way", c.Latency)
	}
	return s
}

// text is results.txt: how it ran, then the tables.
func (r *results) text(w io.Writer) {
	c := r.Config
	fmt.Fprintf(w, "sqllock beside the alternatives, written by: %s\n", r.Command)
	fmt.Fprintf(w, "date: %s\n", r.Date.Format(time.RFC3339))
	fmt.Fprintf(w, "machine: %d CPUs, %s, %s, %s; load average %s at the start, %s at the end\n",
		r.Machine.CPUs, r.Machine.CPU, r.Machine.OS, r.Machine.Go, r.Machine.LoadStart, r.Machine.LoadEnd)
	fmt.Fprintf(w, "conditions: %s; leases %v\n", r.conditions(), ttl)
	seen := map[string]bool{}
	for _, l := range r.Locks {
		if !seen[l.Server] {
			seen[l.Server] = true
			fmt.Fprintf(w, "server: %s (%s)\n", l.Server, l.Durability)
		}
	}
	fmt.Fprintf(w, "\nHow each lock waits and what it is\n\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "lock\tserver\tdurable\tlease\tfence\tsettings")
	for _, l := range r.Locks {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", l.Label, l.Server, yesNo(l.Durable), yesNo(l.Lease), yesNo(l.Fence), l.Settings)
	}
	tw.Flush()

	if r.has(func(l lockResult) bool { return l.Pair != nil }) {
		fmt.Fprintf(w, "\n1. Uncontended acquire + release, one goroutine: %d round(s) of %v per lock, interleaved; round trips counted by a proxy over 20 pairs\n", c.Rounds, c.PairTime)
		r.pairTable(w, func(l lockResult) *pairResult { return l.Pair })
	}
	if r.has(func(l lockResult) bool { return l.PairDelayed != nil }) {
		fmt.Fprintf(w, "\n1b. The same through a proxy on loopback adding %v each way, as between hosts\n", c.PairLatency)
		r.pairTable(w, func(l lockResult) *pairResult { return l.PairDelayed })
	}
	if r.has(func(l lockResult) bool { return l.Local != nil }) {
		fmt.Fprintf(w, "\n2. %d goroutines of one process on one name, acquire then release at once, %v per lock\n\n", c.Goroutines, c.LocalTime)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "lock\tserver\tacquisitions\thandoffs/s\terrors\t")
		for _, l := range r.Locks {
			if p := l.Local; p != nil {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%.0f\t%d\t\n", l.Label, shortServer(l.Server), p.Acquisitions, p.PerSecond, p.Errors)
			}
		}
		tw.Flush()
	}
	if r.has(func(l lockResult) bool { return l.Procs != nil }) {
		fmt.Fprintf(w, "\n3. %d processes on one name, each looping acquire / hold %v / release, %v per lock\n", c.Procs, c.Hold, c.Duration)
		fmt.Fprintf(w, "   latency: from the previous holder's release returning to the next acquire returning, when the next holder is another process\n")
		fmt.Fprintf(w, "   (wall clock; 0 when the acquire returned first: \"early\"); longest wait: one acquire call, the one cut off at the end included;\n")
		fmt.Fprintf(w, "   round trips counted by a proxy in each process; per second waiting: those acquire calls sent beyond what an uncontended\n")
		fmt.Fprintf(w, "   acquire sends, over the time spent in them; overlaps: an acquire returned before the holder began its release\n\n")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "lock\tserver\tacquisitions\tto another process\thandoffs\tp50 ms\tp99 ms\tshares %\tlongest wait s\tround trips/acq\tround trips/s waiting\tearly\toverlaps\terrors\t")
		for _, l := range r.Locks {
			if p := l.Procs; p != nil {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%.1f%%\t%d\t%s\t%s\t%s\t%.2f\t%.1f\t%.1f\t%d\t%d\t%d\t\n", l.Label, shortServer(l.Server), p.Acquisitions,
					p.CrossPct, p.Handoffs, ms(p.P50), ms(p.P99), shares(p.Shares), p.LongestWait.Seconds(), p.TripsPerAcq, p.WaitTripsPerS, p.Early, p.Overlaps, p.Errors)
			}
		}
		tw.Flush()
		for _, l := range r.Locks {
			if p := l.Procs; p != nil && p.FirstErr != "" {
				fmt.Fprintf(w, "%s: first error: %s\n", l.Label, p.FirstErr)
			}
		}
	}
}

func (r *results) pairTable(w io.Writer, get func(lockResult) *pairResult) {
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "lock\tserver\tpairs\tmedian µs\tp99 µs\tallocs\tbytes\tround trips\t")
	for _, l := range r.Locks {
		if p := get(l); p != nil {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%d\t%d\t%.1f\t\n", l.Label, shortServer(l.Server), p.N, us(p.Median), us(p.P99), p.Allocs, p.Bytes, p.Trips)
		}
	}
	tw.Flush()
}

func (r *results) has(f func(lockResult) bool) bool {
	for _, l := range r.Locks {
		if f(l) {
			return true
		}
	}
	return false
}

// markdown prints the tables of docs/performance.md.
func (r *results) markdown(w io.Writer) {
	c := r.Config
	fmt.Fprintf(w, "Written by `cd compare && %s` on %s (%d CPUs, %s), %s.\n\n",
		r.Command, r.Date.Format("2006-01-02"), r.Machine.CPUs, r.Machine.Go, r.conditions())
	if r.has(func(l lockResult) bool { return l.Pair != nil || l.Local != nil }) {
		delayed := r.has(func(l lockResult) bool { return l.PairDelayed != nil })
		fmt.Fprint(w, "| lock | server | durable | lease | fence | acquire + release, median µs | p99 µs | allocs | round trips |")
		if delayed {
			fmt.Fprintf(w, " median µs, %v each way |", c.PairLatency)
		}
		fmt.Fprintf(w, " %d goroutines, handoffs/s |\n", c.Goroutines)
		fmt.Fprint(w, "| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: |")
		if delayed {
			fmt.Fprint(w, " ---: |")
		}
		fmt.Fprintln(w, " ---: |")
		for _, l := range r.Locks {
			med, p99, allocs, trips, slow, local := "-", "-", "-", "-", "-", "-"
			if p := l.Pair; p != nil {
				med, p99, allocs, trips = us(p.Median), us(p.P99), fmt.Sprint(p.Allocs), fmt.Sprintf("%.0f", p.Trips)
			}
			if p := l.PairDelayed; p != nil {
				slow = us(p.Median)
			}
			if p := l.Local; p != nil {
				local = fmt.Sprintf("%.0f", p.PerSecond)
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |", l.Label, shortServer(l.Server),
				yesNo(l.Durable), yesNo(l.Lease), yesNo(l.Fence), med, p99, allocs, trips)
			if delayed {
				fmt.Fprintf(w, " %s |", slow)
			}
			fmt.Fprintf(w, " %s |\n", local)
		}
		fmt.Fprintln(w)
	}
	if r.has(func(l lockResult) bool { return l.Procs != nil }) {
		fmt.Fprintf(w, "%d processes on one name, each looping acquire / hold %v / release for %v:\n\n", c.Procs, c.Hold, c.Duration)
		fmt.Fprintln(w, "| lock | server | durable | lease | fence | handoffs to another process | release to acquire, another process, p50 / p99 ms (handoffs) | share of each process, % | longest wait, s | round trips per acquisition | round trips/s while waiting |")
		fmt.Fprintln(w, "| --- | --- | --- | --- | --- | ---: | ---: | --- | ---: | ---: | ---: |")
		for _, l := range r.Locks {
			p := l.Procs
			if p == nil {
				continue
			}
			lat := "-"
			if p.Handoffs > 0 {
				lat = fmt.Sprintf("%s / %s (%d)", ms(p.P50), ms(p.P99), p.Handoffs)
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %.1f %% | %s | %s | %.2f | %.1f | %.1f |\n", l.Label, shortServer(l.Server),
				yesNo(l.Durable), yesNo(l.Lease), yesNo(l.Fence), p.CrossPct, lat, shares(p.Shares), p.LongestWait.Seconds(), p.TripsPerAcq, p.WaitTripsPerS)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w, "How each lock waits:")
	fmt.Fprintln(w)
	seen := make(map[string]bool) // a lock runs on each server: say it once
	for _, l := range r.Locks {
		if !l.PairOnly && !seen[l.Label] {
			seen[l.Label] = true
			fmt.Fprintf(w, "- %s: %s\n", l.Label, l.Settings)
		}
	}
}

// chart draws panels of horizontal bars: the uncontended pair's median
// (on loopback, and through the delaying proxy), the 4-process p99 handoff
// latency to another process (log scale) and the smallest process's share
// of acquisitions.
func (r *results) chart() string {
	type bar struct {
		label string
		v     float64
		text  string
	}
	type panel struct {
		title string
		log   bool
		max   float64
		mark  float64 // a reference line, 0 for none
		bars  []bar
	}
	label := func(l lockResult) string { return l.Label + " · " + shortServer(l.Server) }
	var pair, slow, lat, fair panel
	pair.title = "Uncontended acquire + release, median µs (shorter is faster)"
	slow.title = fmt.Sprintf("The same with %v added each way, as between hosts, median µs", r.Config.PairLatency)
	lat.title = fmt.Sprintf("%d processes: p99 from release to another process's acquire, ms, log scale", r.Config.Procs)
	lat.log = true
	fair.title = fmt.Sprintf("%d processes: the smallest process's share of acquisitions, %% (%.0f %% is fair)", r.Config.Procs, 100/float64(max(r.Config.Procs, 1)))
	fair.mark = 100 / float64(max(r.Config.Procs, 1))
	for _, l := range r.Locks {
		if p := l.Pair; p != nil {
			v := float64(p.Median) / float64(time.Microsecond)
			pair.bars = append(pair.bars, bar{label(l), v, us(p.Median)})
		}
		if p := l.PairDelayed; p != nil {
			v := float64(p.Median) / float64(time.Microsecond)
			slow.bars = append(slow.bars, bar{label(l), v, us(p.Median)})
		}
		if p := l.Procs; p != nil {
			if p.Handoffs > 0 {
				v := float64(p.P99) / float64(time.Millisecond)
				text := fmt.Sprintf("%s (%d handoffs)", ms(p.P99), p.Handoffs)
				if p.Handoffs == 1 {
					text = ms(p.P99) + " (1 handoff)"
				}
				lat.bars = append(lat.bars, bar{label(l), v, text})
			} else {
				lat.bars = append(lat.bars, bar{label(l), 0, "no handoff"})
			}
			least := 0.0
			if len(p.Shares) == r.Config.Procs {
				least = p.Shares[len(p.Shares)-1]
			}
			fair.bars = append(fair.bars, bar{label(l), least, fmt.Sprintf("%.0f %%", least)})
		}
	}
	const (
		width  = 1060
		left   = 330
		right  = 170
		rowH   = 20
		titleH = 34
		gap    = 18
	)
	var b strings.Builder
	var panels []panel
	for _, p := range []panel{pair, slow, lat, fair} {
		if len(p.bars) > 0 {
			panels = append(panels, p)
		}
	}
	height := 10
	for _, p := range panels {
		height += titleH + len(p.bars)*rowH + gap
		if p.log {
			height += 10
		}
	}
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	y := 10
	plotW := float64(width - left - right)
	for _, p := range panels {
		fmt.Fprintf(&b, `<text x="10" y="%d" font-weight="bold">%s</text>`+"\n", y+18, html.EscapeString(p.title))
		y += titleH
		if p.log {
			y += 10 // room for the ticks' labels
		}
		hi := p.max
		lo := math.Inf(1)
		for _, br := range p.bars {
			hi = max(hi, br.v)
			if br.v > 0 {
				lo = min(lo, br.v)
			}
		}
		if p.mark > 0 {
			hi = max(hi, p.mark)
		}
		var scale func(float64) float64
		if p.log {
			lo = math.Pow(10, math.Floor(math.Log10(lo)))
			hi = math.Pow(10, math.Ceil(math.Log10(hi)))
			if hi <= lo {
				hi = lo * 10
			}
			scale = func(v float64) float64 {
				if v <= 0 {
					return 0
				}
				return plotW * (math.Log10(v) - math.Log10(lo)) / (math.Log10(hi) - math.Log10(lo))
			}
			for t := lo; t <= hi*1.0001; t *= 10 {
				x := float64(left) + scale(t)
				fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", x, y-4, x, y+len(p.bars)*rowH)
				fmt.Fprintf(&b, `<text x="%.1f" y="%d" fill="#888" text-anchor="middle" font-size="10">%g</text>`+"\n", x, y-6, t)
			}
		} else {
			if hi <= 0 {
				hi = 1
			}
			scale = func(v float64) float64 { return plotW * v / hi }
		}
		if p.mark > 0 {
			x := float64(left) + scale(p.mark)
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#c00" stroke-dasharray="4 3"/>`+"\n", x, y-4, x, y+len(p.bars)*rowH)
		}
		for _, br := range p.bars {
			fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", left-8, y+14, html.EscapeString(br.label))
			wpx := scale(br.v)
			color := "#4a7fb5"
			if strings.HasPrefix(br.label, "sqllock") {
				color = "#d9822b"
			}
			fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", left, y+3, max(wpx, 0), rowH-6, color)
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" fill="#333">%s</text>`+"\n", float64(left)+max(wpx, 0)+4, y+14, html.EscapeString(br.text))
			y += rowH
		}
		y += gap
	}
	b.WriteString("</svg>\n")
	return b.String()
}
