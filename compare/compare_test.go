package main

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/xml"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sqllock/sqllock/internal/testdsn"
)

func TestMain(m *testing.M) {
	if childMain() { // the 4-process measure runs this binary as its children
		return
	}
	testdsn.QuietDriver() // the children's log is the measure's own
	os.Exit(m.Run())
}

// testConfig is the short run against the servers on this machine: the
// MySQL server of SQLLOCK_COMPARE_DSNS or SQLLOCK_TEST_DSN (default
// 127.0.0.1:3306), Redis on 6379 and PostgreSQL on 5432. A server that
// does not answer skips the test, naming it, or fails it when CI is set.
func testConfig(t *testing.T) config {
	t.Helper()
	cfg := defaultConfig()
	cfg.short()
	if v := os.Getenv("SQLLOCK_COMPARE_DSNS"); v != "" {
		cfg.Targets.DSNs = strings.Fields(v)
	} else if v := os.Getenv("SQLLOCK_TEST_DSN"); v != "" {
		cfg.Targets.DSNs = []string{v}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var missing []string
	for _, dsn := range cfg.Targets.DSNs {
		if err := pingSQL(ctx, "mysql", dsn); err != nil {
			missing = append(missing, "MySQL or MariaDB at "+dsn+" (SQLLOCK_TEST_DSN): "+err.Error())
		}
	}
	rdb := redis.NewClient(&redis.Options{Addr: cfg.Targets.Redis})
	if err := rdb.Ping(ctx).Err(); err != nil {
		missing = append(missing, "Redis at "+cfg.Targets.Redis+": "+err.Error())
	}
	rdb.Close()
	if err := pingSQL(ctx, "postgres", cfg.Targets.Postgres); err != nil {
		missing = append(missing, "PostgreSQL at "+cfg.Targets.Postgres+": "+err.Error())
	}
	if len(missing) > 0 {
		msg := "start these servers: " + strings.Join(missing, "; ")
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	cfg.Out = t.TempDir()
	cfg.Command = "go test -run TestRun_short"
	return cfg
}

func pingSQL(ctx context.Context, driver, dsn string) error {
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	return db.PingContext(ctx)
}

// TestRun_short runs every lock through every measure, as -short does, and
// checks what the harness must get right whatever the machine's load.
func TestRun_short(t *testing.T) {
	cfg := testConfig(t)
	var log strings.Builder
	r, err := run(context.Background(), cfg, &log)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, log.String())
	}
	kinds, err := cfg.Targets.kinds()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(r.Locks), len(kinds); got != want {
		t.Fatalf("got %d locks, want %d", got, want)
	}
	for _, l := range r.Locks {
		p := l.Pair
		if p == nil || p.N == 0 || p.Median <= 0 || p.P99 < p.Median || p.Allocs == 0 {
			t.Errorf("%s: pair %+v", l.Label, p)
			continue
		}
		// Round trips per pair, counted by the proxy, are what each lock
		// sends: a statement with arguments through db.ExecContext is a
		// prepare and an execute.
		want := map[string]float64{"sqllock": 2, "GET_LOCK": 2, "bsm/redislock": 2, "PostgreSQL advisory lock": 2,
			"seed delete-insert": 6, "seed select-upsert": 6, "seed delete-insert, prepared": 3, "seed select-upsert, prepared": 3}
		if w, ok := want[l.Label]; ok && p.Trips != w {
			t.Errorf("%s: got %v round trips per pair, want %v", l.Label, p.Trips, w)
		}
		if l.PairOnly {
			if l.Local != nil || l.Procs != nil {
				t.Errorf("%s: a lock without a wait was run contended", l.Label)
			}
			continue
		}
		if l.Local == nil || l.Local.Acquisitions == 0 || l.Local.Errors != 0 {
			t.Errorf("%s: goroutines %+v", l.Label, l.Local)
		}
		s := l.Procs
		if s == nil || s.Acquisitions == 0 {
			t.Errorf("%s: processes %+v", l.Label, s)
			continue
		}
		if s.Overlaps != 0 || s.Errors != 0 {
			t.Errorf("%s: %d overlapping holders, %d errors (first: %s)", l.Label, s.Overlaps, s.Errors, s.FirstErr)
		}
		var sum float64
		for _, v := range s.Shares {
			sum += v
		}
		if len(s.Shares) != cfg.Procs || sum < 99.9 || sum > 100.1 {
			t.Errorf("%s: shares %v, want %d summing to 100", l.Label, s.Shares, cfg.Procs)
		}
		// Every acquisition sends its acquire and its release at least.
		if s.TripsPerAcq < 2 {
			t.Errorf("%s: got %.2f round trips per acquisition, want at least 2", l.Label, s.TripsPerAcq)
		}
	}

	// The files, and the docs/performance.md table from them.
	if err := r.write(cfg.Out); err != nil {
		t.Fatal(err)
	}
	for _, f := range r.files(cfg.Out) {
		if fi, err := os.Stat(f); err != nil || fi.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
	svg, err := os.ReadFile(filepath.Join(cfg.Out, "chart.svg"))
	if err != nil {
		t.Fatal(err)
	}
	if err := xml.Unmarshal(svg, new(struct{})); err != nil {
		t.Errorf("chart.svg is not XML: %v", err)
	}
	back, err := readResults(filepath.Join(cfg.Out, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var md strings.Builder
	back.markdown(&md)
	for _, l := range r.Locks {
		if !strings.Contains(md.String(), "| "+l.Label+" | ") {
			t.Errorf("markdown has no row for %s:\n%s", l.Label, md.String())
		}
	}
}

// TestProxy_countsRoundTrips sends requests through the proxy to an echo
// server: each request and its reply is one round trip, however many
// writes the request takes, and each costs at least the delay both ways.
func TestProxy_countsRoundTrips(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					io.WriteString(c, line)
				}
			}()
		}
	}()
	for _, delay := range []time.Duration{0, 2 * time.Millisecond} {
		p, err := newProxy(ln.Addr().String(), delay)
		if err != nil {
			t.Fatal(err)
		}
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatal(err)
		}
		r := bufio.NewReader(c)
		const n = 10
		start := time.Now()
		for i := range n {
			// Two writes for one request: still one round trip.
			io.WriteString(c, "ping ")
			io.WriteString(c, strings.Repeat("x", i)+"\n")
			if _, err := r.ReadString('\n'); err != nil {
				t.Fatal(err)
			}
		}
		elapsed := time.Since(start)
		c.Close()
		p.Close()
		if got := p.RoundTrips(); got != n {
			t.Errorf("delay %v: got %d round trips, want %d", delay, got, n)
		}
		if least := n * 2 * delay; elapsed < least {
			t.Errorf("delay %v: %d round trips took %v, want at least %v", delay, n, elapsed, least)
		}
	}
}

