// Package plot writes small line charts as hand-written SVG, so the
// reports of testnet's scenarios and of mesh's fleet and simulation runs
// need no plotting dependency. Events (a node killed, a partition
// healed) are marked on the time axis of every panel.
//
// A plotting library (gonum.org/v1/plot) was considered and not taken: it
// is not among the project's dependencies, would bring fonts and image
// libraries for three line charts, and draws nothing these need that a
// hundred lines of SVG do not.
package plot

import (
	"errors"
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"strings"
)

// Point is one sample: T in seconds since the start, V the value.
type Point struct{ T, V float64 }

// Series is one line.
type Series struct {
	Name   string
	Points []Point
}

// Mark is an event at time T (seconds since the start), drawn as a dashed
// vertical line with its label.
type Mark struct {
	T     float64
	Label string
}

// Chart is one panel: a title, a y-axis label, its lines and the events
// marked on its time axis.
type Chart struct {
	Title  string
	YLabel string
	Series []Series
	Marks  []Mark
}

// ErrNoCharts is returned by SVG when there is nothing to draw.
var ErrNoCharts = errors.New("plot: no charts")

const (
	width   = 900
	panelH  = 260
	marginL = 70
	marginR = 190 // legend
	marginT = 50
	marginB = 40
)

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}

// WriteFile writes the charts as an SVG file at path.
func WriteFile(path, title string, charts []Chart) error {
	var b strings.Builder
	if err := SVG(&b, title, charts); err != nil {
		return err
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	return nil
}

// SVG writes the charts stacked vertically under title. Series beyond the
// palette repeat colours; more than 10 series per chart are drawn but only
// the first 10 named in the legend.
func SVG(w io.Writer, title string, charts []Chart) error {
	if len(charts) == 0 {
		return ErrNoCharts
	}
	var b strings.Builder
	h := marginT + len(charts)*(panelH+marginB+30)
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, h, width, h)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="24" font-size="16" font-weight="bold">%s</text>`+"\n", marginL, html.EscapeString(title))
	for i, c := range charts {
		top := marginT + i*(panelH+marginB+30)
		panel(&b, c, top)
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	if err != nil {
		return fmt.Errorf("plot: write svg: %w", err)
	}
	return nil
}

func panel(b *strings.Builder, c Chart, top int) {
	x0, y0 := float64(marginL), float64(top+20)
	pw, ph := float64(width-marginL-marginR), float64(panelH)
	tmax, vmax := 0.0, 0.0
	for _, s := range c.Series {
		for _, p := range s.Points {
			if finite(p.T) && p.T > tmax {
				tmax = p.T
			}
			if finite(p.V) && p.V > vmax {
				vmax = p.V
			}
		}
	}
	for _, m := range c.Marks {
		if finite(m.T) && m.T > tmax {
			tmax = m.T
		}
	}
	if tmax <= 0 {
		tmax = 1
	}
	vmax = niceCeil(vmax)
	fmt.Fprintf(b, `<text x="%v" y="%d" font-size="14">%s</text>`+"\n", x0, top+12, html.EscapeString(c.Title))
	fmt.Fprintf(b, `<rect x="%v" y="%v" width="%v" height="%v" fill="none" stroke="#888"/>`+"\n", x0, y0, pw, ph)
	for k := 0; k <= 4; k++ {
		v := vmax * float64(k) / 4
		y := y0 + ph - ph*float64(k)/4
		fmt.Fprintf(b, `<line x1="%v" y1="%.1f" x2="%v" y2="%.1f" stroke="#eee"/><text x="%v" y="%.1f" text-anchor="end">%s</text>`+"\n",
			x0, y, x0+pw, y, x0-6, y+4, label(v))
		t := tmax * float64(k) / 4
		x := x0 + pw*float64(k)/4
		fmt.Fprintf(b, `<text x="%.1f" y="%v" text-anchor="middle">%ss</text>`+"\n", x, y0+ph+16, label(t))
	}
	fmt.Fprintf(b, `<text transform="translate(%v,%v) rotate(-90)" text-anchor="middle">%s</text>`+"\n", x0-50, y0+ph/2, html.EscapeString(c.YLabel))
	marks(b, c.Marks, x0, y0, pw, ph, tmax)
	for i, s := range c.Series {
		color := palette[i%len(palette)]
		var pts strings.Builder
		for _, p := range s.Points {
			if !finite(p.T) || !finite(p.V) {
				continue
			}
			fmt.Fprintf(&pts, "%.1f,%.1f ", x0+pw*p.T/tmax, y0+ph-ph*math.Min(p.V, vmax)/vmax)
		}
		fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`+"\n", color, strings.TrimSpace(pts.String()))
		if i < len(palette) {
			ly := y0 + 14 + float64(i)*16
			fmt.Fprintf(b, `<rect x="%v" y="%.1f" width="12" height="3" fill="%s"/><text x="%v" y="%.1f">%s</text>`+"\n",
				x0+pw+12, ly-4, color, x0+pw+30, ly, html.EscapeString(s.Name))
		}
	}
}

// marks draws each event as a dashed line across the panel with its label
// at the top, labels stepping down a line when they would overlap the
// previous one.
func marks(b *strings.Builder, ms []Mark, x0, y0, pw, ph, tmax float64) {
	const lineH, charW = 12.0, 6.0
	lastEnd, row := math.Inf(-1), 0
	for _, m := range ms {
		if !finite(m.T) || m.T < 0 {
			continue
		}
		x := x0 + pw*m.T/tmax
		if x < lastEnd {
			row = (row + 1) % 4
		} else {
			row = 0
		}
		lastEnd = x + 4 + charW*float64(len(m.Label))
		fmt.Fprintf(b, `<line class="mark" x1="%.1f" y1="%v" x2="%.1f" y2="%v" stroke="#555" stroke-dasharray="4 3"/>`+"\n", x, y0, x, y0+ph)
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" font-size="11" fill="#333">%s</text>`+"\n", x+3, y0+11+lineH*float64(row), html.EscapeString(m.Label))
	}
}

func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }

// niceCeil rounds v up to 1, 2 or 5 times a power of ten (at least 1).
func niceCeil(v float64) float64 {
	if v <= 1 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

func label(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.1fM", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.0fk", v/1e3)
	case v == math.Trunc(v):
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}
