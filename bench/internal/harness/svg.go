package harness

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
)

// WriteCurves draws the curves phase's points as two SVG charts in dir:
// tell.svg (meshnode Tell and NATS pub→sub per senders level) and
// drain.svg (meshnode's drain), msgs/s against payload, both axes
// logarithmic. Points that did not finish (rate 0) are left out.
func (r *Report) WriteCurves(dir string) error {
	if len(r.Curves) == 0 {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("bench: curves: %w", err)
	}
	var tell, drain []Point
	for _, p := range r.Curves {
		if strings.Contains(p.Series, "drain") {
			drain = append(drain, p)
		} else {
			tell = append(tell, p)
		}
	}
	for name, pts := range map[string][]Point{"tell.svg": tell, "drain.svg": drain} {
		title := "Tell: meshnode (solid) and NATS core pub→sub (dashed), msgs/s by payload"
		if name == "drain.svg" {
			title = "Drain of a backlog into in-process actors, a line per number of streams, msgs/s by payload"
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(chart(title, pts)), 0o644); err != nil {
			return fmt.Errorf("bench: curves: %w", err)
		}
	}
	return nil
}

// chart renders one log-log line chart of pts grouped by series.
func chart(title string, pts []Point) string {
	const w, h, left, right, top, bottom = 720.0, 420.0, 70.0, 190.0, 40.0, 50.0
	var series []string
	bySeries := map[string][]Point{}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, p := range pts {
		if p.Rate <= 0 {
			continue
		}
		if _, ok := bySeries[p.Series]; !ok {
			series = append(series, p.Series)
		}
		bySeries[p.Series] = append(bySeries[p.Series], p)
		lo, hi = math.Min(lo, p.Rate), math.Max(hi, p.Rate)
	}
	if len(series) == 0 {
		lo, hi = 1, 10
	}
	ylo, yhi := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if yhi <= ylo {
		yhi = ylo + 1
	}
	xlo, xhi := math.Log10(float64(CurvePayloads[0])), math.Log10(float64(CurvePayloads[len(CurvePayloads)-1]))
	x := func(payload int) float64 {
		return left + (math.Log10(float64(payload))-xlo)/(xhi-xlo)*(w-left-right)
	}
	y := func(rate float64) float64 {
		return h - bottom - (math.Log10(rate)-ylo)/(yhi-ylo)*(h-top-bottom)
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="11">`+"\n", w, h)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%.0f" y="20" font-size="13">%s</text>`+"\n", left, escape(title))
	for d := ylo; d <= yhi; d++ {
		yy := y(math.Pow(10, d))
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", left, yy, w-right, yy)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, yy+4, humanRate(math.Pow(10, d)))
	}
	for _, p := range CurvePayloads {
		xx := x(p)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#eee"/>`+"\n", xx, top, xx, h-bottom)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", xx, h-bottom+16, humanBytes(p))
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">payload</text>`+"\n", (left+w-right)/2, h-12)
	colors := []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"}
	colorOf := map[string]string{}
	for i, s := range series {
		key := s[strings.LastIndex(s, " ")+1:] // the senders level: same color for both systems
		c, ok := colorOf[key]
		if !ok {
			c = colors[len(colorOf)%len(colors)]
			colorOf[key] = c
		}
		dash := ""
		if strings.HasPrefix(s, "NATS") {
			dash = ` stroke-dasharray="6,4"`
		}
		var path []string
		for _, p := range bySeries[s] {
			path = append(path, fmt.Sprintf("%.1f,%.1f", x(p.Payload), y(p.Rate)))
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", x(p.Payload), y(p.Rate), c)
		}
		fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"%s/>`+"\n", strings.Join(path, " "), c, dash)
		ly := top + 10 + float64(i)*18
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2"%s/>`+"\n", w-right+12, ly, w-right+40, ly, c, dash)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">%s</text>`+"\n", w-right+46, ly+4, escape(s))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

func humanRate(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.0fM/s", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.0fk/s", v/1e3)
	}
	return fmt.Sprintf("%.0f/s", v)
}

func humanBytes(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

func escape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}