// TestStats reads the figures off a known sequence of acquisitions.
func TestStats(t *testing.T) {
	ms := int64(time.Millisecond)
	// Process 0 holds twice in a row, then 1 (2 ms after 0's release
	// returned), then 2 (its acquire returned 1 ms before 1's release did),
	// then 0 (4 ms after).
	r := procRun{
		Events: []event{
			{Proc: 1, T0: 0, T1: 120 * ms, T2: 170 * ms, T3: 171 * ms},
			{Proc: 0, T0: 0, T1: 1 * ms, T2: 51 * ms, T3: 52 * ms, TripsAcq: 1, TripsRel: 1},
			{Proc: 0, T0: 52 * ms, T1: 60 * ms, T2: 110 * ms, T3: 118 * ms},
			{Proc: 2, T0: 0, T1: 170 * ms, T2: 220 * ms, T3: 221 * ms},
			{Proc: 0, T0: 118 * ms, T1: 225 * ms, T2: 275 * ms, T3: 276 * ms},
		},
		Summaries: []childSummary{
			// 3 acquisitions of 1 round trip each: 7 were spent waiting.
			{Proc: 0, WaitNs: int64(time.Second), MaxWait: int64(300 * time.Millisecond), WaitTrip: 10, BaseTrips: 1, Trips: 20},
			// 1 acquisition of 2 round trips: 7 were spent waiting.
			{Proc: 1, WaitNs: int64(time.Second), MaxWait: int64(2 * time.Second), WaitTrip: 9, BaseTrips: 2, Trips: 10},
		},
	}
	st := r.stats(4, time.Second)
	if st.Acquisitions != 5 || st.Handoffs != 3 || st.CrossPct != 75 {
		t.Errorf("got %d acquisitions, %d handoffs (%v %%), want 5, 3 (75 %%)", st.Acquisitions, st.Handoffs, st.CrossPct)
	}
	if st.Early != 1 || st.Overlaps != 0 {
		t.Errorf("got %d early, %d overlaps, want 1, 0", st.Early, st.Overlaps)
	}
	// Latencies 2 ms, 0 (early) and 4 ms.
	if st.P50 != 2*time.Millisecond || st.P99 != 4*time.Millisecond {
		t.Errorf("got p50 %v, p99 %v, want 2ms, 4ms", st.P50, st.P99)
	}
	if want := []float64{60, 20, 20, 0}; !equal(st.Shares, want) {
		t.Errorf("got shares %v, want %v", st.Shares, want)
	}
	if st.TripsPerAcq != 6 || st.WaitTripsPerS != 7 {
		t.Errorf("got %v round trips per acquisition, %v per second waiting, want 6, 7", st.TripsPerAcq, st.WaitTripsPerS)
	}

	if st.LongestWait != 2*time.Second {
		t.Errorf("got longest wait %v, want 2s", st.LongestWait)
	}

	// A holder that acquired before the previous one began to release.
	r.Events[3].T1 = 160 * ms
	if st := r.stats(4, time.Second); st.Overlaps != 1 {
		t.Errorf("got %d overlaps, want 1", st.Overlaps)
	}
}

func equal(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestKinds_variantsAndServers checks that each MySQL server gets every
// sqllock variant, GET_LOCK and the recipes, under keys that tell the
// servers apart, and that the table names are used as given.
func TestKinds_variantsAndServers(t *testing.T) {
	tg := targets{DSNs: []string{"root@tcp(127.0.0.1:3306)/test", "root@tcp(127.0.0.1:3307)/test"}}
	ks, err := tg.kinds()
	if err != nil {
		t.Fatal(err)
	}
	perServer := len(sqllockVariants) + 1 + 4
	if got, want := len(ks), 2*perServer; got != want {
		t.Fatalf("got %d kinds, want %d", got, want)
	}
	seen := map[string]bool{}
	for _, k := range ks {
		if seen[k.key] {
			t.Errorf("key %q twice", k.key)
		}
		seen[k.key] = true
	}
	if ks[0].addr != "127.0.0.1:3306" || ks[perServer].addr != "127.0.0.1:3307" {
		t.Errorf("got addresses %s, %s", ks[0].addr, ks[perServer].addr)
	}
	if _, err := (targets{DSNs: []string{"not a dsn"}}).kinds(); err == nil {
		t.Error("a bad DSN was accepted")
	}
}
