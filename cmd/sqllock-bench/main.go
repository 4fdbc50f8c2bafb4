// Command sqllock-bench runs sqllock's benchmarks against a real server,
// prints them as tables with ratios to the durable floor, and writes the
// results file and chart docs/performance.md shows:
//
//	SQLLOCK_TEST_DSN='root@tcp(127.0.0.1:3306)/test' go run ./cmd/sqllock-bench
//	go run ./cmd/sqllock-bench -chart-only   # tables and chart from bench/results.txt
//
// With -leases it measures instead one Client holding many leases with
// Lock.KeepAlive (leases.go), and prints one row per count of leases:
//
//	go run ./cmd/sqllock-bench -leases 100,1000,10000 -hold 60s -ttl 3s -dsn 'root@tcp(127.0.0.1:3306)/test'
//
// It runs go test on the package at the module root and keeps its output
// as it is, so bench/results.txt also reads with benchstat. The uncontended
// pair runs -count times, one round of every variant after another, so that
// a slow spell on a shared machine falls on every variant alike; the tables
// give medians.
package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"
)

// serverLine is how the test binary names the server it runs on
// (internal/testdsn).
var serverLine = regexp.MustCompile(`^sqllock tests: \S+ is (.+)$`)

func main() {
	log.SetFlags(0)
	log.SetPrefix("sqllock-bench: ")
	count := flag.Int("count", 5, "rounds of the uncontended pair benchmark")
	chartOnly := flag.Bool("chart-only", false, "print the tables and redraw the chart from the results file; run nothing")
	leases := flag.String("leases", "", "measure one Client keeping this many leases alive, each `N` of a comma-separated list, instead of the benchmarks")
	var lc leasesConfig
	flag.DurationVar(&lc.hold, "hold", time.Minute, "with -leases: how long to hold them")
	flag.DurationVar(&lc.ttl, "ttl", 3*time.Second, "with -leases: the leases' ttl")
	flag.StringVar(&lc.dsn, "dsn", "", "with -leases: go-sql-driver/mysql `DSN` of the server (a table of its own is created and dropped)")
	flag.IntVar(&lc.pool, "pool", 32, "with -leases: the *sql.DB's open (and idle) connections")
	flag.IntVar(&lc.workers, "workers", 32, "with -leases: goroutines acquiring and releasing")
	flag.DurationVar(&lc.acquireLimit, "acquire-limit", 0, "with -leases: stop acquiring after this long and hold what was acquired (0: no limit)")
	flag.IntVar(&lc.slots, "slots", 0, "with -leases: hold each lease as a slot of a semaphore of this many slots (at most 64), not a name of its own")
	flag.IntVar(&lc.serverPID, "server-pid", 0, "with -leases: the server's `pid`, for its CPU time, when its @@pid_file cannot be read here")
	cpuProfile := flag.String("cpuprofile", "", "with -leases: write this process's CPU profile to `file`")
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			log.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}

	if *leases != "" {
		var err error
		if lc.counts, err = parseCounts(*leases); err != nil {
			log.Fatal(err)
		}
		if lc.dsn == "" {
			log.Fatal("-leases needs -dsn, e.g. -dsn 'root@tcp(127.0.0.1:3306)/test'")
		}
		if err := runLeases(lc); err != nil {
			pprof.StopCPUProfile()
			log.Fatal(err)
		}
		return
	}

	root, err := moduleRoot()
	if err != nil {
		log.Fatal(err)
	}
	resultsPath := filepath.Join(root, "bench", "results.txt")
	chartPath := filepath.Join(root, "bench", "chart.svg")

	if !*chartOnly {
		if os.Getenv("SQLLOCK_TEST_DSN") == "" {
			log.Fatal("set SQLLOCK_TEST_DSN to the server to run against, e.g. root@tcp(127.0.0.1:3306)/test")
		}
		out, err := run(root, *count)
		if err != nil {
			log.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(resultsPath), 0o755); err != nil {
			log.Fatal(err)
		}
		if err := os.WriteFile(resultsPath, out, 0o644); err != nil {
			log.Fatal(err)
		}
	}
	text, err := os.ReadFile(resultsPath)
	if err != nil {
		log.Fatal(err)
	}
	r := parse(text)
	r.printTables(os.Stdout)
	if err := os.WriteFile(chartPath, []byte(r.chart()), 0o644); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("\nwrote %s\n", relTo(root, chartPath))
	if !*chartOnly {
		fmt.Printf("wrote %s\n", relTo(root, resultsPath))
	}
}

