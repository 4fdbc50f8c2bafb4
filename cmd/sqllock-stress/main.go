// Command sqllock-stress checks sqllock's promises on a real server: P
// separate processes of G goroutines contend for N names with short leases,
// some holders stall past their lease on purpose, and every critical section
// writes to a protected resource that accepts only fenced writes.
//
//	go run ./cmd/sqllock-stress -dsn 'root@tcp(127.0.0.1:3306)/test' \
//	    -procs 4 -goroutines 8 -names 4 -duration 60s -ttl 100ms -stall-fraction 0.1
//
// The parent process starts the children (itself, again, with a hidden
// flag), gathers the critical sections they report as JSON lines, and
// checks them: two holders of one name whose sections overlapped while both
// leases were live by the server's clock, a fence issued twice, or fences
// out of acquisition order are violations. It prints a summary, writes it to
// the file -record names, and exits 1 on any violation or unexpected error.
//
// It creates two tables of its own (a lock table and its resource table,
// named after -table with a random suffix) and drops them at the end.
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
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/sqllock/sqllock"
)

type config struct {
	dsn           string
	procs         int
	goroutines    int
	names         int
	duration      time.Duration
	ttl           time.Duration
	stallFraction float64
	table         string
	record        string
	keep          bool
	// Hidden: set by the parent for its children.
	child  int
	stopAt int64 // unix ms
	broken bool  // -selftest-broken: children ignore refusals, to test the checker
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
	if cfg.child >= 0 {
		if err := runChild(ctx, cfg, stdout); err != nil {
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
	fs.StringVar(&cfg.dsn, "dsn", os.Getenv("SQLLOCK_TEST_DSN"), "go-sql-driver/mysql DSN of the server (default $SQLLOCK_TEST_DSN)")
	fs.IntVar(&cfg.procs, "procs", 3, "processes")
	fs.IntVar(&cfg.goroutines, "goroutines", 4, "goroutines per process")
	fs.IntVar(&cfg.names, "names", 2, "lock names contended for")
	fs.DurationVar(&cfg.duration, "duration", 10*time.Second, "how long the processes contend")
	fs.DurationVar(&cfg.ttl, "ttl", 100*time.Millisecond, "lease length")
	fs.Float64Var(&cfg.stallFraction, "stall-fraction", 0.1, "fraction of holders that stall past their lease without refreshing")
	fs.StringVar(&cfg.table, "table", "sqllock_stress", "prefix of the tables the run creates and drops")
	fs.StringVar(&cfg.record, "record", "", "also write the summary to this file")
	fs.BoolVar(&cfg.keep, "keep", false, "keep the tables after the run")
	fs.IntVar(&cfg.child, "child", -1, "internal: run as child number N")
	fs.Int64Var(&cfg.stopAt, "stop-at", 0, "internal: when children stop, unix ms")
	fs.BoolVar(&cfg.broken, "selftest-broken", false, "internal: children work on names they were refused, to show the checker catches it")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	var bad []string
	if cfg.dsn == "" {
		bad = append(bad, "-dsn is required (or set SQLLOCK_TEST_DSN)")
	}
	if cfg.procs < 1 || cfg.goroutines < 1 || cfg.names < 1 {
		bad = append(bad, "-procs, -goroutines and -names must be at least 1")
	}
	if cfg.ttl < sqllock.MinTTL || cfg.duration <= 0 {
		bad = append(bad, "-ttl must be at least 1ms and -duration positive")
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
	childErrors []string
	resource    []string // mismatches between the resource table and the records
	text        string
}

func (s summary) pass() bool {
	return s.violations() == 0 && len(s.childErrors) == 0 && len(s.resource) == 0
}

func runParent(ctx context.Context, cfg config, stderr io.Writer) (summary, error) {
	lockDB, resDB, err := openDBs(cfg.dsn)
	if err != nil {
		return summary{}, err
	}
	defer lockDB.Close()
	defer resDB.Close()
	var version string
	if err := lockDB.QueryRowContext(ctx, "SELECT VERSION()").Scan(&version); err != nil {
		return summary{}, err
	}
	var suffix [4]byte
	_, _ = rand.Read(suffix[:])
	cfg.table = cfg.table + "_" + hex.EncodeToString(suffix[:])
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
	cfg.stopAt = time.Now().Add(cfg.duration).UnixMilli()
	var (
		mu      sync.Mutex
		records []record
		reports []childReport
		wg      sync.WaitGroup
		errs    []string
	)
	for i := range cfg.procs {
		cmd := exec.CommandContext(ctx, exe, childArgs(cfg, i)...)
		cmd.Stderr = stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			return summary{}, err
		}
		if err := cmd.Start(); err != nil {
			return summary{}, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var rs []record
			var rep *childReport
			sc := bufio.NewScanner(out)
			sc.Buffer(nil, 1<<20)
			for sc.Scan() {
				var l struct {
					record
					childReport
				}
				if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Sprintf("child %d: %v in %q", i, err, sc.Text()))
					mu.Unlock()
					continue
				}
				if l.Done {
					rep = &l.childReport
				} else {
					rs = append(rs, l.record)
				}
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
				errs = append(errs, rep.Errors...)
			}
		}()
	}
	wg.Wait()

	sum := summary{findings: check(records), childErrors: errs}
	sum.resource, err = checkResource(ctx, resDB, cfg, records)
	if err != nil {
		return summary{}, err
	}
	sum.text = format(cfg, version, sum, reports)
	return sum, nil
}

