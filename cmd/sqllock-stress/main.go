// Command sqllock-stress checks sqllock's promises on a real server: P
// separate processes of G goroutines contend for N names with short leases,
// some holders stall past their lease on purpose, and every critical section
// writes to a protected resource that accepts only fenced writes.
//
//	go run ./cmd/sqllock-stress -dsn 'root@tcp(127.0.0.1:3306)/test' \
//	    -procs 4 -goroutines 8 -names 4 -duration 60s -ttl 100ms -stall-fraction 0.1
//
// The parent process starts the children (itself, again, with a hidden
// flag), starts the run's clock once each has said it is ready (its Client
// proven on its server: start-up does not eat a short run), gathers the
// critical sections they report as JSON lines, and checks them: two holders of one name whose sections overlapped while both
// leases were live by the server's clock, a fence issued twice, or fences
// out of acquisition order are violations. It prints a summary, writes it to
// the file -record names, and exits 1 on any violation, on a resource that
// does not match the sections, on a child that failed, and on any error an
// operation returned unless -allow-errors is given or the run is a failover
// run.
//
// It creates two tables of its own (a lock table and its resource table,
// named after -table with a random suffix) and drops them at the end; with
// -cut-channels, a procedure too (named after them; it needs the CREATE
// ROUTINE privilege), which kills a connection only while it still holds or
// waits for a wake-up channel.
//
// On a cluster, give each node's DSN (-dsn repeated, or -dsns with commas):
// process i starts on DSN i (modulo their number), and each goroutine moves
// on to the next DSN when its node cannot serve (down, read-only, out of the
// cluster). A section that an error ends early is reported and checked all
// the same, and every error is counted by its class. -kill-pid (a pid file)
// or -kill-cmd makes it a failover run: the node is killed -kill-after into
// the run, the errors the failover causes are expected, and every name must
// be acquired again after the kill.
//
//	go run ./cmd/sqllock-stress -dsns "$SQLLOCK_TEST_GR_DSNS" -duration 60s \
//	    -kill-cmd 'scripts/cluster gr kill-primary' -kill-after 20s
//
// -fault makes it a fault run (scripts/nemesis runs each; docs/faults.md):
// partition-both, partition-to-server and partition-to-client lead the
// first -faulty processes through a proxy on 127.0.0.1 that blackholes
// their traffic for -fault-for, then heals; pause stops them with SIGSTOP
// and continues them; crash kills the server (-kill-pid) and starts it
// again (-restart-cmd). The summary adds how many sections the fault
// caught, the longest a name went without a new holder, how soon after the
// heal every name was acquired again, and the accepted writes the resource
// lost. With -check, writes run Lock.Check in their transaction and write a
// register without a fence guard, which counts the writes that take it
// back; every holder's Lock.ValidUntil is checked against the next
// holder's start.
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock"
)

