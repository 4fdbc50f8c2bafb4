package main

// The many-leases mode: one Client holds N leases with Lock.KeepAlive, and
// the mode measures what keeping them costs the server and the Client.
//
//	go run ./cmd/sqllock-bench -leases 100,1000,10000 -hold 60s -ttl 3s -dsn 'root@tcp(127.0.0.1:3307)/test'

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqllock/sqllock"
)

// leasesConfig is the mode's flags.
type leasesConfig struct {
	counts    []int
	hold, ttl time.Duration
	dsn       string
	pool      int // the *sql.DB's open and idle connections
	workers   int // goroutines acquiring and releasing
	serverPID int // the server's pid when its pid file cannot be read here
	slots     int // each lease a slot of a semaphore of this many; 0: names

	acquireLimit time.Duration // acquiring stops after it; 0: none
}

// parseCounts reads "100,1000,10000".
func parseCounts(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-leases: %q is not a count of leases", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// leasesRow is one N's measurement.
type leasesRow struct {
	n, failed           int           // leases asked for, acquires that failed
	acquire, release    time.Duration // for all of them
	stmts               int64         // statements sent while holding
	renews              int64         // of them the shared renewal's (renew_many, session_renew)
	minSec, maxSec      int64         // fewest and most in one second of it
	held                time.Duration // how long the hold lasted
	serverCPU           float64       // server CPU seconds while holding; -1 if unknown
	threadsCPU          float64       // the same of the server's threads serving the Client
	threads             int           // how many those were
	clientCPU           float64       // this process's
	lostBefore          int           // keep-alives lost before the hold began
	lostLate, lostTaken int           // lost during the hold: not renewed in time, found not held
	endedOther          int           // ended for another cause
	heap                uint64        // Go heap in use while holding
	prepares, dials     int64         // while holding
}

func runLeases(cfg leasesConfig) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	cc, err := newCountingConnector(cfg.dsn)
	if err != nil {
		return err
	}
	db := sql.OpenDB(cc)
	defer db.Close()
	db.SetMaxOpenConns(cfg.pool)
	db.SetMaxIdleConns(cfg.pool)
	// mon finds the server's threads serving db's connections; what it
	// sends is not counted.
	mon := sql.OpenDB(cc.Connector)
	defer mon.Close()
	mon.SetMaxOpenConns(1)

	var version, pidFile string
	if err := db.QueryRowContext(ctx, "SELECT VERSION(), @@pid_file").Scan(&version, &pidFile); err != nil {
		return fmt.Errorf("reading the server's version: %w", err)
	}
	pid := cfg.serverPID
	if pid == 0 {
		if pid, err = readPIDFile(pidFile); err != nil {
			log.Printf("server CPU not measured: %v (give -server-pid)", err)
		}
	}
	tick := clockTicks()

	w := os.Stdout
	fmt.Fprintf(w, "# sqllock many leases, one Client: go run ./cmd/sqllock-bench %s\n", strings.Join(os.Args[1:], " "))
	fmt.Fprintf(w, "# machine: %d CPUs, %s, %s\n", runtime.NumCPU(), cpuModel(), runtime.Version())
	fmt.Fprintf(w, "# server: %s (pid %d), code at %s\n", version, pid, gitHead())
	fmt.Fprintf(w, "# ttl %v, hold %v, pool of %d connections, %d goroutines acquiring and releasing\n", cfg.ttl, cfg.hold, cfg.pool, cfg.workers)
	if cfg.slots > 0 {
		fmt.Fprintf(w, "# each lease a slot of a semaphore of %d slots\n", cfg.slots)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| leases | acquire all (s) | statements/s holding (min–max in a second) | statements per lease held per ttl | shared renewal's statements per ttl/3 | server CPU s/min, all | server CPU s/min, the Client's connections | client CPU s/min | lost | Go heap (MiB) |")
	fmt.Fprintln(w, "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	var notes []string
	for _, n := range cfg.counts {
		if ctx.Err() != nil {
			break
		}
		log.Printf("%d leases: acquiring", n)
		r, err := leasesRun(ctx, db, mon, cc, cfg, n, pid, tick)
		if err != nil {
			return err
		}
		r.print(w, cfg.ttl)
		notes = append(notes, r.notes()...)
	}
	if len(notes) > 0 {
		fmt.Fprintln(w)
		for _, s := range notes {
			fmt.Fprintln(w, s)
		}
	}
	return ctx.Err()
}

// leasesRun acquires n leases on a table of their own, keeps them alive
// for the hold, and releases them.
func leasesRun(ctx context.Context, db, mon *sql.DB, cc *countingConnector, cfg leasesConfig, n, pid int, tick float64) (r leasesRow, err error) {
	r.n = n
	table := fmt.Sprintf("sqllock_bench_leases_%d_%d", os.Getpid(), n)
	c, err := sqllock.New(db, sqllock.WithTable(table))
	if err != nil {
		return r, err
	}
	if err := c.CreateTable(ctx); err != nil {
		return r, fmt.Errorf("creating %s: %w", table, err)
	}
	// The cleanup runs even when ctx ended on an interrupt.
	bg := context.WithoutCancel(ctx)
	defer func() {
		c.Close()
		if _, derr := db.ExecContext(bg, "DROP TABLE IF EXISTS `"+table+"`"); derr != nil && err == nil {
			err = fmt.Errorf("dropping %s: %w", table, derr)
		}
	}()

	locks := make([]*sqllock.Lock, n)
	kctxs := make([]context.Context, n)
	var failed atomic.Int64
	var firstErr error
	var errOnce sync.Once
	// Each keep-alive starts as soon as its lease is taken: leases taken
	// early would otherwise expire while the last ones are acquired.
	actx, cancel := ctx, context.CancelFunc(func() {})
	if cfg.acquireLimit > 0 {
		actx, cancel = context.WithTimeout(ctx, cfg.acquireLimit)
	}
	defer cancel()
	var acquired atomic.Int64
	var progress *time.Timer
	progress = time.AfterFunc(10*time.Second, func() {
		log.Printf("%d leases: %d acquired", n, acquired.Load())
		progress.Reset(10 * time.Second)
	})
	start := time.Now()
	parallel(n, cfg.workers, func(i int) {
		if actx.Err() != nil {
			failed.Add(1)
			return
		}
		var l *sqllock.Lock
		var err error
		if cfg.slots > 0 {
			l, err = c.Semaphore(fmt.Sprintf("sem-%06d", i/cfg.slots), cfg.slots).TryAcquire(actx, cfg.ttl)
		} else {
			l, err = c.TryAcquire(actx, fmt.Sprintf("lease-%07d", i), cfg.ttl)
		}
		if err != nil {
			failed.Add(1)
			errOnce.Do(func() { firstErr = err })
			return
		}
		acquired.Add(1)
		locks[i] = l
		kctxs[i] = l.KeepAlive(bg)
	})
	progress.Stop()
	r.acquire = time.Since(start)
	r.failed = int(failed.Load())
	if firstErr != nil {
		log.Printf("%d leases: %d acquires failed, the first: %v", n, r.failed, firstErr)
	}
	lostBefore, takenBefore, _ := countEnded(kctxs)
	r.lostBefore = lostBefore

	log.Printf("%d leases: holding for %v", n, cfg.hold)
	// The server's CPU is its own and that of the threads serving the
	// Client's connections: other clients of a shared server add to the
	// first, and the second leaves out the server's background work.
	ts := &threadSampler{mon: mon, cc: cc, pid: pid, threads: map[int]bool{}}
	if pid == 0 {
		ts.err = errors.New("no pid")
	}
	ts.sample(ctx)
	cpu0, cpuErr := procCPU(pid)
	self0, _ := procCPU(os.Getpid())
	stmts0, renews0, prep0, dials0 := cc.stmts.Load(), cc.renews.Load(), cc.prepares.Load(), cc.dials.Load()
	holdStart := time.Now()
	r.minSec = -1
	last := stmts0
	sec := time.NewTicker(time.Second)
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-sec.C:
			now := cc.stmts.Load()
			d := now - last
			last = now
			r.maxSec = max(r.maxSec, d)
			if r.minSec < 0 || d < r.minSec {
				r.minSec = d
			}
			done = time.Since(holdStart) >= cfg.hold
			if !done {
				ts.sample(ctx)
			}
		}
	}
	sec.Stop()
	r.held = time.Since(holdStart)
	r.stmts = cc.stmts.Load() - stmts0
	r.renews = cc.renews.Load() - renews0
	r.prepares, r.dials = cc.prepares.Load()-prep0, cc.dials.Load()-dials0
	cpu1, cpuErr1 := procCPU(pid)
	ts.sample(bg)
	self1, _ := procCPU(os.Getpid())
	r.serverCPU, r.threadsCPU = float64(cpu1-cpu0)/tick, float64(ts.ticks)/tick
	if pid == 0 || cpuErr != nil || cpuErr1 != nil {
		r.serverCPU = -1
	}
	if ts.err != nil {
		r.threadsCPU = -1
		if pid != 0 {
			log.Printf("%d leases: the CPU of the server's threads for the Client not measured: %v", n, ts.err)
		}
	}
	r.threads = len(ts.threads)
	r.clientCPU = float64(self1-self0) / tick
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	r.heap = ms.HeapInuse
	lost, taken, other := countEnded(kctxs)
	r.lostTaken = taken - takenBefore
	r.lostLate = lost - lostBefore - r.lostTaken
	r.endedOther = other

	log.Printf("%d leases: releasing", n)
	start = time.Now()
	parallel(n, cfg.workers, func(i int) {
		if locks[i] != nil {
			locks[i].Release(bg) // a lost lease's Release says so; the count is above
		}
	})
	r.release = time.Since(start)
	return r, nil
}

