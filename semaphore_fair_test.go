package sqllock

// A semaphore of any size is fair between processes (internal/wait/lanes.go):
// child processes, this test binary run again as TestSemaphoreFairChild,
// each loop Semaphore.Acquire, hold, Release in several goroutines, and
// print each acquisition; the parent reads them all and checks that no
// more than n held at once and that every process got its share.
// CI runs it for a few seconds; SQLLOCK_SEMFAIR_RUN=15s runs the issue's
// whole matrix by hand and logs the figures docs/performance.md gives.

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// semFairEnv carries a child's work: "dsn|table|slots|goroutines|hold|
// oneLane" (oneLane: 1 to wait as before lanes).
const semFairEnv = "SQLLOCK_SEMFAIR_CHILD"

// withOneQueue makes a Client's semaphores wait in one queue per
// semaphore, as before lanes: the reference the tests and benchmarks
// compare lanes with.
func withOneQueue() Option { return func(c *Client) error { c.oneLane = true; return nil } }

// semFairAcq is one acquisition a child made: when its Acquire was
// called, when it returned, and when its Release was called.
type semFairAcq struct {
	proc                       int
	called, acquired, released time.Time
}

// semFairRun is the outcome of one run.
type semFairRun struct {
	acqs     []semFairAcq
	conns    []int // the most connections each child had open at once
	maxHeld  int   // most acquisitions whose [acquired, released] overlap
	per      []int
	maxWait  time.Duration
	unserved time.Duration   // the longest wait the run's end cut short
	cuts     []semFairAcq    // the calls the run's end cut short (released: when)
	procWait time.Duration   // the longest a process had a call waiting and got no slot
	idle     []time.Duration // from a release while someone waited to the acquisition it freed a slot for
	procs    int
	finished bool
}

// runSemFair runs procs children of goroutines each on a semaphore of
// slots slots, holding each slot hold, for run, and gathers what they did.
func runSemFair(t *testing.T, e *testEnv, procs, goroutines, slots int, hold, run time.Duration, oneLane bool) *semFairRun {
	t.Helper()
	table := e.newTable(t)
	one := "0"
	if oneLane {
		one = "1"
	}
	cfg := strings.Join([]string{e.dsn, table, strconv.Itoa(slots), strconv.Itoa(goroutines), hold.String(), one}, "|")
	r := &semFairRun{procs: procs, per: make([]int, procs), conns: make([]int, procs)}
	var (
		mu    sync.Mutex
		ready sync.WaitGroup
		done  sync.WaitGroup
		ins   []io.WriteCloser
		bad   []string
	)
	for p := range procs {
		cmd := exec.Command(os.Args[0], "-test.run=^TestSemaphoreFairChild$", "-test.count=1", "-test.timeout=10m")
		cmd.Env = append(os.Environ(), semFairEnv+"="+cfg)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		in, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr bytes.Buffer
		cmd.Stderr = lockedWriter{mu: &mu, w: &stderr}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		ins = append(ins, in)
		ready.Add(1)
		done.Add(1)
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			if t.Failed() {
				mu.Lock()
				t.Logf("child %d's stderr: %s", p, stderr.String())
				mu.Unlock()
			}
		})
		go func() {
			defer done.Done()
			isReady := false
			defer func() {
				if !isReady {
					ready.Done()
				}
			}()
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				f := strings.Fields(sc.Text())
				if len(f) < 2 || f[0] != "semfair" {
					continue
				}
				mu.Lock()
				switch {
				case f[1] == "ready" && !isReady:
					isReady = true
					ready.Done()
				case f[1] == "acq" && len(f) == 5:
					var ns [3]int64
					for i := range ns {
						ns[i], _ = strconv.ParseInt(f[2+i], 10, 64)
					}
					r.acqs = append(r.acqs, semFairAcq{proc: p, called: time.Unix(0, ns[0]), acquired: time.Unix(0, ns[1]), released: time.Unix(0, ns[2])})
				case f[1] == "unserved" && len(f) == 4:
					// A wait the run's end cut short counts as a wait.
					a, _ := strconv.ParseInt(f[2], 10, 64)
					b, _ := strconv.ParseInt(f[3], 10, 64)
					r.unserved = max(r.unserved, time.Duration(b-a))
					r.cuts = append(r.cuts, semFairAcq{proc: p, called: time.Unix(0, a), released: time.Unix(0, b)})
				case f[1] == "conns" && len(f) == 3:
					r.conns[p], _ = strconv.Atoi(f[2])
				default:
					bad = append(bad, sc.Text())
				}
				mu.Unlock()
			}
		}()
	}
	ready.Wait() // every child made its first use, with its proofs
	for _, in := range ins {
		if _, err := io.WriteString(in, "go\n"); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(run)
	for _, in := range ins {
		_ = in.Close() // the children stop, release, report and exit
	}
	waited := make(chan struct{})
	go func() { done.Wait(); close(waited) }()
	select {
	case <-waited:
		r.finished = true
	case <-time.After(time.Minute):
		t.Fatal("the children did not exit within a minute of their end")
	}
	if len(bad) > 0 {
		t.Fatalf("lines from the children the test cannot read: %q", bad)
	}
	r.analyse()
	return r
}