type config struct {
	dsns          []string
	procs         int
	goroutines    int
	names         int
	duration      time.Duration
	ttl           time.Duration
	stallFraction float64
	table         string
	record        string
	keep          bool
	allowErrors   bool
	// A failover run kills the node of killPid's pid file, or runs
	// killCmd, killAfter into the run.
	killPid   string
	killCmd   string
	killAfter time.Duration
	wakeups   bool // Acquire with wake-up channels instead of TryAcquire
	// A fault run (nemesis.go): fault, faultAfter into the run, for
	// faultFor, on the first faulty processes; a crash is healed by
	// restartCmd. maxRecovery bounds the time from the heal until every
	// name was acquired again (0: not checked).
	fault       string
	faultAfter  time.Duration
	faultFor    time.Duration
	faulty      int
	restartCmd  string
	maxRecovery time.Duration
	// checked: protected writes go through Lock.Check in a transaction,
	// into a register that counts its steps back, instead of a fenced
	// UPDATE.
	checked bool
	// keepAlive: sections hold their lease with Lock.KeepAlive instead of
	// refreshing it once.
	keepAlive   bool
	cutChannels time.Duration // kill the wake-up channels' connections this often
	set         int           // take this many names at once with TryAcquireSet (sets.go)
	// Hidden: set by the parent for its children.
	child     int
	stopAt    int64 // unix ms; the parent sends it to its children once all are ready
	broken    bool  // -selftest-broken: children ignore refusals, to test the checker
	skipCheck bool  // -selftest-skip-check: -check writes without Lock.Check, to test the checker
	slots     int   // -slots N: the semaphore mode (slots.go)
	// history: write every operation to this file (history.go); a child
	// given it sends its operations to the parent.
	history string
}

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// run is the command; it returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		return 2
	}
	if cfg.slots > 0 {
		return runSlots(ctx, cfg, stdout, stderr)
	}
	if cfg.child >= 0 {
		if err := runChild(ctx, cfg, os.Stdin, stdout); err != nil {
			fmt.Fprintf(stderr, "sqllock-stress child %d: %v\n", cfg.child, err)
			return 1
		}
		return 0
	}
	sum, err := runParent(ctx, cfg, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "sqllock-stress: %v\n", err)
		return 1
	}
	fmt.Fprint(stdout, sum.text)
	if cfg.record != "" {
		if err := os.WriteFile(cfg.record, []byte(sum.text), 0o644); err != nil {
			fmt.Fprintf(stderr, "sqllock-stress: %v\n", err)
			return 1
		}
	}
	if !sum.pass() {
		return 1
	}
	return 0
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("sqllock-stress", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Func("dsn", "go-sql-driver/mysql DSN of the server, or of one node of a cluster (repeat for each node; default $SQLLOCK_TEST_DSN)", func(v string) error {
		cfg.dsns = append(cfg.dsns, v)
		return nil
	})
	fs.Func("dsns", "comma-separated DSNs of a cluster's nodes, as -dsn repeated", func(v string) error {
		for _, d := range strings.Split(v, ",") {
			if d = strings.TrimSpace(d); d != "" {
				cfg.dsns = append(cfg.dsns, d)
			}
		}
		return nil
	})
	fs.IntVar(&cfg.procs, "procs", 3, "processes")
	fs.IntVar(&cfg.goroutines, "goroutines", 4, "goroutines per process")
	fs.IntVar(&cfg.names, "names", 2, "lock names contended for")
	fs.DurationVar(&cfg.duration, "duration", 10*time.Second, "how long the processes contend")
	fs.DurationVar(&cfg.ttl, "ttl", 100*time.Millisecond, "lease length")
	fs.Float64Var(&cfg.stallFraction, "stall-fraction", 0.1, "fraction of holders that stall past their lease without refreshing")
	fs.StringVar(&cfg.table, "table", "sqllock_stress", "prefix of the tables the run creates and drops")
	fs.StringVar(&cfg.record, "record", "", "also write the summary to this file")
	fs.BoolVar(&cfg.keep, "keep", false, "keep the tables after the run")
	fs.BoolVar(&cfg.allowErrors, "allow-errors", false, "pass a run whose operations returned errors (they are still counted and their sections checked)")
	fs.StringVar(&cfg.killPid, "kill-pid", "", "failover run: SIGKILL the process whose pid this file holds, -kill-after into the run")
	fs.StringVar(&cfg.killCmd, "kill-cmd", "", "failover run: run this shell command, -kill-after into the run")
	fs.DurationVar(&cfg.killAfter, "kill-after", 0, "when a failover run kills the node (default a third of -duration)")
	fs.BoolVar(&cfg.wakeups, "wakeups", false, "goroutines wait in Acquire, with its default wake-up channels, instead of polling with TryAcquire")
	fs.IntVar(&cfg.set, "set", 0, "take this many of the names at once, all or nothing, with TryAcquireSet (0: one name at a time)")
	fs.DurationVar(&cfg.cutChannels, "cut-channels", 0, "with -wakeups, kill the server connections of the wake-up channels this often (0: never)")
	fs.IntVar(&cfg.slots, "slots", 0, "semaphore mode: -names counting semaphores of `N` slots, taken with Semaphore.TryAcquire by -procs Clients in this process (slots.go)")
	fs.StringVar(&cfg.fault, "fault", "", "inject a fault: "+strings.Join(faultNames, ", ")+" (see -fault-after, -fault-for, -faulty, -restart-cmd)")
	fs.DurationVar(&cfg.faultAfter, "fault-after", 0, "when the fault begins (default a third of -duration)")
	fs.DurationVar(&cfg.faultFor, "fault-for", 0, "how long a partition or a pause lasts (default 3 x -ttl)")
	fs.IntVar(&cfg.faulty, "faulty", 1, "how many processes a partition cuts off or a pause stops")
	fs.StringVar(&cfg.restartCmd, "restart-cmd", "", "-fault crash: the shell command that starts the killed server again, returning once it answers")
	fs.DurationVar(&cfg.maxRecovery, "max-recovery", 0, "fail a fault run in which a name is first acquired again longer than this after the heal (0: no bound)")
	fs.BoolVar(&cfg.checked, "check", false, "protected writes run Lock.Check in their transaction and write a register that must never go back, instead of a fenced UPDATE")
	fs.StringVar(&cfg.history, "history", "", "write every operation, with its invocation and response times, to this file as JSON lines, for the linearizability check of the linearize module")
	fs.BoolVar(&cfg.keepAlive, "keepalive", false, "holders keep their lease with Lock.KeepAlive through the section (a stall too) instead of one Refresh; a keep-alive that has not reported a lost lease after another holder began is a violation")
	fs.IntVar(&cfg.child, "child", -1, "internal: run as child number N")
	fs.BoolVar(&cfg.skipCheck, "selftest-skip-check", false, "internal: with -check, children write without Lock.Check, to show the checker catches it")
	fs.BoolVar(&cfg.broken, "selftest-broken", false, "internal: children work on names they were refused, to show the checker catches it")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	var bad []string
	if len(cfg.dsns) == 0 {
		if d := os.Getenv("SQLLOCK_TEST_DSN"); d != "" {
			cfg.dsns = []string{d}
		}
	}
	if len(cfg.dsns) == 0 || slices.Contains(cfg.dsns, "") {
		bad = append(bad, "-dsn is required (or set SQLLOCK_TEST_DSN)")
	}
	if cfg.killPid != "" && cfg.killCmd != "" {
		bad = append(bad, "give -kill-pid or -kill-cmd, not both")
	}
	bad = checkFaultFlags(&cfg, bad)
	if cfg.killAfter == 0 {
		cfg.killAfter = cfg.duration / 3
	}
	if cfg.killAfter < 0 || cfg.killAfter >= cfg.duration {
		bad = append(bad, "-kill-after must be within -duration")
	}
	if cfg.procs < 1 || cfg.goroutines < 1 || cfg.names < 1 {
		bad = append(bad, "-procs, -goroutines and -names must be at least 1")
	}
	if cfg.ttl < sqllock.MinTTL || cfg.duration <= 0 {
		bad = append(bad, "-ttl must be at least 1ms and -duration positive")
	}
	if cfg.set < 0 || cfg.set == 1 || cfg.set > cfg.names || (cfg.set > 0 && (cfg.wakeups || cfg.checked)) {
		bad = append(bad, "-set must be 0, or 2 to -names, and cannot go with -wakeups or -check")
	}
	if cfg.cutChannels < 0 || (cfg.cutChannels > 0 && !cfg.wakeups) {
		bad = append(bad, "-cut-channels must be positive, and needs -wakeups")
	}
	if cfg.stallFraction < 0 || cfg.stallFraction > 1 {
		bad = append(bad, "-stall-fraction must be in [0, 1]")
	}
	if len(bad) > 0 {
		err := errors.New(strings.Join(bad, "; "))
		fmt.Fprintf(stderr, "sqllock-stress: %v\n", err)
		return cfg, err
	}
	return cfg, nil
}