func relTo(root, p string) string {
	if r, err := filepath.Rel(root, p); err == nil {
		return r
	}
	return p
}

// moduleRoot finds the directory of the go.mod above the working directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory; run it inside the sqllock module")
		}
		dir = parent
	}
}

// run runs the benchmarks and returns the results file: a header saying
// where they ran, then go test's output.
func run(root string, count int) ([]byte, error) {
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "# sqllock benchmarks, written by go run ./cmd/sqllock-bench -count %d\n", count)
	fmt.Fprintf(&buf, "# machine: %d CPUs, %s, %s\n", runtime.NumCPU(), cpuModel(), goVersion(root))
	type step struct {
		what string
		args []string
	}
	var steps []step
	for i := range count {
		steps = append(steps, step{fmt.Sprintf("pair, round %d of %d", i+1, count),
			[]string{"-bench", "^BenchmarkPair$"}})
	}
	steps = append(steps,
		step{"handoffs and many names", []string{"-bench", "^Benchmark(Handoff|Names)$"}},
		step{"cross-process handoffs", []string{"-bench", "^BenchmarkCrossProcess$", "-benchtime", "40x"}},
		step{"four processes on one name", []string{"-bench", "^BenchmarkContention$", "-benchtime", "1x"}},
	)
	var server string
	for _, s := range steps {
		log.Printf("running %s", s.what)
		args := append([]string{"test", "-run", "^$", "-benchmem", "-count", "1"}, s.args...)
		cmd := exec.Command("go", append(args, ".")...)
		cmd.Dir = root
		cmd.Stderr = os.Stderr
		out, err := cmd.Output()
		if err != nil {
			os.Stderr.Write(out)
			return nil, fmt.Errorf("go %s: %w", strings.Join(args, " "), err)
		}
		for line := range strings.Lines(string(out)) {
			// The test binary logs the server it found: "sqllock tests:
			// LABEL is VERSION".
			if m := serverLine.FindStringSubmatch(strings.TrimSpace(line)); m != nil && server == "" {
				server = strings.TrimSpace(m[1])
				fmt.Fprintf(&buf, "# server: %s\n", server)
			}
			if strings.HasPrefix(line, "Benchmark") || (s.what == steps[0].what && isHeader(line)) {
				buf.WriteString(line)
			}
		}
	}
	if server == "" {
		return nil, errors.New("the benchmarks did not say which server they ran on; did they skip?")
	}
	return buf.Bytes(), nil
}

func isHeader(line string) bool {
	for _, p := range []string{"goos:", "goarch:", "pkg:", "cpu:"} {
		if strings.HasPrefix(line, p) {
			return true
		}
	}
	return false
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	for line := range strings.Lines(string(b)) {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}

func goVersion(root string) string {
	cmd := exec.Command("go", "version")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return runtime.Version()
	}
	return strings.TrimSpace(string(out))
}

// results are the parsed results file: the header comments, and each
// benchmark's samples by unit, in the order the benchmarks first appear.
type results struct {
	header  []string
	names   []string
	samples map[string]map[string][]float64
}

