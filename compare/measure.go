package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqllock/sqllock/internal/faultproxy"
)

// runName is a name no other run on the same servers uses.
func runName(what, key string) string {
	return fmt.Sprintf("compare-%d-%s-%s", os.Getpid(), what, key)
}

// dial starts a proxy in front of k's server when through is set and
// returns the address to dial, the proxy (nil without one) and its stop.
func dial(k kind, through bool, delay time.Duration) (string, *faultproxy.Proxy, error) {
	if !through {
		return k.addr, nil, nil
	}
	p, err := newProxy(k.addr, delay)
	if err != nil {
		return "", nil, err
	}
	return p.Addr(), p, nil
}

// --- 1. The uncontended pair ---

// pairRound times acquire+release pairs of one session for d, after a few
// to warm the pool and the statements.
func pairRound(ctx context.Context, k kind, addr string, d time.Duration, samples []time.Duration) (_ []time.Duration, allocs, bytes uint64, err error) {
	c, err := k.open(ctx, addr)
	if err != nil {
		return samples, 0, 0, err
	}
	defer c.close()
	s, err := c.session(ctx)
	if err != nil {
		return samples, 0, 0, err
	}
	defer s.close()
	name := runName("pair", k.key)
	pair := func() error {
		rel, err := s.acquire(ctx, name)
		if err != nil {
			return fmt.Errorf("acquire: %w", err)
		}
		if err := rel(ctx); err != nil {
			return fmt.Errorf("release: %w", err)
		}
		return nil
	}
	for range 5 {
		if err := pair(); err != nil {
			return samples, 0, 0, err
		}
	}
	samples = slices.Grow(samples, 1<<16) // no growth while timed
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	n := 0
	for end := time.Now().Add(d); time.Now().Before(end) && len(samples) < cap(samples); n++ {
		t := time.Now()
		if err := pair(); err != nil {
			return samples, 0, 0, err
		}
		samples = append(samples, time.Since(t))
	}
	runtime.ReadMemStats(&after)
	return samples, (after.Mallocs - before.Mallocs) / uint64(n), (after.TotalAlloc - before.TotalAlloc) / uint64(n), nil
}

// pairTrips counts the round trips of n pairs through a counting proxy.
func pairTrips(ctx context.Context, k kind, delay time.Duration, n int) (float64, error) {
	addr, p, err := dial(k, true, delay)
	if err != nil {
		return 0, err
	}
	defer p.Close()
	c, err := k.open(ctx, addr)
	if err != nil {
		return 0, err
	}
	defer c.close()
	s, err := c.session(ctx)
	if err != nil {
		return 0, err
	}
	defer s.close()
	name := runName("trips", k.key)
	var start int64
	for i := range n + 3 {
		if i == 3 { // after the pool and the statements are warm
			start = p.RoundTrips()
		}
		rel, err := s.acquire(ctx, name)
		if err != nil {
			return 0, err
		}
		if err := rel(ctx); err != nil {
			return 0, err
		}
	}
	return float64(p.RoundTrips()-start) / float64(n), nil
}

// --- 2. Goroutines of one process on one name ---