// analyse computes the run's figures from its acquisitions.
func (r *semFairRun) analyse() {
	type point struct {
		at    time.Time
		delta int // +1 an acquisition, -1 a release, 0 a call
		a     *semFairAcq
	}
	var pts []point
	for i := range r.acqs {
		a := &r.acqs[i]
		r.per[a.proc]++
		r.maxWait = max(r.maxWait, a.acquired.Sub(a.called))
		pts = append(pts, point{a.called, 0, a}, point{a.acquired, 1, a}, point{a.released, -1, a})
	}
	// At one instant, releases before calls before acquisitions: never a
	// holder counted too many.
	slices.SortFunc(pts, func(x, y point) int {
		if c := x.at.Compare(y.at); c != 0 {
			return c
		}
		return x.delta - y.delta
	})
	held, waiting := 0, 0
	var freed []time.Time // releases while someone waited, not yet taken again
	for _, p := range pts {
		switch p.delta {
		case 0:
			waiting++
		case 1:
			held++
			r.maxHeld = max(r.maxHeld, held)
			waiting--
			if len(freed) > 0 && p.a.acquired.Sub(p.a.called) > 0 {
				r.idle = append(r.idle, p.at.Sub(freed[0]))
				freed = freed[1:]
			}
		case -1:
			held--
			if waiting > 0 {
				freed = append(freed, p.at)
			}
		}
	}
	slices.Sort(r.idle)
	r.maxWait = max(r.maxWait, r.unserved)
	r.procWait = r.longestProcessWait()
}

// longestProcessWait is the longest span in which a process had a call
// waiting and none of its calls got a slot: from its first waiting call, or
// from its last acquisition while others of its calls still waited, to its
// next acquisition, or to the run's end for a call the end cut short. One
// call waits its turn among all callers (5 × procs of them on n slots); a
// process waits only while every slot goes to the others.
func (r *semFairRun) longestProcessWait() time.Duration {
	type event struct {
		at   time.Time
		kind int // 0 a call, 1 an acquisition, 2 the run's end cut a call
	}
	evs := make([][]event, r.procs)
	for _, a := range r.acqs {
		evs[a.proc] = append(evs[a.proc], event{a.called, 0}, event{a.acquired, 1})
	}
	for _, c := range r.cuts {
		evs[c.proc] = append(evs[c.proc], event{c.called, 0}, event{c.released, 2})
	}
	var longest time.Duration
	for _, es := range evs {
		slices.SortFunc(es, func(x, y event) int {
			if c := x.at.Compare(y.at); c != 0 {
				return c
			}
			return x.kind - y.kind
		})
		waiting := 0
		var since time.Time
		for _, e := range es {
			if e.kind == 0 {
				if waiting++; waiting == 1 {
					since = e.at
				}
				continue
			}
			longest = max(longest, e.at.Sub(since))
			waiting--
			since = e.at // served now (or the run ended): a new span starts
		}
	}
	return longest
}

// least is the smallest share of the acquisitions any process got, as a
// fraction of its fair share (1/procs).
func (r *semFairRun) least() float64 {
	total := len(r.acqs)
	if total == 0 {
		return 0
	}
	return float64(slices.Min(r.per)) * float64(r.procs) / float64(total)
}