func parse(text []byte) *results {
	r := &results{samples: map[string]map[string][]float64{}}
	sc := bufio.NewScanner(bytes.NewReader(text))
	for sc.Scan() {
		line := sc.Text()
		if c, ok := strings.CutPrefix(line, "# "); ok {
			r.header = append(r.header, c)
			continue
		}
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		// "BenchmarkPair/floor-2": drop the GOMAXPROCS suffix.
		name := strings.TrimPrefix(f[0], "Benchmark")
		if i := strings.LastIndex(name, "-"); i > 0 {
			if _, err := strconv.Atoi(name[i+1:]); err == nil {
				name = name[:i]
			}
		}
		m := r.samples[name]
		if m == nil {
			m = map[string][]float64{}
			r.samples[name] = m
			r.names = append(r.names, name)
		}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err == nil {
				m[f[i+1]] = append(m[f[i+1]], v)
			}
		}
	}
	return r
}

// median returns the median of a benchmark's samples in unit, or NaN.
func (r *results) median(name, unit string) float64 {
	v := slices.Clone(r.samples[name][unit])
	if len(v) == 0 {
		return math.NaN()
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

func (r *results) withPrefix(p string) []string {
	var out []string
	for _, n := range r.names {
		if strings.HasPrefix(n, p) {
			out = append(out, n)
		}
	}
	return out
}

// pairNotes says what each variant of the pair benchmark is.
var pairNotes = map[string]string{
	"floor":                    "two prepared single-row UPDATE commits: the least a durable acquire+release costs",
	"sqllock":                  "TryAcquire + Release",
	"driver":                   "sqllock's two statements run directly: the driver's own cost",
	"seedDeleteInsert":         "recipe as written: DELETE expired, INSERT, DELETE, each with db.ExecContext",
	"seedSelectUpsert":         "recipe as written: SELECT, INSERT ... ON DUPLICATE KEY UPDATE, UPDATE, each with db.ExecContext",
	"seedDeleteInsertPrepared": "the same recipe over statements prepared once",
	"seedSelectUpsertPrepared": "the same recipe over statements prepared once",
	"getLock":                  "GET_LOCK + RELEASE_LOCK on a pinned connection: no lease, nothing written",
}

func (r *results) printTables(w io.Writer) {
	for _, h := range r.header {
		fmt.Fprintf(w, "%s  \n", h)
	}
	floor := r.median("Pair/floor", "ns/op")
	n := len(r.samples["Pair/floor"]["ns/op"])
	fmt.Fprintf(w, "\nUncontended acquire + release (median of %d rounds; ratio to the floor in the same run)\n\n", n)
	fmt.Fprintln(w, "| variant | µs per pair | × floor | allocs | bytes | what it is |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | --- |")
	for _, name := range r.withPrefix("Pair/") {
		ns := r.median(name, "ns/op")
		v := strings.TrimPrefix(name, "Pair/")
		fmt.Fprintf(w, "| %s | %.0f | %.2f | %.0f | %.0f | %s |\n", v, ns/1e3, ns/floor,
			r.median(name, "allocs/op"), r.median(name, "B/op"), pairNotes[v])
	}

	fmt.Fprintln(w, "\nHandoffs on one name: Acquire, then Release at once (default RetryStrategy; through a counting proxy)")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| run | handoffs/s | statements per handoff | latency p50 (µs) | p99 (µs) | to another Client |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | ---: |")
	for _, name := range r.withPrefix("Handoff/") {
		fmt.Fprintf(w, "| %s | %.0f | %.2f | %.0f | %.0f | %.0f%% |\n", strings.TrimPrefix(name, "Handoff/"),
			r.median(name, "handoffs/s"), r.median(name, "stmts/handoff"),
			r.median(name, "p50-µs"), r.median(name, "p99-µs"), 100*r.median(name, "cross/handoff"))
	}

	fmt.Fprintln(w, "\nCross-process handoffs: 4 Clients take turns, each handoff to another Client, found by polling")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| run | latency p50 (ms) | p99 (ms) | polls/s per waiting process | statements per handoff |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: |")
	for _, name := range r.withPrefix("CrossProcess/") {
		fmt.Fprintf(w, "| %s | %.1f | %.1f | %.1f | %.1f |\n", strings.TrimPrefix(name, "CrossProcess/"),
			r.median(name, "p50-µs")/1e3, r.median(name, "p99-µs")/1e3,
			r.median(name, "polls/s/waiter"), r.median(name, "stmts/handoff"))
	}

	fmt.Fprintln(w, "\nFour processes on one name (a set of two: set; a semaphore of one slot: slot), each looping acquire, hold 50 ms, Release, for 20 s")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| run | to another process | p50 (ms) | p99 (ms) | least share | polls/s per waiting process | channel statements per acquisition |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, name := range r.withPrefix("Contention/") {
		fmt.Fprintf(w, "| %s | %.0f%% | %.1f | %.1f | %.0f%% | %s | %s |\n", strings.TrimPrefix(name, "Contention/"),
			100*r.median(name, "cross/acq"), r.median(name, "p50-µs")/1e3, r.median(name, "p99-µs")/1e3,
			100*r.median(name, "min-share"), orDash(r.median(name, "polls/s/waiter")), orDash(r.median(name, "chan-stmts/acq")))
	}

	fmt.Fprintln(w, "\nMany names: K goroutines, each on a name of its own, one Client")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| K | pairs/s |")
	fmt.Fprintln(w, "| ---: | ---: |")
	for _, name := range r.withPrefix("Names/") {
		fmt.Fprintf(w, "| %s | %.0f |\n", strings.TrimPrefix(name, "Names/K="), r.median(name, "pairs/s"))
	}
}

// orDash prints v with one decimal, or a dash for a figure the run does
// not report.
func orDash(v float64) string {
	if math.IsNaN(v) {
		return "–"
	}
	return fmt.Sprintf("%.1f", v)
}

// chart draws the uncontended pair's variants as horizontal bars of their
// median time, labelled with the ratio to the floor.
func (r *results) chart() string {
	names := r.withPrefix("Pair/")
	floor := r.median("Pair/floor", "ns/op")
	var top float64
	for _, n := range names {
		top = max(top, r.median(n, "ns/op"))
	}
	// The label column fits the longest variant name (about 8 px a
	// character at 13 px), and the right margin fits "1234 µs  1.23×".
	longest := 0
	for _, n := range names {
		longest = max(longest, len(strings.TrimPrefix(n, "Pair/")))
	}
	const barMax, rowH, head = 380, 30, 46
	left := 16 + 8*longest
	width := left + barMax + 130
	height := head + rowH*len(names) + 40
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="13">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="10" y="20" font-size="15" font-weight="bold">Uncontended acquire + release, µs per pair (median)</text>`+"\n")
	server := ""
	for _, h := range r.header {
		if v, ok := strings.CutPrefix(h, "server: "); ok {
			server = v
		}
	}
	fmt.Fprintf(&b, `<text x="10" y="37" fill="#555">%s; label: ratio to the durable floor</text>`+"\n", xmlEscape(server))
	for i, n := range names {
		ns := r.median(n, "ns/op")
		y := head + i*rowH
		w := int(math.Round(barMax * ns / top))
		color := "#9aa5b1"
		switch strings.TrimPrefix(n, "Pair/") {
		case "sqllock":
			color = "#2b6cb0"
		case "floor":
			color = "#2f855a"
		}
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", left-8, y+17, xmlEscape(strings.TrimPrefix(n, "Pair/")))
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="%s"/>`+"\n", left, y+4, max(w, 1), rowH-8, color)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%.0f µs  %.2f×</text>`+"\n", left+w+6, y+17, ns/1e3, ns/floor)
	}
	fmt.Fprintf(&b, `<text x="10" y="%d" fill="#555" font-size="11">go run ./cmd/sqllock-bench; data: bench/results.txt</text>`+"\n", height-12)
	b.WriteString("</svg>\n")
	return b.String()
}

var xmlEscaper = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;")

func xmlEscape(s string) string { return xmlEscaper.Replace(s) }
