package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sqllock/sqllock"
)

// sqllock metrics serves the lock table as Prometheus metrics: at each
// scrape it reads every live lease (one List, and one Semaphore.Inspect per
// semaphore held) and writes them in the text format. A lease is seen
// whoever holds it, a process that exports nothing included, so an alert
// on a lease no longer renewed fires for any holder. A free name has no
// series, except each name given with --expect-held: a name that must
// always have a holder (a leader's) reads 0 while nobody holds it, so that
// an alert sees nobody leading.

// defaultListen is where sqllock metrics listens by default.
const defaultListen = ":9187"

func metricsCmd(ctx context.Context, args []string, stderr io.Writer) int {
	var (
		co       common
		listen   string
		expected []string
	)
	fs := newFlagSet("metrics")
	co.register(fs)
	fs.StringVar(&listen, "listen", defaultListen, "serve the lock table's metrics at http://`ADDR`/metrics (host:port)")
	fs.Func("expect-held", "a `NAME` that must always have a holder (a leader's): serve sqllock_table_name_held for it, 0 while nobody holds it; repeat for more names", func(name string) error {
		if name == "" {
			return errors.New("empty name")
		}
		if !slices.Contains(expected, name) {
			expected = append(expected, name)
		}
		return nil
	})
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: sqllock metrics [--listen ADDR] [--expect-held NAME]... [flags]")
		fs.PrintDefaults()
	}
	pos, rest, _, err := parseArgs(fs, args, 0, stderr)
	if err != nil {
		return usageStatus(err)
	}
	if len(pos)+len(rest) > 0 {
		fmt.Fprintf(stderr, "sqllock metrics: got arguments (%s), want none\n", quoteArgs(append(pos, rest...)))
		return exitUsage
	}
	if err := co.check(); err != nil {
		fmt.Fprintf(stderr, "sqllock metrics: %v\n", err)
		return exitUsage
	}
	db, client, err := co.open(limit{co.timeout, "--timeout"})
	if err != nil {
		fmt.Fprintf(stderr, "sqllock metrics: %s\n", unprefix(err.Error()))
		return exitUsage
	}
	defer db.Close()
	defer client.Close()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		fmt.Fprintf(stderr, "sqllock metrics: --listen %s: %v\n", listen, err)
		return exitUsage
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), co.timeout)
		defer cancel()
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		err := writeTable(ctx, w, client, co.table, expected)
		if err != nil {
			fmt.Fprintf(stderr, "sqllock metrics: %s\n", co.errText(err, ""))
		}
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	fmt.Fprintf(stderr, "sqllock metrics: serving the table %s at http://%s/metrics\n", co.table, ln.Addr())
	if err := srv.Serve(ln); err != nil && err != http.ErrServerClosed {
		fmt.Fprintf(stderr, "sqllock metrics: %v\n", err)
		return exitFailure
	}
	return 0
}

// tableFamilies are the families sqllock metrics writes, in order.
var tableFamilies = []struct{ name, typ, help string }{
	{"sqllock_table_up", "gauge", "1 when the lock table was read at this scrape, 0 when it could not be."},
	{"sqllock_table_leases", "gauge", "Live leases in the table, slots of semaphores included."},
	{"sqllock_table_name_held", "gauge", "1 when a name given with --expect-held has a live lease (of the lock, or a slot of the semaphore), 0 when nobody holds it."},
	{"sqllock_table_lease_held", "gauge", "1 for each live lease of a lock, with its holder."},
	{"sqllock_table_lease_age_seconds", "gauge", "How long each live lease of a lock has been held, by the server's clock."},
	{"sqllock_table_lease_ttl_seconds", "gauge", "How long each live lease of a lock has left, by the server's clock."},
	{"sqllock_table_lease_fence", "gauge", "The fencing token of each live lease of a lock."},
	{"sqllock_table_slot_held", "gauge", "1 for each held slot of a semaphore, with its holder."},
	{"sqllock_table_slot_age_seconds", "gauge", "How long each held slot of a semaphore has been held."},
	{"sqllock_table_slot_ttl_seconds", "gauge", "How long each held slot of a semaphore has left."},
	{"sqllock_table_semaphore_slots", "gauge", "The number of slots of each semaphore with a slot held."},
	{"sqllock_table_semaphore_slots_held", "gauge", "Slots held now of each semaphore with a slot held."},
	{"sqllock_table_semaphore_fence", "gauge", "The last fencing token of each semaphore with a slot held."},
}