// openDBs opens the pool the lock uses, as the DSN says, and the pool the
// resource is written through, without clientFoundRows so that affected
// rows tells an accepted write from a rejected one.
func openDBs(dsn string) (lockDB, resDB *sql.DB, err error) {
	mc, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, nil, err
	}
	lockDB, err = sql.Open("mysql", dsn)
	if err != nil {
		return nil, nil, err
	}
	mc.ClientFoundRows = false
	resDB, err = sql.Open("mysql", mc.FormatDSN())
	if err != nil {
		lockDB.Close()
		return nil, nil, err
	}
	return lockDB, resDB, nil
}

func nameOf(i int) string           { return "stress-" + strconv.Itoa(i) }
func resourceTable(t string) string { return t + "_res" }

// summary is the outcome of a run.
type summary struct {
	findings
	childErrors []string // a child that failed or did not report, or the channel cutter: always a failure
	classes     map[string]int
	errs        []string // the first errors operations returned, in full
	resource    []string // mismatches between the resource table and the records
	// A failover run: when the node was killed (µs since 1970, this
	// machine's clock, which the servers on it share), and the names
	// acquired again after that.
	killedAt      int64
	killErr       string
	afterKill     int
	names         int
	errorsAllowed bool
	// A fault run: the fault, names acquired again after its heal, the
	// longest wait for one (µs), the sections it caught, and whether all
	// that passes. lost counts accepted writes missing from the resource;
	// stale, writes that took the register back.
	fault          faultOutcome
	recovered      int
	recoveryMicros int64
	degradedMicros int64
	caught         []record
	faultOK        bool
	lost, stale    int64
	cuts           int // wake-up channel connections killed
	historyOps     int // operations written to -history
	text           string
}

func (s summary) opErrors() int {
	n := 0
	for _, c := range s.classes {
		n += c
	}
	return n
}

