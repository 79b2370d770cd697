package plot

import (
	"encoding/xml"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestSVG(t *testing.T) {
	saw := Series{Name: "limit <n2>"}
	for i := range 100 {
		saw.Points = append(saw.Points, Point{T: float64(i) / 10, V: float64(10 + i%20)})
	}
	tests := []struct {
		name   string
		charts []Chart
		want   []string
	}{
		{"one line", []Chart{{Title: "AIMD", YLabel: "limit", Series: []Series{saw}}}, []string{"<polyline", "limit &lt;n2&gt;", "AIMD"}},
		{"empty series", []Chart{{Title: "empty", Series: []Series{{Name: "none"}}}}, []string{"empty"}},
		{"nan skipped", []Chart{{Title: "nan", Series: []Series{{Name: "x", Points: []Point{{0, math.NaN()}, {1, 2}, {math.Inf(1), 3}}}}}}, []string{"nan"}},
		{"three panels", []Chart{{Title: "a"}, {Title: "b"}, {Title: "c"}}, []string{">a<", ">b<", ">c<"}},
		{"events marked", []Chart{{Title: "m", Series: []Series{saw}, Marks: []Mark{{T: 2, Label: "n1 killed"}, {T: 2.1, Label: "healed & <ok>"}, {T: math.NaN(), Label: "skipped"}}}},
			[]string{`class="mark" x1=`, ">n1 killed<", "healed &amp; &lt;ok&gt;"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var b strings.Builder
			if err := SVG(&b, "report & <test>", tc.charts); err != nil {
				t.Fatal(err)
			}
			out := b.String()
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("svg lacks %q", w)
				}
			}
			if strings.Contains(out, "NaN") || strings.Contains(out, "Inf") {
				t.Error("svg contains NaN or Inf")
			}
			// Well-formed XML.
			d := xml.NewDecoder(strings.NewReader(out))
			for {
				if _, err := d.Token(); errors.Is(err, io.EOF) {
					break
				} else if err != nil {
					t.Fatalf("svg is not well-formed XML: %v", err)
				}
			}
		})
	}
}

func TestNoCharts(t *testing.T) {
	if err := SVG(io.Discard, "x", nil); !errors.Is(err, ErrNoCharts) {
		t.Fatalf("SVG(nil) = %v, want ErrNoCharts", err)
	}
}

func TestNiceCeil(t *testing.T) {
	for _, tc := range []struct{ in, want float64 }{{0, 1}, {0.5, 1}, {3, 5}, {10, 10}, {11, 20}, {99, 100}, {4100, 5000}} {
		if got := niceCeil(tc.in); got != tc.want {
			t.Errorf("niceCeil(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func BenchmarkSVG(b *testing.B) {
	var cs []Chart
	for range 3 {
		c := Chart{Title: "c"}
		for s := range 10 {
			ser := Series{Name: "s"}
			for i := range 600 {
				ser.Points = append(ser.Points, Point{float64(i) / 10, float64(s * i % 97)})
			}
			c.Series = append(c.Series, ser)
		}
		cs = append(cs, c)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := SVG(io.Discard, "bench", cs); err != nil {
			b.Fatal(err)
		}
	}
}

func TestWriteFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "r.svg")
	c := []Chart{{Title: "t", YLabel: "y", Series: []Series{{Name: "s", Points: []Point{{T: 0, V: 1}, {T: 1, V: 2}}}}}}
	if err := WriteFile(path, "title", c); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := xml.Unmarshal(b, new(struct{})); err != nil || !strings.Contains(string(b), "title") {
		t.Fatalf("not the SVG of the charts (%v): %.80s", err, b)
	}
	if err := WriteFile(filepath.Join(dir, "missing", "r.svg"), "title", c); err == nil {
		t.Error("wrote into a missing directory")
	}
	if err := WriteFile(path, "title", nil); !errors.Is(err, ErrNoCharts) {
		t.Errorf("no charts: %v", err)
	}
}