func (r *semFairRun) pct(q int) time.Duration {
	if len(r.idle) == 0 {
		return 0
	}
	return r.idle[min(len(r.idle)*q/100, len(r.idle)-1)]
}

// over is how many hand-overs took longer than d: with a few hundred a
// run, a p99 is the third slowest, and one stall moves it; the count says
// how many there were.
func (r *semFairRun) over(d time.Duration) int {
	i, _ := slices.BinarySearch(r.idle, d+1)
	return len(r.idle) - i
}

func (r *semFairRun) String() string {
	return fmt.Sprintf("%d acquisitions %v, least %.0f%% of a fair share, most held %d, longest wait %v (a process's %v), release to acquire p50 %v p99 %v (%d), connections %v",
		len(r.acqs), r.per, 100*r.least(), r.maxHeld, r.maxWait.Round(time.Millisecond), r.procWait.Round(time.Millisecond),
		r.pct(50).Round(10*time.Microsecond), r.pct(99).Round(10*time.Microsecond), len(r.idle), r.conns)
}

// loadAverage is the machine's load average over the last minute, or "?".
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}

// Processes of five goroutines each, on a semaphore of 3 slots, share it:
// no more than 3 hold at once, and each gets a share of the acquisitions.
// Before lanes, a process whose queue held the semaphore's one channel took
// every slot freed in it, and the other got none (0 % and 100 % in 15 s;
// issue 43). Counted by acquisitions, so that a loaded machine only makes
// it slower: the bound here (a third of a fair share) is loose; the goals
// (60 %, no wait past 1s, p99 10ms) are measured by hand, below.
func TestSemaphore_Acquire_fairAcrossChildProcesses(t *testing.T) {
	run := 3 * time.Second
	matrix := []struct{ procs, slots int }{{2, 3}, {3, 3}}
	if v := os.Getenv("SQLLOCK_SEMFAIR_RUN"); v != "" {
		var err error
		if run, err = time.ParseDuration(v); err != nil {
			t.Fatalf("SQLLOCK_SEMFAIR_RUN=%q: %v", v, err)
		}
		matrix = []struct{ procs, slots int }{{2, 3}, {4, 3}, {8, 3}, {2, 1}, {4, 1}, {8, 1}}
	}
	eachServerEnv(t, func(t *testing.T, e *testEnv) {
		skipFakeFor(t, e, "the holders are other processes, which cannot reach this one's fake")
		slotServer(t, e)
		skipChannelsOnTiDB(t, e)
		for _, m := range matrix {
			t.Run(fmt.Sprintf("procs=%d/slots=%d", m.procs, m.slots), func(t *testing.T) {
				r := runSemFair(t, e, m.procs, 5, m.slots, 50*time.Millisecond, run, os.Getenv("SQLLOCK_SEMFAIR_ONELANE") != "")
				t.Logf("%s; load average %s", r, loadAverage())
				if r.maxHeld > m.slots {
					t.Errorf("holders at once: got %d, want at most %d", r.maxHeld, m.slots)
				}
				if got := r.least(); got < 1.0/3 {
					t.Errorf("least share of a process: got %.0f%% of a fair share %v, want at least 33%%", 100*got, r.per)
				}
			})
		}
	})
}

