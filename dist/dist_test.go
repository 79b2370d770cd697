// Package dist_test checks the files shipped for operators: the systemd
// unit (with systemd-analyze where it is installed) and the Grafana
// dashboard (every expression names metrics that exist).
package dist_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/internal/admin"
	"github.com/meshnode/meshnode/metrics"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestSystemdUnitVerifies runs systemd-analyze verify on the unit, with
// only ExecStart's binary replaced by one that exists here (verify checks
// that it is executable). Any warning fails the test.
func TestSystemdUnitVerifies(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze not installed (Debian package systemd): cannot verify the unit")
	}
	unit, err := os.ReadFile(filepath.Join("systemd", "meshnode.service"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Type=notify", "LimitNOFILE=", "ExecReload=", "NoNewPrivileges=yes", "ProtectSystem=strict"} {
		if !strings.Contains(string(unit), want) {
			t.Errorf("the unit lacks %s", want)
		}
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(unit), "/usr/local/bin/meshnode", self)
	path := filepath.Join(t.TempDir(), "meshnode.service")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "verify", path).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// knownMetrics is every series name a daemon's /metrics can show.
func knownMetrics(tb testing.TB) map[string]bool {
	tb.Helper()
	known := map[string]bool{admin.BuildInfoName: true}
	for _, n := range append(slices.Clone(metrics.Names), admin.InboxMetricNames...) {
		known[n] = true
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			known[n+suffix] = true // histograms; harmless for the others
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	fams, err := reg.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	for _, f := range fams {
		known[f.GetName()] = true
	}
	return known
}

var (
	promStrings  = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promMatchers = regexp.MustCompile(`\{[^}]*\}`)
	promRanges   = regexp.MustCompile(`\[[^\]]*\]`)
	promGrouping = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promIdent    = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?`)
	promKeywords = map[string]bool{"and": true, "or": true, "unless": true, "offset": true, "bool": true, "by": true, "without": true}
)

// metricNames returns the metric names a PromQL expression reads.
func metricNames(expr string) []string {
	e := promStrings.ReplaceAllString(expr, `""`)
	e = promMatchers.ReplaceAllString(e, " ")
	e = promRanges.ReplaceAllString(e, " ")
	e = promGrouping.ReplaceAllString(e, " ")
	var out []string
	for _, m := range promIdent.FindAllString(e, -1) {
		if strings.HasSuffix(m, "(") || promKeywords[m] {
			continue // a function call or a keyword
		}
		out = append(out, m)
	}
	return out
}

func TestMetricNamesParser(t *testing.T) {
	tests := []struct {
		expr string
		want []string
	}{
		{`sum by (instance, state) (meshnode_members{state="alive",instance=~"$instance"})`, []string{"meshnode_members"}},
		{`histogram_quantile(0.99, sum by (le) (rate(meshnode_ask_duration_seconds_bucket{x="y"}[$__rate_interval])))`, []string{"meshnode_ask_duration_seconds_bucket"}},
		{`process_open_fds / process_max_fds`, []string{"process_open_fds", "process_max_fds"}},
		{`rate(meshnode_nope_total[5m]) and on (instance) up`, []string{"meshnode_nope_total", "up"}},
	}
	for _, tt := range tests {
		if got := metricNames(tt.expr); !slices.Equal(got, tt.want) {
			t.Errorf("metricNames(%q) = %v, want %v", tt.expr, got, tt.want)
		}
	}
}

// TestGrafanaDashboardNamesMetricsThatExist reads every PromQL expression
// of the dashboard (panel targets and variable queries) and checks that
// each metric it names is one the daemon exports.
func TestGrafanaDashboardNamesMetricsThatExist(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("grafana", "meshnode.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("dashboard is not JSON: %v", err)
	}
	known := knownMetrics(t)
	check := func(where, expr string) {
		names := metricNames(expr)
		if len(names) == 0 {
			t.Errorf("%s: expression %q names no metric", where, expr)
		}
		for _, n := range names {
			if !known[n] {
				t.Errorf("%s: %q names %s, which the daemon does not export", where, expr, n)
			}
		}
	}
	exprs := 0
	covered := map[string]bool{}
	for _, p := range dash.Panels {
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			check("panel "+p.Title, tg.Expr)
			for _, n := range metricNames(tg.Expr) {
				covered[n] = true
			}
			exprs++
		}
	}
	for _, v := range dash.Templating.List {
		var q struct {
			Query string `json:"query"`
		}
		if json.Unmarshal(v.Query, &q) == nil && strings.HasPrefix(q.Query, "label_values(") {
			metric, _, _ := strings.Cut(strings.TrimSuffix(strings.TrimPrefix(q.Query, "label_values("), ")"), ",")
			check("variable "+v.Name, metric)
		}
	}
	if exprs < 20 {
		t.Errorf("only %d expressions: the dashboard lost its panels?", exprs)
	}
	// The panels an operator looks at first: AIMD per peer, outbox depth
	// and age, delivery rate, DLQ, mailbox drops.
	for _, want := range []string{"meshnode_outbox_aimd_limit", "meshnode_outbox_depth", "meshnode_outbox_oldest_age_seconds",
		"meshnode_outbox_delivered_total", "meshnode_outbox_dlq_depth", "meshnode_mailbox_drops_total"} {
		if !covered[want] {
			t.Errorf("no panel shows %s", want)
		}
	}
}
