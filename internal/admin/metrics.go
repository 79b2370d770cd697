package admin

import (
	"bufio"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// The Prometheus text exposition format (version 0.0.4), written by hand:
// client_golang's own dependencies (client_model, common, procfs) are not
// in go.sum, and the format is small. A Collector reads snapshots at scrape
// time, as a prometheus.Collector would; nothing runs between scrapes.

// Family is one metric family of a scrape.
type Family struct {
	Name    string // full name, e.g. meshnode_outbox_depth
	Help    string
	Type    string // "gauge", "counter" or "histogram"
	Samples []Sample
	Hist    *HistogramSnapshot // Type "histogram" only
}

// Sample is one value with its labels (name, value pairs).
type Sample struct {
	Labels []string
	Value  float64
}

// Collector produces families at scrape time. It must not block.
type Collector interface {
	Collect() []Family
}

// CollectorFunc adapts a function to Collector.
type CollectorFunc func() []Family

// Collect calls f.
func (f CollectorFunc) Collect() []Family { return f() }

// WriteText writes families in the text exposition format, sorted by name.
func WriteText(w io.Writer, fams []Family) error {
	slices.SortStableFunc(fams, func(a, b Family) int { return strings.Compare(a.Name, b.Name) })
	bw := bufio.NewWriter(w)
	for _, f := range fams {
		bw.WriteString("# HELP " + f.Name + " " + escapeHelp(f.Help) + "\n")
		bw.WriteString("# TYPE " + f.Name + " " + f.Type + "\n")
		if f.Hist != nil {
			writeHistogram(bw, f.Name, f.Hist)
			continue
		}
		for _, s := range f.Samples {
			bw.WriteString(f.Name)
			writeLabels(bw, s.Labels, "", "")
			bw.WriteString(" " + formatFloat(s.Value) + "\n")
		}
	}
	return bw.Flush()
}

func writeHistogram(bw *bufio.Writer, name string, h *HistogramSnapshot) {
	var cum uint64
	for i, ub := range h.Bounds {
		cum += h.Counts[i]
		bw.WriteString(name + "_bucket")
		writeLabels(bw, nil, "le", formatFloat(ub))
		bw.WriteString(" " + strconv.FormatUint(cum, 10) + "\n")
	}
	cum += h.Counts[len(h.Bounds)]
	bw.WriteString(name + "_bucket{le=\"+Inf\"} " + strconv.FormatUint(cum, 10) + "\n")
	bw.WriteString(name + "_sum " + formatFloat(h.Sum) + "\n")
	bw.WriteString(name + "_count " + strconv.FormatUint(cum, 10) + "\n")
}

func writeLabels(bw *bufio.Writer, labels []string, extraK, extraV string) {
	if len(labels) < 2 && extraK == "" {
		return
	}
	bw.WriteByte('{')
	first := true
	emit := func(k, v string) {
		if !first {
			bw.WriteByte(',')
		}
		first = false
		bw.WriteString(k + "=\"" + escapeLabel(v) + "\"")
	}
	for i := 0; i+1 < len(labels); i += 2 {
		emit(labels[i], labels[i+1])
	}
	if extraK != "" {
		emit(extraK, extraV)
	}
	bw.WriteByte('}')
}

var (
	labelEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)
	helpEscaper  = strings.NewReplacer(`\`, `\\`, "\n", `\n`)
)

func escapeLabel(s string) string { return labelEscaper.Replace(s) }
func escapeHelp(s string) string  { return helpEscaper.Replace(s) }

func formatFloat(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// Histogram is a lock-free latency histogram (seconds).
type Histogram struct {
	bounds []float64
	counts []atomic.Uint64 // len(bounds)+1: the last is +Inf
	sumNs  atomic.Uint64
}

// HistogramSnapshot is a histogram at one moment.
type HistogramSnapshot struct {
	Bounds []float64 // upper bounds, seconds
	Counts []uint64  // per bucket (not cumulative), len(Bounds)+1
	Sum    float64   // seconds
}

// NewHistogram makes a histogram with the given upper bounds (seconds, ascending).
func NewHistogram(bounds []float64) *Histogram {
	return &Histogram{bounds: slices.Clone(bounds), counts: make([]atomic.Uint64, len(bounds)+1)}
}

// LatencyBuckets are the default bounds of latency histograms: 0.5 ms to 10 s.
var LatencyBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// Observe records one duration.
func (h *Histogram) Observe(d time.Duration) {
	s := d.Seconds()
	i, _ := slices.BinarySearch(h.bounds, s)
	h.counts[i].Add(1)
	h.sumNs.Add(uint64(max(d, 0)))
}

// Snapshot copies the histogram.
func (h *Histogram) Snapshot() *HistogramSnapshot {
	s := &HistogramSnapshot{Bounds: h.bounds, Counts: make([]uint64, len(h.counts))}
	for i := range h.counts {
		s.Counts[i] = h.counts[i].Load()
	}
	s.Sum = time.Duration(h.sumNs.Load()).Seconds()
	return s
}
