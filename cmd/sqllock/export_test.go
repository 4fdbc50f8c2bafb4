package main

import (
	"context"
	"encoding/json"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/testdsn"
)

// parseText parses Prometheus's text format strictly enough for these
// tests: each sample line is a valid name, labels with only the format's
// escapes, and a number, and each family has its # TYPE before its
// samples. It returns the samples by their name and labels as written.
func parseText(t *testing.T, text string) map[string]float64 {
	t.Helper()
	samples := map[string]float64{}
	typed := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		if f, ok := strings.CutPrefix(line, "# TYPE "); ok {
			typed[strings.Fields(f)[0]] = true
			continue
		}
		if strings.HasPrefix(line, "# HELP ") || line == "" {
			continue
		}
		m := sampleLine.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("not a sample line: %q", line)
		}
		family := m[1]
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(family, suffix); ok && typed[base] {
				family = base
			}
		}
		if !typed[family] {
			t.Errorf("%q comes before its # TYPE", line)
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		samples[m[1]+m[2]] = v
	}
	return samples
}

var sampleLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*")*\})? (\S+)$`)

// sqllock metrics serves the table as a scrape reads it: each live lease
// with its holder, age, time left and fence, each held slot and its
// semaphore; a lease held for an hour shows as an hour old, whoever holds
// it; a lease released is gone at the next scrape; and a name given with
// --expect-held reads 1 while held and 0 while free.
func TestMetricsCmd_table(t *testing.T) {
	testdsn.Each(t, func(t *testing.T, s testdsn.Server) {
		e := newEnv(t, s.DSN)
		ctx := context.Background()
		addr := freeAddr(t)
		cmd, wait := e.start("metrics", "--listen", addr, "--expect-held", "nightly", "--expect-held", "exports", "--expect-held", "idle")
		t.Cleanup(func() { _ = cmd.Process.Kill(); wait() })
		c := e.client(sqllock.WithHolder(`web-1 "blue"`))
		odd := "job\nwith\x00bytes\xff"
		l, err := c.TryAcquire(ctx, "nightly", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.TryAcquire(ctx, odd, time.Minute); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Semaphore("exports", 3).TryAcquire(ctx, time.Minute); err != nil {
			t.Fatal(err)
		}
		// As if held for an hour, by a process that exports nothing.
		if _, err := e.db.ExecContext(ctx, "UPDATE `"+e.table+"` SET acquired_at = acquired_at - INTERVAL 1 HOUR WHERE name = 'nightly' AND kind = 'L'"); err != nil {
			t.Fatal(err)
		}
		var text string
		waitFor(t, 10*time.Second, "sqllock metrics to answer", func() bool {
			text = scrape(addr)
			return text != ""
		})
		got := parseText(t, text)
		tbl := `table="` + e.table + `"`
		nightly := `{` + tbl + `,name="nightly"}`
		want := map[string]float64{
			`sqllock_table_up{` + tbl + `}`:                                                                                     1,
			`sqllock_table_leases{` + tbl + `}`:                                                                                 3,
			`sqllock_table_lease_held{` + tbl + `,name="nightly",holder="web-1 \"blue\""}`:                                      1,
			`sqllock_table_lease_fence` + nightly:                                                                               float64(l.Fence()),
			`sqllock_table_slot_held{` + tbl + `,name="exports",slot="1",holder="web-1 \"blue\""}`:                              1,
			`sqllock_table_semaphore_slots{` + tbl + `,name="exports"}`:                                                         3,
			`sqllock_table_semaphore_slots_held{` + tbl + `,name="exports"}`:                                                    1,
			`sqllock_table_lease_held{` + tbl + `,name="job\nwith` + "\x00" + `bytes` + "\uFFFD" + `",holder="web-1 \"blue\""}`: 1,
			`sqllock_table_name_held` + nightly:                                                                                 1,
			`sqllock_table_name_held{` + tbl + `,name="exports"}`:                                                               1,
			`sqllock_table_name_held{` + tbl + `,name="idle"}`:                                                                  0,
		}
		for k, v := range want {
			if g, ok := got[k]; !ok || g != v {
				t.Errorf("%s: got %v (present %v), want %v", k, g, ok, v)
			}
		}
		if age := got["sqllock_table_lease_age_seconds"+nightly]; age < 3600 || age > 3700 {
			t.Errorf("nightly's age: got %v, want about 3600", age)
		}
		if ttl := got["sqllock_table_lease_ttl_seconds"+nightly]; ttl <= 0 || ttl > 60 {
			t.Errorf("nightly's ttl left: got %v, want in (0, 60]", ttl)
		}
		if f := got[`sqllock_table_semaphore_fence{`+tbl+`,name="exports"}`]; f <= 0 {
			t.Errorf("the semaphore's fence: got %v, want above 0", f)
		}

		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		got = parseText(t, scrape(addr))
		if _, ok := got["sqllock_table_lease_age_seconds"+nightly]; ok {
			t.Error("a released lease is still served")
		}
		if n := got[`sqllock_table_leases{`+tbl+`}`]; n != 2 {
			t.Errorf("leases after a release: got %v, want 2", n)
		}
		if v, ok := got["sqllock_table_name_held"+nightly]; !ok || v != 0 {
			t.Errorf("nightly released: sqllock_table_name_held got %v (present %v), want 0", v, ok)
		}

		// A table it cannot read: up 0, and nothing else.
		if _, err := e.db.ExecContext(ctx, "RENAME TABLE `"+e.table+"` TO `"+e.table+"_away`"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.db.Exec("DROP TABLE IF EXISTS `" + e.table + "_away`") })
		got = parseText(t, scrape(addr))
		if v, ok := got[`sqllock_table_up{`+tbl+`}`]; !ok || v != 0 || len(got) != 1 {
			t.Errorf("a missing table: got %v, want only sqllock_table_up 0", got)
		}
	})
}