func childArgs(cfg config, i int) []string {
	args := []string{
		"-child=" + strconv.Itoa(i),
		"-dsn=" + cfg.dsn,
		"-table=" + cfg.table,
		"-goroutines=" + strconv.Itoa(cfg.goroutines),
		"-names=" + strconv.Itoa(cfg.names),
		"-ttl=" + cfg.ttl.String(),
		"-duration=" + cfg.duration.String(),
		"-stall-fraction=" + strconv.FormatFloat(cfg.stallFraction, 'g', -1, 64),
		"-stop-at=" + strconv.FormatInt(cfg.stopAt, 10),
	}
	if cfg.broken {
		args = append(args, "-selftest-broken")
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
	if _, err := db.ExecContext(ctx, "CREATE TABLE `"+res+"` (name VARBINARY(255) PRIMARY KEY, fence BIGINT UNSIGNED NOT NULL, writes BIGINT NOT NULL) ENGINE=InnoDB"); err != nil {
		return err
	}
	for i := range cfg.names {
		if _, err := db.ExecContext(ctx, "INSERT INTO `"+res+"` VALUES (?, 0, 0)", nameOf(i)); err != nil {
			return err
		}
	}
	return nil
}

// checkResource compares the resource table with the records: every accepted
// write counted once, and each name's fence the highest that wrote.
func checkResource(ctx context.Context, db *sql.DB, cfg config, records []record) ([]string, error) {
	wantWrites := map[string]int64{}
	wantFence := map[string]uint64{}
	for _, r := range records {
		wantWrites[r.Name] += int64(r.Accepted)
		if r.Accepted > 0 {
			wantFence[r.Name] = max(wantFence[r.Name], r.Fence)
		}
	}
	var bad []string
	for i := range cfg.names {
		name := nameOf(i)
		var fence uint64
		var writes int64
		if err := db.QueryRowContext(ctx, "SELECT fence, writes FROM `"+resourceTable(cfg.table)+"` WHERE name = ?", name).Scan(&fence, &writes); err != nil {
			return nil, err
		}
		if writes != wantWrites[name] || fence != wantFence[name] {
			bad = append(bad, fmt.Sprintf("%q: resource has fence %d after %d writes, records say %d after %d", name, fence, writes, wantFence[name], wantWrites[name]))
		}
	}
	return bad, nil
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
	p("sqllock-stress: %d processes x %d goroutines on %d names for %v, ttl %v, stall fraction %g\n",
		cfg.procs, cfg.goroutines, cfg.names, cfg.duration, cfg.ttl, cfg.stallFraction)
	p("command: go run ./cmd/sqllock-stress -dsn '%s' -procs %d -goroutines %d -names %d -duration %v -ttl %v -stall-fraction %g\n",
		redact(cfg.dsn), cfg.procs, cfg.goroutines, cfg.names, cfg.duration, cfg.ttl, cfg.stallFraction)
	p("server: %s\n", version)
	p("attempts:                 %d (refused: %d)\n", attempts, refused)
	p("acquisitions:             %d\n", s.Acquisitions)
	p("takeovers:                %d (the holder's Release found its lease taken over)\n", s.Takeovers)
	p("holders stalled past ttl: %d (faults injected)\n", s.Stalled)
	p("refreshes:                %d\n", refreshes)
	p("protected writes:         %d accepted, %d stale writes rejected by fencing\n", s.Accepted, s.StaleRejected)
	p("ordered pairs checked:    %d\n", s.OrderedPairs)
	p("violations:               %d\n", s.violations())
	p("  overlapping live leases: %d\n", len(s.Overlaps))
	p("  duplicate fences:        %d\n", len(s.Duplicates))
	p("  fences out of order:     %d\n", len(s.OutOfOrder))
	p("unexpected errors:        %d\n", len(s.childErrors))
	p("resource mismatches:      %d\n", len(s.resource))
	for _, list := range [][]string{s.Overlaps, s.Duplicates, s.OutOfOrder, s.childErrors, s.resource} {
		for i, v := range list {
			if i == 10 {
				p("  ... and %d more\n", len(list)-i)
				break
			}
			p("  %s\n", v)
		}
	}
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
