package sqllockotel

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
)

// dashboardSeries returns the metric names dashboard.json's queries read,
// sorted, each once.
func dashboardSeries(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
		Templating struct {
			List []struct{ Query any }
		}
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	var queries []string
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			queries = append(queries, tg.Expr)
		}
	}
	for _, v := range d.Templating.List {
		if q, ok := v.Query.(string); ok {
			queries = append(queries, q)
		}
	}
	var names []string
	for _, q := range queries {
		// Label names stand in selectors and by (...): not series.
		q = labelLists.ReplaceAllString(q, "")
		names = append(names, seriesName.FindAllString(q, -1)...)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

var (
	seriesName = regexp.MustCompile(`\bsqllock_[a-z_]+`)
	labelLists = regexp.MustCompile(`\{[^}]*\}|\b(by|without) \([^)]*\)`)
)

// alertSeries returns the metric names alerts.yml's expressions read that
// the otel module exports (not sqllock metrics' sqllock_table_ ones, nor
// sqllock run's sqllock_run_ ones: cmd/sqllock's tests check those).
func alertSeries(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "#") || strings.HasPrefix(line, "summary:") || strings.HasPrefix(line, "- alert:") {
			continue
		}
		for _, n := range seriesName.FindAllString(labelLists.ReplaceAllString(line, ""), -1) {
			if !strings.HasPrefix(n, "sqllock_table_") && !strings.HasPrefix(n, "sqllock_run_") {
				names = append(names, n)
			}
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// checkDashboard fails unless every series the dashboard reads is in s:
// a family, or a histogram's _bucket, _sum or _count.
func checkDashboard(t *testing.T, s scraped) {
	t.Helper()
	for _, name := range append(dashboardSeries(t), alertSeries(t)...) {
		family := name
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suffix); ok && s[base] != nil {
				family = base
			}
		}
		f := s[family]
		switch {
		case f == nil:
			t.Errorf("dashboard.json or alerts.yml reads %s, which the scrape has not", name)
		case family != name && f.GetType() != dto.MetricType_HISTOGRAM:
			t.Errorf("dashboard.json or alerts.yml reads %s, but %s is a %v", name, family, f.GetType())
		}
	}
}

// The dashboard parses and reads the instruments the package documents.
func TestDashboard_parses(t *testing.T) {
	if got := alertSeries(t); !slices.Contains(got, "sqllock_lease_lost_total") {
		t.Errorf("alerts.yml does not read sqllock_lease_lost_total; it reads %v", got)
	}
	names := dashboardSeries(t)
	for _, want := range []string{"sqllock_lease_lost_total", "sqllock_lease_age_seconds", "sqllock_refresh_remaining_fraction_bucket"} {
		if !slices.Contains(names, want) {
			t.Errorf("dashboard.json does not read %s; it reads %v", want, names)
		}
	}
}
