package admin

import (
	"slices"

	"github.com/meshnode/meshnode/internal/version"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

var (
	inboxDepthDesc = prometheus.NewDesc("meshnode_inbox_depth", "Messages stored in one inbox and not yet acknowledged.", []string{"inbox"}, nil)
	inboxLastDesc  = prometheus.NewDesc("meshnode_inbox_last_cursor", "Cursor of the newest message stored in one inbox.", []string{"inbox"}, nil)
	inboxFailDesc  = prometheus.NewDesc("meshnode_inbox_failed", "1 when the inbox store stopped because the disk failed a commit it had already written (its fsync); the daemon must be restarted. 0 otherwise; alert on 1.", nil, nil)
)

// InboxMetricNames are the families inboxCollector exports.
var InboxMetricNames = []string{"meshnode_inbox_depth", "meshnode_inbox_last_cursor", "meshnode_inbox_failed"}

// inboxCollector reads the inbox store's statistics at scrape time.
type inboxCollector struct{ in Inbox }

func (c inboxCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- inboxDepthDesc
	ch <- inboxLastDesc
	ch <- inboxFailDesc
}

func (c inboxCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.in.Stats()
	for _, n := range sortedKeys(st) {
		ch <- prometheus.MustNewConstMetric(inboxDepthDesc, prometheus.GaugeValue, float64(st[n].Depth), n)
		ch <- prometheus.MustNewConstMetric(inboxLastDesc, prometheus.GaugeValue, float64(st[n].LastCursor), n)
	}
	failed := 0.0
	if c.in.Err() != nil {
		failed = 1
	}
	ch <- prometheus.MustNewConstMetric(inboxFailDesc, prometheus.GaugeValue, failed)
}

// BuildInfoName is the build information family: always 1, the binary's
// version in its labels.
const BuildInfoName = "meshnode_build_info"

func buildInfo() prometheus.Collector {
	v := version.Get()
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: BuildInfoName,
		Help: "Always 1; the labels say which meshnode binary is running.",
		ConstLabels: prometheus.Labels{"version": v.Version, "revision": v.Revision, "goversion": v.GoVersion,
			"modified": map[bool]string{true: "true", false: "false"}[v.Modified]},
	}, func() float64 { return 1 })
}

// registry holds every family /metrics serves: the node's (package metrics),
// the inbox's, the build information, and the Go runtime's and process's.
func (s *Server) registry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(s.metrics, buildInfo(),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if s.cfg.Inbox != nil {
		reg.MustRegister(inboxCollector{s.cfg.Inbox})
	}
	return reg
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