func (s summary) pass() bool {
	return s.violations() == 0 && len(s.childErrors) == 0 && len(s.resource) == 0 &&
		(s.errorsAllowed || s.opErrors() == 0) &&
		s.killErr == "" && (s.killedAt == 0 || s.afterKill == s.names) && s.faultOK
}

// writable opens the first DSN whose server takes writes (a cluster's
// primary), trying each in turn.
func writable(ctx context.Context, dsns []string) (lockDB, resDB *sql.DB, err error) {
	for _, dsn := range dsns {
		lockDB, resDB, err = openDBs(dsn)
		if err != nil {
			return nil, nil, err
		}
		var ro bool
		if err = lockDB.QueryRowContext(ctx, "SELECT @@global.read_only").Scan(&ro); err == nil && !ro {
			return lockDB, resDB, nil
		}
		if err == nil {
			err = errors.New("read-only")
		}
		lockDB.Close()
		resDB.Close()
	}
	return nil, nil, fmt.Errorf("no DSN names a server that takes writes (last: %w)", err)
}

func runParent(ctx context.Context, cfg config, stderr io.Writer) (summary, error) {
	lockDB, resDB, err := writable(ctx, cfg.dsns)
	if err != nil {
		return summary{}, err
	}
	defer func() { lockDB.Close(); resDB.Close() }()
	var version string
	if err := lockDB.QueryRowContext(ctx, "SELECT VERSION()").Scan(&version); err != nil {
		return summary{}, err
	}
	var suffix [4]byte
	_, _ = rand.Read(suffix[:])
	cfg.table = cfg.table + "_" + hex.EncodeToString(suffix[:])
	undo, err := vitessVindexes(ctx, lockDB, version, cfg.table, resourceTable(cfg.table))
	if err != nil {
		return summary{}, err
	}
	if undo != nil && !cfg.keep {
		defer undo() // after the tables are dropped
	}
	if err := createTables(ctx, lockDB, cfg); err != nil {
		return summary{}, err
	}
	if !cfg.keep {
		defer func() {
			for _, t := range []string{cfg.table, resourceTable(cfg.table)} {
				if _, err := lockDB.Exec("DROP TABLE IF EXISTS `" + t + "`"); err != nil {
					fmt.Fprintf(stderr, "sqllock-stress: drop %s: %v\n", t, err)
				}
			}
		}()
	}

	// The children's stderr is copied by one goroutine each.
	stderr = &lockedWriter{w: stderr}
	exe, err := os.Executable()
	if err != nil {
		return summary{}, err
	}
	ps, proxied, err := proxies(cfg)
	if err != nil {
		return summary{}, err
	}
	defer func() {
		for _, p := range ps {
			p.Close()
		}
	}()
	var hist *history
	if cfg.history != "" {
		if hist, err = createHistory(cfg.history); err != nil {
			return summary{}, err
		}
		defer hist.close()
	}
	var (
		procs  []*os.Process
		starts []io.WriteCloser // each child's stdin
		ready  = make(chan struct{}, cfg.procs)
	)
	var (
		mu      sync.Mutex
		records []record
		reports []childReport
		wg      sync.WaitGroup
		errs    []string
	)
	for i := range cfg.procs {
		ccfg := cfg
		if proxied != nil && i < cfg.faulty {
			ccfg.dsns = proxied
		}
		cmd := exec.CommandContext(ctx, exe, childArgs(ccfg, i)...)
		cmd.Stderr = stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			return summary{}, err
		}
		in, err := cmd.StdinPipe()
		if err != nil {
			return summary{}, err
		}
		if err := cmd.Start(); err != nil {
			return summary{}, err
		}
		procs, starts = append(procs, cmd.Process), append(starts, in)
		wg.Add(1)
		go func() {
			defer wg.Done()
			var rs []record
			var rep *childReport
			isReady := false
			sc := bufio.NewScanner(out)
			sc.Buffer(nil, 1<<20)
			for sc.Scan() {
				var l struct {
					record
					childReport
					H     json.RawMessage `json:"h"` // an operation of the history
					Ready bool            `json:"ready"`
				}
				if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Sprintf("child %d: %v in %q", i, err, sc.Text()))
					mu.Unlock()
					continue
				}
				switch {
				case l.Ready:
					isReady = true
					ready <- struct{}{}
				case l.H != nil:
					hist.add(l.H)
				case l.Done:
					rep = &l.childReport
				default:
					rs = append(rs, l.record)
				}
			}
			if !isReady {
				ready <- struct{}{} // it ended first: the run goes on without it, and fails
			}
			werr := cmd.Wait()
			mu.Lock()
			defer mu.Unlock()
			records = append(records, rs...)
			switch {
			case werr != nil:
				errs = append(errs, fmt.Sprintf("child %d: %v", i, werr))
			case rep == nil:
				errs = append(errs, fmt.Sprintf("child %d ended without its report", i))
			default:
				reports = append(reports, *rep)
			}
		}()
	}
	// The run starts once every child is set up: a process started, its
	// Client's first use made. On a loaded machine that took seconds, which
	// a short run's window lost.
	for range cfg.procs {
		select {
		case <-ready:
		case <-ctx.Done():
			wg.Wait() // the children die with ctx
			return summary{}, ctx.Err()
		}
	}
	startAt := time.Now()
	cfg.stopAt = startAt.Add(cfg.duration).UnixMilli()
	for _, in := range starts {
		_, _ = fmt.Fprintln(in, cfg.stopAt) // a child that ended has said why on stderr
		_ = in.Close()
	}
	type cut struct {
		n   int
		err error
	}
	cuts := make(chan cut, 1)
	go func() {
		n, err := cutChannels(ctx, lockDB, cfg)
		cuts <- cut{n, err}
	}()
	sum := summary{names: cfg.names, errorsAllowed: cfg.allowErrors || cfg.failover() || cfg.fault != ""}
	switch {
	case cfg.fault != "":
		sum.fault = inject(ctx, cfg, lockDB, startAt, ps, procs)
	case cfg.failover():
		sum.killedAt, sum.killErr = kill(ctx, cfg, startAt)
	}
	wg.Wait()
	c := <-cuts
	sum.cuts = c.n
	if c.err != nil {
		errs = append(errs, c.err.Error())
	}

	sum.findings = check(records)
	if cfg.fault != "" {
		sum.recovered, sum.recoveryMicros, sum.caught = recovery(cfg, sum.fault, records)
		sum.degradedMicros = degraded(sum.fault, records)
	}
	sum.faultOK = sum.faultPass(cfg)
	sum.childErrors = errs
	sum.classes = map[string]int{}
	for _, r := range reports {
		for c, n := range r.Classes {
			sum.classes[c] += n
		}
		sum.errs = append(sum.errs, r.Errors...)
	}
	if sum.killedAt != 0 {
		after := map[string]bool{}
		for _, r := range records {
			if r.Start > sum.killedAt {
				after[r.Name] = true
			}
		}
		sum.afterKill = len(after)
	}
	// The check reads through the node that takes writes now (after a
	// failover, the new primary), which has every committed write.
	if cfg.failover() {
		// The old pools stay open (and are closed by the deferred call)
		// when no node takes writes: a nil pool there would panic.
		newLock, newRes, err := writable(ctx, cfg.dsns)
		if err != nil {
			return summary{}, err
		}
		lockDB.Close()
		resDB.Close()
		lockDB, resDB = newLock, newRes
	}
	sum.resource, sum.lost, sum.stale, err = checkResource(ctx, resDB, cfg, records, hist)
	if err != nil {
		return summary{}, err
	}
	if hist != nil {
		sum.historyOps = hist.n
		if err := hist.close(); err != nil {
			return summary{}, fmt.Errorf("-history: %w", err)
		}
	}
	sum.text = format(cfg, version, sum, reports)
	return sum, nil
}