// parallel runs f(0..n-1) on workers goroutines.
func parallel(n, workers int, f func(i int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(workers, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				f(i)
			}
		}()
	}
	wg.Wait()
}

// countEnded counts the keep-alive contexts whose lease was lost, those of
// them found not held (taken over or expired on the server), and those
// that ended for another cause.
func countEnded(kctxs []context.Context) (lost, taken, other int) {
	for _, k := range kctxs {
		if k == nil || k.Err() == nil {
			continue
		}
		switch cause := context.Cause(k); {
		case errors.Is(cause, sqllock.ErrLockLost):
			lost++
			if errors.Is(cause, sqllock.ErrNotHeld) {
				taken++
			}
		default:
			other++
		}
	}
	return lost, taken, other
}

func (r *leasesRow) print(w io.Writer, ttl time.Duration) {
	secs := r.held.Seconds()
	perSec := float64(r.stmts) / secs
	alive := r.n - r.failed - r.lostBefore
	lost := strconv.Itoa(r.lostLate + r.lostTaken)
	if r.lostBefore > 0 {
		lost += fmt.Sprintf(" (+%d while acquiring)", r.lostBefore)
	}
	perMin := func(cpu float64) string {
		if cpu < 0 {
			return "–"
		}
		return fmt.Sprintf("%.2f", cpu/secs*60)
	}
	fmt.Fprintf(w, "| %d | %.2f | %.0f (%d–%d) | %.2f | %.1f | %s | %s | %.2f | %s | %.0f |\n",
		r.n, r.acquire.Seconds(), perSec, r.minSec, r.maxSec, perSec*ttl.Seconds()/float64(max(alive, 1)),
		float64(r.renews)/secs*(ttl/3).Seconds(),
		perMin(r.serverCPU), perMin(r.threadsCPU), r.clientCPU/secs*60, lost, float64(r.heap)/(1<<20))
}

