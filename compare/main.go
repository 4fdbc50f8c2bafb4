// Command compare runs sqllock beside the locks users would pick instead,
// interleaved in one run against real servers, and writes a results file,
// a chart and the table in docs/performance.md:
//
//	cd compare && go run .                 # about 4 minutes with one MySQL server
//	go run . -short                        # a smoke test: under a minute
//	go run . -latency 500us                # a delaying proxy in front of every server
//	go run . -report                       # tables and chart again from results.json
//
// The locks: sqllock (each variant in sqllockVariants) on every MySQL or
// MariaDB server given (-dsn, repeatable; or SQLLOCK_COMPARE_DSNS, space
// separated; or SQLLOCK_TEST_DSN; default the MariaDB on 127.0.0.1:3306),
// MySQL GET_LOCK and the seed recipes on the same servers, bsm/redislock
// and go-redsync on Redis (-redis), cirello.io/pglock and PostgreSQL
// advisory locks (-postgres). The measures:
//
//  1. the uncontended pair, acquire then release: median, p99, allocations
//     and round trips per pair;
//  2. 64 goroutines of one process taking turns on one name, no hold:
//     handoffs per second;
//  3. 4 processes (this binary, run again as children) on one name, each
//     looping acquire / hold 50 ms / release: handoffs to another process,
//     release-to-acquire latency to another process, each process's share
//     of acquisitions, round trips per acquisition and per second of
//     waiting, counted by a proxy in each child.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"time"
)

// config is one run's settings.
type config struct {
	Targets  targets
	Locks    string        // regexp over keys and labels; empty for all
	Measures []string      // of "pair", "local", "procs"
	Latency  time.Duration // added each way by a proxy in front of every server
	// PairLatency, when Latency is 0, runs the uncontended pair a second
	// time through a proxy adding it each way.
	PairLatency time.Duration
	PairTime    time.Duration // per lock per round
	Rounds      int           // of the pair measure, interleaved over locks
	Goroutines  int
	LocalTime   time.Duration // per lock
	Procs       int
	Hold        time.Duration
	Duration    time.Duration // of the processes' run, per lock
	Out         string        // directory of the results
	Command     string        // as run, for the results file
}

func defaultConfig() config {
	return config{
		Targets: targets{
			DSNs:     []string{"root@tcp(127.0.0.1:3306)/test"},
			Redis:    "127.0.0.1:6379",
			Postgres: "postgres://postgres@127.0.0.1:5432/test?sslmode=disable",
		},
		Measures:    []string{"pair", "local", "procs"},
		PairTime:    time.Second,
		PairLatency: 500 * time.Microsecond,
		Rounds:      3,
		Goroutines:  64,
		LocalTime:   5 * time.Second,
		Procs:       4,
		Hold:        50 * time.Millisecond,
		Duration:    20 * time.Second,
		Out:         ".",
	}
}