func (cfg config) failover() bool { return cfg.killPid != "" || cfg.killCmd != "" }

// kill waits until killAfter into the run and kills the node, returning
// when (µs since 1970) or what went wrong.
func kill(ctx context.Context, cfg config, startAt time.Time) (at int64, problem string) {
	select {
	case <-time.After(time.Until(startAt.Add(cfg.killAfter))):
	case <-ctx.Done():
		return 0, ctx.Err().Error()
	}
	at = time.Now().UnixMicro()
	if cfg.killCmd != "" {
		if out, err := exec.CommandContext(ctx, "sh", "-c", cfg.killCmd).CombinedOutput(); err != nil {
			return 0, fmt.Sprintf("-kill-cmd: %v: %s", err, out)
		}
		return at, ""
	}
	b, err := os.ReadFile(cfg.killPid)
	if err != nil {
		return 0, err.Error()
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Sprintf("%s: %v", cfg.killPid, err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return 0, fmt.Sprintf("kill %d: %v", pid, err)
	}
	return at, ""
}

func childArgs(cfg config, i int) []string {
	args := []string{"-child=" + strconv.Itoa(i)}
	for _, d := range cfg.dsns {
		args = append(args, "-dsn="+d)
	}
	args = append(args,
		"-table="+cfg.table,
		"-goroutines="+strconv.Itoa(cfg.goroutines),
		"-names="+strconv.Itoa(cfg.names),
		"-ttl="+cfg.ttl.String(),
		"-duration="+cfg.duration.String(),
		"-stall-fraction="+strconv.FormatFloat(cfg.stallFraction, 'g', -1, 64),
	)
	if cfg.broken {
		args = append(args, "-selftest-broken")
	}
	if cfg.wakeups {
		args = append(args, "-wakeups")
	}
	if cfg.set > 0 {
		args = append(args, "-set="+strconv.Itoa(cfg.set))
	}
	if cfg.cutChannels > 0 {
		args = append(args, "-cut-channels="+cfg.cutChannels.String())
	}
	if cfg.checked {
		args = append(args, "-check")
	}
	if cfg.keepAlive {
		args = append(args, "-keepalive")
	}
	if cfg.skipCheck {
		args = append(args, "-selftest-skip-check")
	}
	if cfg.history != "" {
		args = append(args, "-history="+cfg.history)
	}
	return args
}

func createTables(ctx context.Context, db *sql.DB, cfg config) error {
	c, err := sqllock.New(db, sqllock.WithTable(cfg.table))
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.CreateTable(ctx); err != nil {
		return err
	}
	res := resourceTable(cfg.table)
	// back counts the writes that took the register's fence back: a stale
	// holder's, which -check's register would accept but for Lock.Check.
	if _, err := db.ExecContext(ctx, "CREATE TABLE `"+res+"` (name VARBINARY(255) PRIMARY KEY, fence BIGINT UNSIGNED NOT NULL, writes BIGINT NOT NULL, back BIGINT NOT NULL DEFAULT 0) ENGINE=InnoDB"); err != nil {
		return err
	}
	for i := range cfg.names {
		if _, err := db.ExecContext(ctx, "INSERT INTO `"+res+"` (name, fence, writes) VALUES (?, 0, 0)", nameOf(i)); err != nil {
			return err
		}
	}
	return nil
}

// cutChannels kills, every cfg.cutChannels until the children stop, the
// server connections that hold or wait for a wake-up channel of the run's
// names, and returns how many it killed. The processes must go on safely,
// polling where the channel would have woken them.
//
// A connection found holding or waiting may have let the channel go by the
// time a KILL of its id arrives, and gone back to its pool to serve
// another statement (a refresh, which the kill would fail with "invalid
// connection": the run's fault, not the library's). So a procedure of the
// run's kills it, on the server, only if it still holds or waits: the
// check and the KILL are two statements a microsecond apart, where the
// connection would need a round trip to the client to start another.
func cutChannels(ctx context.Context, db *sql.DB, cfg config) (int, error) {
	if cfg.cutChannels <= 0 {
		return 0, nil
	}
	// The name of each name's channel, as queries.sql makes it; waiters by
	// the statement they run, on this run's table only: other runs and test
	// suites may wait on the same server, and killing their channels would
	// be this run's fault.
	channel := "CONCAT('sqllock:', LEFT(SHA2(CONCAT_WS(0x00, DATABASE(), ?, ?), 256), 56))"
	waitingOn := func(table string) string {
		return "INFO LIKE 'SELECT IS_FREE_LOCK(CONCAT(''sqllock:''%' AND LOCATE(CONCAT('''', " + table + ", ''''), INFO) > 0"
	}
	proc := "`" + cfg.table + "_cut`"
	if _, err := db.ExecContext(ctx, "CREATE PROCEDURE "+proc+"(victim BIGINT UNSIGNED, ch VARCHAR(64), t VARCHAR(64)) "+
		"BEGIN IF IS_USED_LOCK(ch) = victim OR EXISTS (SELECT 1 FROM information_schema.PROCESSLIST WHERE ID = victim AND "+waitingOn("t")+") "+
		"THEN KILL victim; SELECT 1; ELSE SELECT 0; END IF; END"); err != nil {
		return 0, fmt.Errorf("-cut-channels: create its procedure: %w", err)
	}
	defer func() { _, _ = db.Exec("DROP PROCEDURE IF EXISTS " + proc) }()
	waiters := "SELECT ID FROM information_schema.PROCESSLIST WHERE " + waitingOn("?") + " AND ID <> CONNECTION_ID()"
	killed := 0
	t := time.NewTicker(cfg.cutChannels)
	defer t.Stop()
	for time.Now().Before(time.UnixMilli(cfg.stopAt)) {
		select {
		case <-ctx.Done():
			return killed, nil
		case <-t.C:
		}
		type victim struct {
			id int64
			ch string
		}
		var vs []victim
		for i := range cfg.names {
			var ch string
			var id sql.NullInt64
			if err := db.QueryRowContext(ctx, "SELECT "+channel+", IS_USED_LOCK("+channel+")", cfg.table, nameOf(i), cfg.table, nameOf(i)).Scan(&ch, &id); err == nil && id.Valid {
				vs = append(vs, victim{id.Int64, ch})
			}
		}
		if rows, err := db.QueryContext(ctx, waiters, cfg.table); err == nil {
			for rows.Next() {
				var id int64
				if rows.Scan(&id) == nil {
					vs = append(vs, victim{id: id})
				}
			}
			rows.Close()
		}
		for _, v := range vs {
			// The connection may have ended meanwhile (1094: unknown thread).
			var n int
			if err := db.QueryRowContext(ctx, "CALL "+proc+"(?, ?, ?)", v.id, v.ch, cfg.table).Scan(&n); err == nil && n == 1 {
				killed++
			}
		}
	}
	return killed, nil
}

// checkResource compares the resource table with the records: every accepted
// write counted once, and each name's fence the highest that wrote. A write
// whose outcome is unknown may have been applied or not: it widens what
// the table may hold by one write, and its fence may be the last. It also
// returns how many accepted writes the table lacks (lost), and how many
// writes took a register back (stale). Each read goes into hist, when the
// run keeps a history.
func checkResource(ctx context.Context, db *sql.DB, cfg config, records []record, hist *history) (bad []string, lost, stale int64, err error) {
	wantWrites := map[string]int64{}
	maybeWrites := map[string]int64{}
	wantFence := map[string]uint64{}
	maybeFence := map[string]map[uint64]bool{}
	for _, r := range records {
		wantWrites[r.Name] += int64(r.Accepted)
		maybeWrites[r.Name] += int64(r.Maybe)
		if r.Accepted > 0 {
			wantFence[r.Name] = max(wantFence[r.Name], r.Fence)
		}
		if r.Maybe > 0 {
			if maybeFence[r.Name] == nil {
				maybeFence[r.Name] = map[uint64]bool{}
			}
			maybeFence[r.Name][r.Fence] = true
		}
	}
	for i := range cfg.names {
		name := nameOf(i)
		var fence uint64
		var writes, back int64
		call := stamp()
		if err := db.QueryRowContext(ctx, "SELECT fence, writes, back FROM `"+resourceTable(cfg.table)+"` WHERE name = ?", name).Scan(&fence, &writes, &back); err != nil {
			return nil, 0, 0, err
		}
		hist.addOp(histOp{Kind: "read", Name: name, Proc: -1, Fence: fence, Writes: writes, Result: "ok", Call: call, Return: stamp()})
		lost += max(0, wantWrites[name]-writes)
		stale += back
		if back > 0 {
			bad = append(bad, fmt.Sprintf("%q: %d stale writes took the register's fence back", name, back))
		}
		okWrites := writes >= wantWrites[name] && writes <= wantWrites[name]+maybeWrites[name]
		okFence := fence == wantFence[name] || (fence > wantFence[name] && maybeFence[name][fence])
		if !okWrites || !okFence {
			bad = append(bad, fmt.Sprintf("%q: resource has fence %d after %d writes, records say %d after %d (and %d writes of unknown outcome)",
				name, fence, writes, wantFence[name], wantWrites[name], maybeWrites[name]))
		}
	}
	return bad, lost, stale, nil
}

func format(cfg config, version string, s summary, reports []childReport) string {
	var attempts, refused, refreshes int
	for _, r := range reports {
		attempts += r.Attempts
		refused += r.Refused
		refreshes += r.Refresh
	}
	var b bytes.Buffer
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("sqllock-stress: %d processes x %d goroutines on %d names for %v, ttl %v, stall fraction %g, %d DSN(s)\n",
		cfg.procs, cfg.goroutines, cfg.names, cfg.duration, cfg.ttl, cfg.stallFraction, len(cfg.dsns))
	p("command: go run ./cmd/sqllock-stress")
	for _, d := range cfg.dsns {
		p(" -dsn '%s'", redact(d))
	}
	p(" -procs %d -goroutines %d -names %d -duration %v -ttl %v -stall-fraction %g",
		cfg.procs, cfg.goroutines, cfg.names, cfg.duration, cfg.ttl, cfg.stallFraction)
	switch {
	case cfg.killPid != "" && cfg.fault != "":
		p(" -kill-pid %s", cfg.killPid)
	case cfg.killCmd != "" && cfg.fault != "":
		p(" -kill-cmd '%s'", cfg.killCmd)
	case cfg.killPid != "":
		p(" -kill-pid %s -kill-after %v", cfg.killPid, cfg.killAfter)
	case cfg.killCmd != "":
		p(" -kill-cmd '%s' -kill-after %v", cfg.killCmd, cfg.killAfter)
	}
	if cfg.wakeups {
		p(" -wakeups")
	}
	if cfg.set > 0 {
		p(" -set %d", cfg.set)
	}
	if cfg.cutChannels > 0 {
		p(" -cut-channels %v", cfg.cutChannels)
	}
	if cfg.fault != "" {
		p(" -fault %s -fault-after %v", cfg.fault, cfg.faultAfter)
		if cfg.fault == "crash" {
			p(" -restart-cmd '%s'", cfg.restartCmd)
		} else {
			p(" -fault-for %v -faulty %d", cfg.faultFor, cfg.faulty)
		}
		if cfg.maxRecovery > 0 {
			p(" -max-recovery %v", cfg.maxRecovery)
		}
	}
	if cfg.checked {
		p(" -check")
	}
	if cfg.keepAlive {
		p(" -keepalive")
	}
	if cfg.allowErrors {
		p(" -allow-errors")
	}
	if cfg.history != "" {
		p(" -history %s", cfg.history)
	}
	p("\n")
	p("server: %s\n", version)
	p("attempts:                 %d (refused: %d)\n", attempts, refused)
	p("acquisitions:             %d\n", s.Acquisitions)
	p("takeovers:                %d (the holder's Release found its lease taken over)\n", s.Takeovers)
	p("holders stalled past ttl: %d (faults injected)\n", s.Stalled)
	p("refreshes:                %d\n", refreshes)
	if cfg.keepAlive {
		p("keep-alives that reported a lost lease: %d\n", s.KeepAliveLost)
	}
	if cfg.wakeups {
		p("wake-up channels killed:  %d (faults injected)\n", s.cuts)
	}
	refusedBy := "fencing"
	if cfg.checked {
		refusedBy = "Lock.Check"
	}
	p("protected writes:         %d accepted, %d stale writes rejected by %s, %d attempts rolled back by a conflict (sent again), %d of unknown outcome\n",
		s.Accepted, s.StaleRejected, refusedBy, s.Conflicts, s.Maybe)
	p("sections ended by errors: %d (checked like the others)\n", s.Errored)
	p("ordered pairs checked:    %d\n", s.OrderedPairs)
	if cfg.fault != "" {
		formatFault(p, cfg, s)
	} else if cfg.failover() {
		if s.killErr != "" {
			p("failover:                 the kill failed: %s\n", s.killErr)
		} else {
			p("failover:                 node killed %v into the run; names acquired after it: %d of %d\n", cfg.killAfter, s.afterKill, s.names)
		}
	}
	p("violations:               %d\n", s.violations())
	p("  overlapping live leases: %d\n", len(s.Overlaps))
	p("  duplicate fences:        %d\n", len(s.Duplicates))
	p("  fences out of order:     %d\n", len(s.OutOfOrder))
	p("  held past ValidUntil:    %d (a holder's belief reached into another's lease)\n", len(s.Beliefs))
	p("lost acknowledged writes: %d\n", s.lost)
	p("stale writes committed:   %d (writes that took the register back)\n", s.stale)
	allowed := ""
	if s.errorsAllowed {
		allowed = " (allowed in this run)"
	}
	p("operation errors:         %d%s\n", s.opErrors(), allowed)
	classes := slices.Sorted(maps.Keys(s.classes))
	slices.SortStableFunc(classes, func(a, b string) int { return s.classes[b] - s.classes[a] })
	for _, c := range classes {
		p("  %-40s %d\n", c+":", s.classes[c])
	}
	p("unexpected errors:        %d\n", len(s.childErrors))
	p("resource mismatches:      %d\n", len(s.resource))
	if cfg.history != "" {
		p("history:                  %d operations in %s (checked by the linearize module)\n", s.historyOps, cfg.history)
	}
	for _, list := range [][]string{s.Overlaps, s.Duplicates, s.OutOfOrder, s.Beliefs, s.childErrors, s.resource, s.errs} {
		for i, v := range list {
			if i == 10 {
				p("  ... and %d more\n", len(list)-i)
				break
			}
			p("  %s\n", v)
		}
	}
	p("%s", resultLine(cfg, s, reports))
	if s.pass() {
		p("PASS\n")
	} else {
		p("FAIL\n")
	}
	return b.String()
}

// redact hides the password of a DSN that is printed or recorded.
func redact(dsn string) string {
	mc, err := mysql.ParseDSN(dsn)
	if err != nil || mc.Passwd == "" {
		return dsn
	}
	mc.Passwd = "REDACTED"
	return mc.FormatDSN()
}

// lockedWriter serializes writes to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