// localHandoffs runs g goroutines, each with a session of its own, taking
// turns on one name with no hold for d, and returns the acquisitions and
// the errors other than the end of the run.
func localHandoffs(ctx context.Context, k kind, addr string, g int, d time.Duration) (n int64, errs int64, err error) {
	c, err := k.open(ctx, addr)
	if err != nil {
		return 0, 0, err
	}
	defer c.close()
	sessions := make([]locker, g)
	for i := range sessions {
		if sessions[i], err = c.session(ctx); err != nil {
			return 0, 0, err
		}
		defer sessions[i].close()
		rel, err := sessions[i].acquire(ctx, runName("warm", fmt.Sprint(i)))
		if err != nil {
			return 0, 0, err
		}
		if err := rel(ctx); err != nil {
			return 0, 0, err
		}
	}
	name := runName("local", k.key)
	run, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var count, failed atomic.Int64
	var wg sync.WaitGroup
	for _, s := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for run.Err() == nil {
				rel, err := s.acquire(run, name)
				if err != nil {
					if run.Err() == nil {
						failed.Add(1)
					}
					continue
				}
				if run.Err() == nil {
					count.Add(1)
				}
				if err := rel(ctx); err != nil {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return count.Load(), failed.Load(), nil
}

// --- 3. Processes on one name ---

// childSpec is what a child process is told, in its environment.
type childSpec struct {
	Targets  targets
	Key      string
	Name     string
	Hold     time.Duration
	Duration time.Duration
	Delay    time.Duration
}

const childEnv = "SQLLOCK_COMPARE_CHILD"

// event is one acquisition in a child: when it called acquire (T0), got the
// name (T1), called release (T2) and release returned (T3), in wall-clock
// nanoseconds, which processes on one machine share; and the round trips
// its acquire and release sent.
type event struct {
	Proc           int
	T0, T1, T2, T3 int64
	TripsAcq       int64
	TripsRel       int64
}

// childSummary closes a child's report.
type childSummary struct {
	Proc     int
	WaitNs   int64 // time spent in acquire, the last cut-off wait included
	MaxWait  int64 // the longest single wait, the cut-off one included
	WaitTrip int64 // round trips sent during acquire
	// BaseTrips is what one uncontended acquire sends: the part of
	// WaitTrip that is not spent waiting is this per acquisition.
	BaseTrips int64
	Trips     int64 // round trips in all, heartbeats included
	Errors    int64
	FirstErr  string
}

// runChild is a child process: it loops acquire / hold / release on one
// name for the spec's duration, after the parent says go, and writes an
// event per acquisition on stdout.
func runChild(spec childSpec, proc int, in io.Reader, out io.Writer) error {
	ks, err := spec.Targets.kinds()
	if err != nil {
		return err
	}
	i := slices.IndexFunc(ks, func(k kind) bool { return k.key == spec.Key })
	if i < 0 {
		return fmt.Errorf("no lock %q", spec.Key)
	}
	k := ks[i]
	ctx := context.Background()
	addr, p, err := dial(k, true, spec.Delay)
	if err != nil {
		return err
	}
	defer p.Close()
	c, err := k.open(ctx, addr)
	if err != nil {
		return err
	}
	defer c.close()
	s, err := c.session(ctx)
	if err != nil {
		return err
	}
	defer s.close()
	// Warm the pool and the statements, and count what an uncontended
	// acquire sends once they are warm.
	base := int64(-1)
	for i := range 3 {
		r0 := p.RoundTrips()
		rel, err := s.acquire(ctx, fmt.Sprintf("%s-warm-%d", spec.Name, proc))
		if err != nil {
			return err
		}
		if n := p.RoundTrips() - r0; i > 0 && (base < 0 || n < base) {
			base = n
		}
		if err := rel(ctx); err != nil {
			return err
		}
	}
	w := bufio.NewWriter(out)
	enc := json.NewEncoder(w)
	fmt.Fprintln(w, "ready")
	w.Flush()
	if _, err := bufio.NewReader(in).ReadString('\n'); err != nil {
		return fmt.Errorf("waiting for go: %w", err)
	}
	run, cancel := context.WithTimeout(ctx, spec.Duration)
	defer cancel()
	sum := childSummary{Proc: proc, BaseTrips: base}
	start := p.RoundTrips()
	for run.Err() == nil {
		t0, r0 := time.Now(), p.RoundTrips()
		rel, err := s.acquire(run, spec.Name)
		t1, r1 := time.Now(), p.RoundTrips()
		sum.WaitNs += t1.Sub(t0).Nanoseconds()
		sum.MaxWait = max(sum.MaxWait, t1.Sub(t0).Nanoseconds())
		sum.WaitTrip += r1 - r0
		if err != nil {
			if run.Err() == nil {
				sum.Errors++
				if sum.FirstErr == "" {
					sum.FirstErr = err.Error()
				}
				time.Sleep(10 * time.Millisecond)
			}
			continue
		}
		time.Sleep(spec.Hold)
		t2 := time.Now()
		rctx, rcancel := context.WithTimeout(ctx, ttl)
		err = rel(rctx)
		rcancel()
		t3 := time.Now()
		if err != nil {
			sum.Errors++
			if sum.FirstErr == "" {
				sum.FirstErr = "release: " + err.Error()
			}
		}
		enc.Encode(event{proc, t0.UnixNano(), t1.UnixNano(), t2.UnixNano(), t3.UnixNano(), r1 - r0, p.RoundTrips() - r1})
	}
	sum.Trips = p.RoundTrips() - start
	fmt.Fprint(w, "summary ")
	enc.Encode(sum)
	return w.Flush()
}

// procRun is what the children of one lock reported.
type procRun struct {
	Events    []event
	Summaries []childSummary
}

// runProcs starts n children of the running binary on one name and
// gathers their reports.
func runProcs(ctx context.Context, spec childSpec, n int) (procRun, error) {
	exe, err := os.Executable()
	if err != nil {
		return procRun{}, err
	}
	type child struct {
		cmd   *exec.Cmd
		stdin io.WriteCloser
		out   *bufio.Reader
	}
	env, err := json.Marshal(spec)
	if err != nil {
		return procRun{}, err
	}
	var children []child
	defer func() {
		for _, c := range children {
			c.stdin.Close()
			c.cmd.Process.Kill()
			c.cmd.Wait()
		}
	}()
	for i := range n {
		cmd := exec.CommandContext(ctx, exe)
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d:%s", childEnv, i, env))
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return procRun{}, err
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return procRun{}, err
		}
		if err := cmd.Start(); err != nil {
			return procRun{}, err
		}
		children = append(children, child{cmd, stdin, bufio.NewReader(stdout)})
	}
	for i, c := range children {
		line, err := c.out.ReadString('\n')
		if line != "ready\n" {
			return procRun{}, fmt.Errorf("child %d: got %q, %v, want ready", i, line, err)
		}
	}
	for _, c := range children {
		io.WriteString(c.stdin, "go\n")
	}
	var (
		mu  sync.Mutex
		r   procRun
		wg  sync.WaitGroup
		bad []error
	)
	for i, c := range children {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var evs []event
			var sum *childSummary
			for {
				line, err := c.out.ReadString('\n')
				if err != nil {
					break
				}
				if rest, ok := strings.CutPrefix(line, "summary "); ok {
					sum = new(childSummary)
					if err := json.Unmarshal([]byte(rest), sum); err != nil {
						sum = nil
					}
					continue
				}
				var e event
				if err := json.Unmarshal([]byte(line), &e); err == nil {
					evs = append(evs, e)
				}
			}
			err := c.cmd.Wait()
			mu.Lock()
			defer mu.Unlock()
			if err != nil || sum == nil {
				bad = append(bad, fmt.Errorf("child %d: exit %v, summary %v", i, err, sum != nil))
				return
			}
			r.Events = append(r.Events, evs...)
			r.Summaries = append(r.Summaries, *sum)
		}()
	}
	wg.Wait()
	children = nil // all waited for
	return r, errors.Join(bad...)
}