// TestSemaphoreFairChild is the child process of the fairness test above:
// it does nothing unless semFairEnv says what to do. It waits for "go" on
// stdin, works until stdin closes, and prints one line per acquisition.
func TestSemaphoreFairChild(t *testing.T) {
	cfg := os.Getenv(semFairEnv)
	if cfg == "" {
		t.Skip("the child process of TestSemaphore_Acquire_fairAcrossChildProcesses, run by it")
	}
	f := strings.Split(cfg, "|")
	if len(f) != 6 {
		t.Fatalf("%s=%q: want 6 fields", semFairEnv, cfg)
	}
	slots, _ := strconv.Atoi(f[2])
	goroutines, _ := strconv.Atoi(f[3])
	hold, _ := time.ParseDuration(f[4])
	db, err := sql.Open("mysql", f[0])
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	opts := []Option{WithTable(f[1])}
	if f[5] == "1" {
		opts = append(opts, withOneQueue())
	}
	c, err := New(db, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sem := c.Semaphore("fair", slots)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	l, err := sem.Acquire(ctx, time.Minute) // the first use, and its proofs
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var outMu sync.Mutex
	say := func(format string, args ...any) {
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Printf("semfair "+format+"\n", args...)
	}
	say("ready")
	in := bufio.NewReader(os.Stdin)
	if _, err := in.ReadString('\n'); err != nil {
		return
	}
	go func() {
		_, _ = io.Copy(io.Discard, in)
		cancel()
	}()
	var wg sync.WaitGroup
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				called := time.Now()
				l, err := sem.Acquire(ctx, time.Minute)
				if err != nil {
					if ctx.Err() == nil {
						t.Errorf("Acquire: %v", err)
					}
					say("unserved %d %d", called.UnixNano(), time.Now().UnixNano())
					return
				}
				acquired := time.Now()
				time.Sleep(hold)
				released := time.Now()
				if err := l.Release(context.Background()); err != nil {
					t.Errorf("Release: %v", err)
				}
				say("acq %d %d %d", called.UnixNano(), acquired.UnixNano(), released.UnixNano())
			}
		}()
	}
	most := 0
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for ctx.Err() == nil {
		most = max(most, db.Stats().OpenConnections)
		select {
		case <-tick.C:
		case <-ctx.Done():
		}
	}
	wg.Wait()
	say("conns %d", most)
}

// BenchmarkSemaphoreContention is BenchmarkContention's loop on a
// semaphore, as issue 43 measured it: procs Clients (processes, each on a
// *sql.DB of its own) of 5 goroutines each loop Semaphore.Acquire, hold
// 50ms, Release, for 15s as the issue ran it (SQLLOCK_SEMFAIR_RUN), on a
// semaphore of 1 and of 3 slots; each with lanes (the default) and with
// one queue per semaphore ("one-queue": how every semaphore waited before
// lanes), in one run. It reports:
//
//   - least-share: the smallest share of the acquisitions any Client got,
//     as a fraction of a fair share (1/procs);
//   - max-wait-ms: the longest any Acquire waited;
//   - proc-wait-ms: the longest any Client had an Acquire waiting while
//     none of its Acquires got a slot (longestProcessWait);
//   - p50-µs, p99-µs: from a release while some call waited to the
//     acquisition that took a slot next (each release paired with one);
//   - over-10ms: how many of those took longer than 10 ms;
//   - most-held: the most Locks held at once (at most the slots).
//
// Each variant runs once whatever b.N is: run it with -benchtime 1x.
func BenchmarkSemaphoreContention(b *testing.B) {
	e := benchEnv(b)
	if e.oneRow() {
		b.Skip("no semaphores on TiDB and Vitess")
	}
	// 15s: about 285 hand-overs of one slot, so that a p99 is not the
	// slowest one (95 in 5s).
	run := 15 * time.Second
	if v := os.Getenv("SQLLOCK_SEMFAIR_RUN"); v != "" {
		var err error
		if run, err = time.ParseDuration(v); err != nil {
			b.Fatalf("SQLLOCK_SEMFAIR_RUN=%q: %v", v, err)
		}
	}
	for _, slots := range []int{3, 1} {
		for _, procs := range []int{2, 4, 8} {
			for _, oneQueue := range []bool{false, true} {
				if slots == 1 && oneQueue {
					continue // one slot waits in one queue either way
				}
				name := fmt.Sprintf("slots=%d/procs=%d", slots, procs)
				if oneQueue {
					name += "/one-queue"
				}
				b.Run(name, func(b *testing.B) {
					r := benchSemFair(b, e, procs, 5, slots, 50*time.Millisecond, run, oneQueue)
					b.ReportMetric(float64(len(r.acqs)), "acquisitions")
					b.ReportMetric(r.least(), "least-share")
					b.ReportMetric(float64(r.maxWait.Milliseconds()), "max-wait-ms")
					b.ReportMetric(float64(r.procWait.Milliseconds()), "proc-wait-ms")
					b.ReportMetric(float64(r.pct(50).Microseconds()), "p50-µs")
					b.ReportMetric(float64(r.pct(99).Microseconds()), "p99-µs")
					b.ReportMetric(float64(r.over(10*time.Millisecond)), "over-10ms")
					b.ReportMetric(float64(r.maxHeld), "most-held")
				})
			}
		}
	}
}