// short makes the run a smoke test.
func (c *config) short() {
	c.PairTime = 200 * time.Millisecond
	c.Rounds = 1
	c.LocalTime = time.Second
	c.Duration = 3 * time.Second
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, " ") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func main() {
	if childMain() {
		return
	}
	log.SetFlags(0)
	log.SetPrefix("compare: ")
	cfg := defaultConfig()
	var dsns multiFlag
	flag.Var(&dsns, "dsn", "a MySQL or MariaDB server (go-sql-driver DSN); repeat for several (default $SQLLOCK_COMPARE_DSNS, $SQLLOCK_TEST_DSN or "+cfg.Targets.DSNs[0]+")")
	flag.StringVar(&cfg.Targets.Redis, "redis", cfg.Targets.Redis, "Redis host:port; empty to leave redislock and redsync out")
	flag.StringVar(&cfg.Targets.Postgres, "postgres", cfg.Targets.Postgres, "PostgreSQL URL; empty to leave pglock and advisory locks out")
	flag.StringVar(&cfg.Locks, "locks", "", "run only the locks whose key or label matches this regexp")
	measures := flag.String("measures", strings.Join(cfg.Measures, ","), "measures to run: pair, local, procs")
	flag.DurationVar(&cfg.Latency, "latency", 0, "delay added each way by a proxy on loopback in front of every server, e.g. 500us")
	flag.DurationVar(&cfg.PairLatency, "pair-latency", cfg.PairLatency, "without -latency: also time the uncontended pairs through a proxy adding this each way; 0 for not")
	flag.DurationVar(&cfg.PairTime, "pair-time", cfg.PairTime, "uncontended pairs: time per lock per round")
	flag.IntVar(&cfg.Rounds, "rounds", cfg.Rounds, "uncontended pairs: rounds, interleaved over the locks")
	flag.IntVar(&cfg.Goroutines, "goroutines", cfg.Goroutines, "goroutines of one process on one name")
	flag.DurationVar(&cfg.LocalTime, "local-time", cfg.LocalTime, "goroutines on one name: time per lock")
	flag.IntVar(&cfg.Procs, "procs", cfg.Procs, "processes on one name")
	flag.DurationVar(&cfg.Hold, "hold", cfg.Hold, "processes on one name: how long each holds it")
	flag.DurationVar(&cfg.Duration, "duration", cfg.Duration, "processes on one name: time per lock")
	short := flag.Bool("short", false, "a smoke test: 200ms pairs, 1 round, 1s of goroutines, 3s of processes")
	flag.StringVar(&cfg.Out, "out", cfg.Out, "directory for results.txt, results.json and chart.svg")
	report := flag.Bool("report", false, "run nothing: print the tables and redraw the chart from results.json")
	flag.Parse()
	cfg.Measures = strings.Split(*measures, ",")
	if *short {
		// -short sets the times; flags given beside it still win.
		given := map[string]string{}
		flag.Visit(func(f *flag.Flag) { given[f.Name] = f.Value.String() })
		cfg.short()
		for name, v := range given {
			flag.Set(name, v)
		}
	}
	switch {
	case len(dsns) > 0:
		cfg.Targets.DSNs = dsns
	case os.Getenv("SQLLOCK_COMPARE_DSNS") != "":
		cfg.Targets.DSNs = strings.Fields(os.Getenv("SQLLOCK_COMPARE_DSNS"))
	case os.Getenv("SQLLOCK_TEST_DSN") != "":
		cfg.Targets.DSNs = []string{os.Getenv("SQLLOCK_TEST_DSN")}
	}
	cfg.Command = "go run ."
	for _, a := range os.Args[1:] {
		cfg.Command += " " + shellQuote(a)
	}

	if *report {
		r, err := readResults(filepath.Join(cfg.Out, "results.json"))
		if err != nil {
			log.Fatal(err)
		}
		if err := r.write(cfg.Out); err != nil {
			log.Fatal(err)
		}
		r.markdown(os.Stdout)
		return
	}
	r, err := run(context.Background(), cfg, os.Stderr)
	if err != nil {
		log.Fatal(err)
	}
	if err := r.write(cfg.Out); err != nil {
		log.Fatal(err)
	}
	r.text(os.Stdout)
	fmt.Println("\nFor docs/performance.md:")
	fmt.Println()
	r.markdown(os.Stdout)
	fmt.Printf("\nwrote %s\n", strings.Join(r.files(cfg.Out), ", "))
}

