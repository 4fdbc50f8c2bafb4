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

// dashboard is what the tests read of dashboard.json.
type dashboard struct {
	Panels []struct {
		Title   string
		Targets []struct{ Expr string }
	}
	Templating struct {
		List []struct{ Query any }
	}
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile("dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	return d
}

// dashboardSeries returns the metric names dashboard.json's queries read,
// sorted, each once.
func dashboardSeries(t *testing.T) []string {
	t.Helper()
	d := readDashboard(t)
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
// a family, or a histogram's _bucket, _sum or _count. The table's
// (sqllock_table_) and sqllock run's (sqllock_run_) are cmd/sqllock's to
// check.
func checkDashboard(t *testing.T, s scraped) {
	t.Helper()
	for _, name := range append(dashboardSeries(t), alertSeries(t)...) {
		if strings.HasPrefix(name, "sqllock_table_") || strings.HasPrefix(name, "sqllock_run_") {
			continue
		}
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

// alertExprs returns each alert of alerts.yml with its expression: the
// text after expr: and the lines of its block, joined.
func alertExprs(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile("alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	exprs := map[string]string{}
	var alert string
	inExpr := false
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "- alert:"):
			alert, inExpr = strings.TrimSpace(strings.TrimPrefix(line, "- alert:")), false
			continue
		case strings.HasPrefix(line, "expr:"):
			inExpr, line = true, strings.TrimSpace(strings.TrimPrefix(line, "expr:"))
		case line == "" || strings.HasPrefix(line, "#"):
			continue
		case yamlKey.MatchString(line):
			inExpr = false
		}
		if inExpr && line != "|" {
			exprs[alert] += line + " "
		}
	}
	if len(exprs) == 0 {
		t.Fatal("no alert found in alerts.yml")
	}
	return exprs
}

var (
	yamlKey  = regexp.MustCompile(`^(- )?[a-z_]+:`)
	selector = regexp.MustCompile(`\bsqllock_[a-z_]+(\{[^}]*\})?`)
)

// selectors returns the series selectors of a PromQL expression, each with
// its matchers sorted and the dashboard's job=~"$job" left out, so that
// the same selector reads the same in alerts.yml and dashboard.json.
func selectors(expr string) []string {
	var out []string
	for _, s := range selector.FindAllString(expr, -1) {
		name, matchers, ok := strings.Cut(s, "{")
		if !ok {
			out = append(out, name)
			continue
		}
		var ms []string
		for _, m := range strings.Split(strings.TrimSuffix(matchers, "}"), ",") {
			if m = strings.ReplaceAll(m, " ", ""); m != "" && m != `job=~"$job"` {
				ms = append(ms, m)
			}
		}
		slices.Sort(ms)
		if len(ms) == 0 {
			out = append(out, name)
		} else {
			out = append(out, name+"{"+strings.Join(ms, ",")+"}")
		}
	}
	return out
}

// Every selector an alert reads is read by a panel of the dashboard, with
// the same label matchers: what pages someone is on the dashboard they
// open, and a panel and its alert cannot drift apart.
func TestDashboard_readsWhatAlertsRead(t *testing.T) {
	d := readDashboard(t)
	panels := map[string][]string{} // selector: the panels that read it
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			for _, s := range selectors(tg.Expr) {
				panels[s] = append(panels[s], p.Title)
			}
		}
	}
	for alert, expr := range alertExprs(t) {
		sels := selectors(expr)
		if len(sels) == 0 {
			t.Errorf("%s reads no sqllock series: %q", alert, expr)
		}
		for _, s := range sels {
			if panels[s] == nil {
				t.Errorf("%s reads %s, which no panel of dashboard.json reads", alert, s)
			}
		}
	}
}

// Every alert of alerts.yml has a case in alerts_test.yml that shows it
// firing (exp_alerts with an alert, not []), and every alert that file
// names exists: an alert added or renamed without its test fails here, and
// CI runs the cases themselves (scripts/promtool test).
func TestAlerts_eachHasAFiringCase(t *testing.T) {
	b, err := os.ReadFile("alerts_test.yml")
	if err != nil {
		t.Fatal(err)
	}
	exprs := alertExprs(t)
	fires := map[string]bool{}
	for _, m := range firingCase.FindAllStringSubmatch(string(b), -1) {
		fires[m[1]] = true
	}
	for alert := range exprs {
		if !fires[alert] {
			t.Errorf("alerts_test.yml has no case where %s fires", alert)
		}
	}
	for _, m := range namedAlert.FindAllStringSubmatch(string(b), -1) {
		if _, ok := exprs[m[1]]; !ok {
			t.Errorf("alerts_test.yml tests %s, which alerts.yml does not have", m[1])
		}
	}
}

var (
	firingCase = regexp.MustCompile(`alertname: (\w+)\n\s+exp_alerts:\n\s+- exp_labels:`)
	namedAlert = regexp.MustCompile(`alertname: (\w+)`)
)