// childMain runs a child when the environment says so, and reports whether
// it did. The value is "PROC:JSON".
func childMain() bool {
	v, ok := os.LookupEnv(childEnv)
	if !ok {
		return false
	}
	var proc int
	var spec childSpec
	procText, js, _ := strings.Cut(v, ":")
	if _, err := fmt.Sscan(procText, &proc); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(2)
	}
	if err := json.Unmarshal([]byte(js), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(2)
	}
	if err := runChild(spec, proc, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "child %d (%s): %v\n", proc, spec.Key, err)
		os.Exit(1)
	}
	return true
}

// procStats is the 4-process figure of one lock.
type procStats struct {
	Acquisitions  int
	PerSecond     float64
	Handoffs      int     // consecutive acquisitions by different processes
	CrossPct      float64 // Handoffs over all successions
	P50, P99      time.Duration
	Shares        []float64     // per process, percent, largest first
	LongestWait   time.Duration // one acquire call's, the last one cut off at the end included
	TripsPerAcq   float64       // every round trip of every process, over acquisitions
	WaitTripsPerS float64       // round trips sent during acquire beyond an uncontended acquire's, per second of waiting
	Overlaps      int           // an acquire returned before the holder began its release
	Early         int           // an acquire returned before the release did (latency counted as 0)
	Errors        int64
	FirstErr      string
}

// stats orders the acquisitions by when they returned and reads off the
// figures. The latency of a handoff to another process is from the
// previous holder's release returning to the next acquire returning,
// counted as 0 when the acquirer heard first.
func (r procRun) stats(procs int, d time.Duration) procStats {
	evs := slices.Clone(r.Events)
	slices.SortFunc(evs, func(a, b event) int { return cmp.Compare(a.T1, b.T1) })
	var st procStats
	st.Acquisitions = len(evs)
	st.PerSecond = float64(len(evs)) / d.Seconds()
	count := make([]int, procs)
	var lat []time.Duration
	for i, e := range evs {
		if e.Proc >= 0 && e.Proc < procs {
			count[e.Proc]++
		}
		if i == 0 {
			continue
		}
		prev := evs[i-1]
		if e.T1 < prev.T2 {
			st.Overlaps++
		}
		if e.Proc == prev.Proc {
			continue
		}
		st.Handoffs++
		l := time.Duration(e.T1 - prev.T3)
		if l < 0 {
			st.Early++
			l = 0
		}
		lat = append(lat, l)
	}
	if len(evs) > 1 {
		st.CrossPct = 100 * float64(st.Handoffs) / float64(len(evs)-1)
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		st.P50 = percentile(lat, 50)
		st.P99 = percentile(lat, 99)
	}
	for _, c := range count {
		if len(evs) > 0 {
			st.Shares = append(st.Shares, 100*float64(c)/float64(len(evs)))
		}
	}
	slices.Sort(st.Shares)
	slices.Reverse(st.Shares)
	var trips, waitTrips, waitNs int64
	for _, s := range r.Summaries {
		trips += s.Trips
		waitTrips += s.WaitTrip - s.BaseTrips*int64(count[s.Proc])
		waitNs += s.WaitNs
		st.LongestWait = max(st.LongestWait, time.Duration(s.MaxWait))
		st.Errors += s.Errors
		if st.FirstErr == "" {
			st.FirstErr = s.FirstErr
		}
	}
	if len(evs) > 0 {
		st.TripsPerAcq = float64(trips) / float64(len(evs))
	}
	if waitNs > 0 {
		st.WaitTripsPerS = float64(waitTrips) / time.Duration(waitNs).Seconds()
	}
	return st
}

// percentile of sorted values, nearest rank.
func percentile(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := (len(sorted)*p + 99) / 100 // ceil(n*p/100), 1-based
	return sorted[max(i-1, 0)]
}