// run runs every measure of cfg and returns the results.
func run(ctx context.Context, cfg config, logw interface{ Write([]byte) (int, error) }) (*results, error) {
	logf := func(format string, args ...any) { fmt.Fprintf(logw, "compare: "+format+"\n", args...) }
	if cfg.Targets.Tag == "" {
		cfg.Targets.Tag = fmt.Sprint(os.Getpid())
	}
	all, err := cfg.Targets.kinds()
	if err != nil {
		return nil, err
	}
	var ks []kind
	var re *regexp.Regexp
	if cfg.Locks != "" {
		if re, err = regexp.Compile(cfg.Locks); err != nil {
			return nil, fmt.Errorf("-locks: %w", err)
		}
	}
	for _, k := range all {
		if re == nil || re.MatchString(k.key) || re.MatchString(k.label) {
			ks = append(ks, k)
		}
	}
	if len(ks) == 0 {
		return nil, errors.New("no lock to run")
	}
	r := &results{Command: cfg.Command, Date: time.Now().UTC(), Machine: machineInfo(), Config: cfg}
	r.Machine.LoadStart = loadAvg()

	// Describe every server, and create the tables, before anything is timed.
	for i := range ks {
		k := &ks[i]
		var durability string
		if k.server, durability, err = k.describe(ctx, k.addr); err != nil {
			return nil, fmt.Errorf("%s: server %s: %w (start it, or leave it out: see -dsn, -redis, -postgres, -locks)", k.label, k.addr, err)
		}
		if k.setup != nil {
			if err := k.setup(ctx, k.addr); err != nil {
				return nil, fmt.Errorf("%s: setup: %w", k.label, err)
			}
		}
		r.Locks = append(r.Locks, lockResult{Key: k.key, Label: k.label, Server: k.server, Durability: durability, Settings: k.settings,
			Durable: k.durable, Lease: k.lease, Fence: k.fence, PairOnly: k.pairOnly})
	}
	defer func() {
		for _, k := range ks {
			if k.teardown != nil {
				if err := k.teardown(context.Background(), k.addr); err != nil {
					logf("%s: teardown: %v", k.label, err)
				}
			}
		}
	}()
	through := cfg.Latency > 0

	if slices.Contains(cfg.Measures, "pair") {
		prs, err := pairs(ctx, ks, cfg, through, cfg.Latency, logf)
		if err != nil {
			return nil, err
		}
		for i := range ks {
			r.Locks[i].Pair = prs[i]
		}
		if cfg.PairLatency > 0 && !through {
			if prs, err = pairs(ctx, ks, cfg, true, cfg.PairLatency, logf); err != nil {
				return nil, err
			}
			for i := range ks {
				r.Locks[i].PairDelayed = prs[i]
			}
		}
	}

	if slices.Contains(cfg.Measures, "local") {
		for i, k := range ks {
			if k.pairOnly {
				continue
			}
			logf("%d goroutines on one name: %s on %s", cfg.Goroutines, k.label, k.server)
			addr, p, err := dial(k, through, cfg.Latency)
			if err != nil {
				return nil, err
			}
			n, errs, err := localHandoffs(ctx, k, addr, cfg.Goroutines, cfg.LocalTime)
			if p != nil {
				p.Close()
			}
			if err != nil {
				return nil, fmt.Errorf("%s: goroutines: %w", k.label, err)
			}
			r.Locks[i].Local = &localResult{Goroutines: cfg.Goroutines, Acquisitions: n,
				PerSecond: float64(n) / cfg.LocalTime.Seconds(), Errors: errs}
		}
	}

	if slices.Contains(cfg.Measures, "procs") {
		for i, k := range ks {
			if k.pairOnly {
				continue
			}
			logf("%d processes on one name, %v: %s on %s", cfg.Procs, cfg.Duration, k.label, k.server)
			pr, err := runProcs(ctx, childSpec{Targets: cfg.Targets, Key: k.key, Name: runName("procs", k.key),
				Hold: cfg.Hold, Duration: cfg.Duration, Delay: cfg.Latency}, cfg.Procs)
			if err != nil {
				return nil, fmt.Errorf("%s: processes: %w", k.label, err)
			}
			st := pr.stats(cfg.Procs, cfg.Duration)
			r.Locks[i].Procs = &st
			if st.Overlaps > 0 {
				logf("%s: %d acquisitions returned before the holder released", k.label, st.Overlaps)
			}
		}
	}
	r.Machine.LoadEnd = loadAvg()
	return r, nil
}

// pairs runs the uncontended pair of every lock, in rounds that each take
// every lock in turn, through a proxy adding delay each way when through is
// set; and counts each lock's round trips per pair.
func pairs(ctx context.Context, ks []kind, cfg config, through bool, delay time.Duration, logf func(string, ...any)) ([]*pairResult, error) {
	samples := make([][]time.Duration, len(ks))
	allocs := make([][2]uint64, len(ks))
	how := "on loopback"
	if through {
		how = fmt.Sprintf("%v each way", delay)
	}
	for round := range cfg.Rounds {
		logf("uncontended pairs, %s, round %d of %d", how, round+1, cfg.Rounds)
		for j := range ks {
			i := (j + round) % len(ks) // each round starts with another lock
			addr, p, err := dial(ks[i], through, delay)
			if err != nil {
				return nil, err
			}
			var a, b uint64
			samples[i], a, b, err = pairRound(ctx, ks[i], addr, cfg.PairTime, samples[i])
			if p != nil {
				p.Close()
			}
			if err != nil {
				return nil, fmt.Errorf("%s: uncontended pair: %w", ks[i].label, err)
			}
			allocs[i][0] += a
			allocs[i][1] += b
		}
	}
	prs := make([]*pairResult, len(ks))
	for i, k := range ks {
		trips, err := pairTrips(ctx, k, delay, 20)
		if err != nil {
			return nil, fmt.Errorf("%s: counting round trips: %w", k.label, err)
		}
		s := slices.Clone(samples[i])
		slices.Sort(s)
		prs[i] = &pairResult{N: len(s), Median: percentile(s, 50), P99: percentile(s, 99),
			Allocs: allocs[i][0] / uint64(cfg.Rounds), Bytes: allocs[i][1] / uint64(cfg.Rounds), Trips: trips}
	}
	return prs, nil
}

// shellQuote quotes an argument for sh where it needs it.
func shellQuote(a string) string {
	if a != "" && strings.Trim(a, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./:=@,+-") == "" {
		return a
	}
	return "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
}

func readResults(path string) (*results, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r results
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &r, nil
}

func machineInfo() machine {
	m := machine{CPUs: runtime.NumCPU(), Go: runtime.Version(), OS: runtime.GOOS + "/" + runtime.GOARCH}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.OS += ", Linux " + strings.TrimSpace(string(b))
	}
	return m
}

// loadAvg is the 1, 5 and 15 minute load averages, where the system says.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}