// benchSemFair runs BenchmarkSemaphoreContention's loop once.
func benchSemFair(b *testing.B, e *testEnv, procs, goroutines, slots int, hold, run time.Duration, oneQueue bool) *semFairRun {
	table := e.newTable(b)
	var opts []Option
	if oneQueue {
		opts = append(opts, withOneQueue())
	}
	sems := make([]*Semaphore, procs)
	for p := range sems {
		sems[p] = e.client(b, e.openDB(b), table, opts...).Semaphore("fair", slots)
		l, err := sems[p].Acquire(context.Background(), time.Minute) // the first use's proofs
		if err != nil {
			b.Fatal(err)
		}
		l.Release(context.Background())
	}
	ctx, cancel := context.WithTimeout(context.Background(), run)
	defer cancel()
	r := &semFairRun{procs: procs, per: make([]int, procs), conns: make([]int, procs)}
	var mu sync.Mutex
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	for p := range procs {
		for range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					called := time.Now()
					l, err := sems[p].Acquire(ctx, time.Minute)
					if err != nil {
						if ctx.Err() == nil {
							b.Error(err)
						}
						mu.Lock()
						r.unserved = max(r.unserved, time.Since(called))
						r.cuts = append(r.cuts, semFairAcq{proc: p, called: called, released: time.Now()})
						mu.Unlock()
						return
					}
					acquired := time.Now()
					time.Sleep(hold)
					released := time.Now()
					if err := l.Release(context.Background()); err != nil {
						b.Error(err)
					}
					mu.Lock()
					r.acqs = append(r.acqs, semFairAcq{proc: p, called: called, acquired: acquired, released: released})
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	b.StopTimer()
	r.analyse()
	return r
}

// BenchmarkSemaphoreAcquireUncontended is an Acquire and Release of a slot
// of a semaphore of 3 nobody else wants, with lanes and with one queue (as
// before lanes), in one run: an Acquire that does not wait takes lane 1,
// the semaphore's own key, and sends and allocates what it did before.
func BenchmarkSemaphoreAcquireUncontended(b *testing.B) {
	e := benchEnv(b)
	if e.oneRow() {
		b.Skip("no semaphores on TiDB and Vitess")
	}
	ctx := context.Background()
	for _, oneQueue := range []bool{false, true} {
		b.Run(fmt.Sprintf("one-queue=%t", oneQueue), func(b *testing.B) {
			opts := []Option{}
			if oneQueue {
				opts = append(opts, withOneQueue())
			}
			sem := e.newClient(b, opts...).Semaphore("bench", 3)
			b.ReportAllocs()
			for b.Loop() {
				l, err := sem.Acquire(ctx, benchTTL)
				if err != nil {
					b.Fatal(err)
				}
				if err := l.Release(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// A process waits from its first waiting call, or from its last slot while
// another of its calls still waits, to its next slot or the run's end.
func TestSemFairRun_longestProcessWait(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	r := &semFairRun{procs: 2, acqs: []semFairAcq{
		{proc: 0, called: at(0), acquired: at(100), released: at(150)},
		{proc: 1, called: at(0), acquired: at(50), released: at(100)},
		{proc: 1, called: at(10), acquired: at(1200), released: at(1250)},
	}}
	if got, want := r.longestProcessWait(), 1150*time.Millisecond; got != want {
		t.Errorf("process 1 served at 50ms and 1200ms: got %v, want %v", got, want)
	}
	r.cuts = []semFairAcq{{proc: 0, called: at(300), released: at(2000)}}
	if got, want := r.longestProcessWait(), 1700*time.Millisecond; got != want {
		t.Errorf("process 0's call from 300ms cut at 2000ms: got %v, want %v", got, want)
	}
}

// over counts the hand-overs longer than d, not those of d exactly.
func TestSemFairRun_over(t *testing.T) {
	r := &semFairRun{idle: []time.Duration{time.Millisecond, 10 * time.Millisecond, 11 * time.Millisecond, time.Second}}
	if got := r.over(10 * time.Millisecond); got != 2 {
		t.Errorf("over 10ms: got %d, want 2", got)
	}
	if got := r.over(time.Hour); got != 0 {
		t.Errorf("over an hour: got %d, want 0", got)
	}
}