// The alerting rules of otel/alerts.yml read only series that sqllock
// metrics (sqllock_table_) and run's metrics (sqllock_run_ and the rest)
// write.
func TestAlerts_seriesWritten(t *testing.T) {
	b, err := os.ReadFile("../../otel/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	written := writtenSeries()
	found := 0
	// Every line of an expression: an expr: line and the lines of its
	// block, up to the rule's next key.
	inExpr := false
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "expr:"):
			inExpr = true
		case strings.HasPrefix(line, "#") || line == "":
			continue
		case inExpr && regexp.MustCompile(`^(- )?[a-z_]+:`).MatchString(line):
			inExpr = false
		}
		if !inExpr {
			continue
		}
		for _, n := range regexp.MustCompile(`\bsqllock_[a-z_]+`).FindAllString(regexp.MustCompile(`\{[^}]*\}`).ReplaceAllString(line, ""), -1) {
			found++
			if !written[n] {
				t.Errorf("alerts.yml reads %s, which neither sqllock metrics nor sqllock run writes", n)
			}
		}
	}
	if found == 0 {
		t.Fatal("no series found in alerts.yml")
	}
}

// writtenSeries returns the series sqllock metrics and run's metrics write.
func writtenSeries() map[string]bool {
	written := map[string]bool{}
	for _, f := range tableFamilies {
		written[f.name] = true
	}
	for name, f := range newMetrics().families {
		written[name] = true
		if f.typ == "histogram" {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				written[name+suffix] = true
			}
		}
	}
	return written
}

// The table's and sqllock run's panels of otel/dashboard.json read only
// series that sqllock metrics (sqllock_table_) and run's textfile
// (sqllock_run_) write; the otel module's tests check the others.
func TestDashboard_seriesWritten(t *testing.T) {
	b, err := os.ReadFile("../../otel/dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	written := writtenSeries()
	found := 0
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			for _, n := range regexp.MustCompile(`\bsqllock_(table|run)_[a-z_]+`).FindAllString(regexp.MustCompile(`\{[^}]*\}`).ReplaceAllString(tg.Expr, ""), -1) {
				found++
				if !written[n] {
					t.Errorf("dashboard.json reads %s, which neither sqllock metrics nor sqllock run writes", n)
				}
			}
		}
	}
	if found == 0 {
		t.Fatal("no table or run series found in dashboard.json")
	}
}