// notes says what the row's columns leave out, when there is something.
func (r *leasesRow) notes() []string {
	var out []string
	say := func(format string, args ...any) {
		out = append(out, fmt.Sprintf("- %d leases: ", r.n)+fmt.Sprintf(format, args...))
	}
	if r.failed > 0 {
		say("%d acquires failed or were not tried (see -acquire-limit)", r.failed)
	}
	if r.lostBefore > 0 {
		say("%d leases lost while the others were acquired, before the hold began: %d held when it began", r.lostBefore, r.n-r.failed-r.lostBefore)
	}
	if r.lostLate+r.lostTaken > 0 {
		say("of the %d lost, %d found not held by a renewal, %d not renewed in time", r.lostLate+r.lostTaken, r.lostTaken, r.lostLate)
	}
	if r.endedOther > 0 {
		say("%d keep-alives ended for a cause other than loss", r.endedOther)
	}
	if r.prepares > 0 || r.dials > 0 {
		say("while holding, %d statements prepared and %d connections opened (not in statements/s)", r.prepares, r.dials)
	}
	say("release all: %.1f s; held %.1f s; the server's CPU for the Client measured on %d of its threads", r.release.Seconds(), r.held.Seconds(), r.threads)
	return out
}

// readPIDFile reads the server's pid from its pid file, which this machine
// can read when the server runs on it.
func readPIDFile(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("pid file %s: %w", path, err)
	}
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil {
		return 0, err
	}
	if c := strings.TrimSpace(string(comm)); c != "mariadbd" && c != "mysqld" {
		return 0, fmt.Errorf("pid %d from %s is %s, not a server", pid, path, c)
	}
	return pid, nil
}

// procCPU returns a process's user and system CPU time, in clock ticks.
func procCPU(pid int) (int64, error) {
	if pid == 0 {
		return 0, errors.New("no pid")
	}
	return statCPU(fmt.Sprintf("/proc/%d/stat", pid))
}

// statCPU reads the user and system CPU time from a /proc stat file.
func statCPU(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	// The command name, in parentheses, may hold spaces: the fields count
	// from after its closing one; utime and stime are the 14th and 15th.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("%s: unexpected form", path)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("%s: unexpected form", path)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return utime + stime, nil
}

// clockTicks is the unit of /proc's CPU times, per second.
func clockTicks() float64 {
	out, err := exec.Command("getconf", "CLK_TCK").Output()
	if err == nil {
		if v, err := strconv.ParseFloat(strings.TrimSpace(string(out)), 64); err == nil && v > 0 {
			return v
		}
	}
	return 100
}

func gitHead() string {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "an unknown commit"
	}
	return strings.TrimSpace(string(out))
}