// writeTable reads the table and writes it as metrics, with
// sqllock_table_name_held for each name of expected. When the table
// cannot be read it writes sqllock_table_up 0 and returns the error.
func writeTable(ctx context.Context, w io.Writer, c *sqllock.Client, table string, expected []string) error {
	samples := map[string][]string{} // family: its lines
	add := func(family, lbl string, v float64) {
		samples[family] = append(samples[family], family+braces(lbl)+" "+num(v))
	}
	tbl := promLabels("table", table)
	infos, err := c.List(ctx)
	var semaphores []string
	for _, info := range infos {
		if info.Slot > 0 {
			if !slices.Contains(semaphores, info.Name) {
				semaphores = append(semaphores, info.Name)
			}
			lbl := join(tbl, promLabels("name", info.Name, "slot", strconv.Itoa(info.Slot)))
			add("sqllock_table_slot_held", join(lbl, promLabels("holder", info.Holder)), 1)
			add("sqllock_table_slot_age_seconds", lbl, info.Age.Seconds())
			add("sqllock_table_slot_ttl_seconds", lbl, info.TTL.Seconds())
			continue
		}
		lbl := join(tbl, promLabels("name", info.Name))
		add("sqllock_table_lease_held", join(lbl, promLabels("holder", info.Holder)), 1)
		add("sqllock_table_lease_age_seconds", lbl, info.Age.Seconds())
		add("sqllock_table_lease_ttl_seconds", lbl, info.TTL.Seconds())
		add("sqllock_table_lease_fence", lbl, float64(info.Fence))
	}
	for _, name := range semaphores {
		if err != nil {
			break
		}
		var slots []sqllock.Info
		if slots, err = c.Semaphore(name, sqllock.MaxSlots).Inspect(ctx); err == nil {
			lbl := join(tbl, promLabels("name", name))
			held, fence := 0, uint64(0)
			for _, s := range slots {
				if s.Held {
					held++
				}
				fence = s.Fence
			}
			add("sqllock_table_semaphore_slots", lbl, float64(len(slots)))
			add("sqllock_table_semaphore_slots_held", lbl, float64(held))
			add("sqllock_table_semaphore_fence", lbl, float64(fence))
		}
	}
	if err != nil {
		samples = map[string][]string{}
		add("sqllock_table_up", tbl, 0)
	} else {
		add("sqllock_table_up", tbl, 1)
		add("sqllock_table_leases", tbl, float64(len(infos)))
		for _, name := range expected {
			held := 0.0
			if slices.ContainsFunc(infos, func(i sqllock.Info) bool { return i.Name == name }) {
				held = 1
			}
			add("sqllock_table_name_held", join(tbl, promLabels("name", name)), held)
		}
	}
	var b strings.Builder
	for _, f := range tableFamilies {
		if len(samples[f.name]) == 0 {
			continue
		}
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", f.name, f.help, f.name, f.typ)
		for _, line := range samples[f.name] {
			b.WriteString(line + "\n")
		}
	}
	if _, werr := io.WriteString(w, b.String()); err == nil {
		err = werr
	}
	return err
}

// promLabels renders label pairs (name, value, ...) in the text format,
// whose values escape only backslash, double quote and newline, and must
// be UTF-8: a byte that is not is written as U+FFFD.
func promLabels(kv ...string) string {
	var b strings.Builder
	for i := 0; i+1 < len(kv); i += 2 {
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(kv[i] + `="` + labelEscaper.Replace(strings.ToValidUTF8(kv[i+1], "\uFFFD")) + `"`)
	}
	return b.String()
}

var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
