package harness

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"text/tabwriter"
	"time"
)

// Figure is one measured value.
type Figure struct {
	Name  string  `json:"name"`  // what was measured ("NATS pub→sub")
	Value float64 `json:"value"` // in Unit
	Unit  string  `json:"unit"`  // "msgs/s", "µs", "MB", "B"
}

// Row is one line of the table: a meshnode figure, its comparison and the
// target it is held to.
type Row struct {
	Phase      string  `json:"phase"`                // phase and variant ("tell", "reliable s=64")
	Meshnode   Figure  `json:"meshnode"`             // meshnode's figure
	Comparison *Figure `json:"comparison,omitempty"` // what it is compared with; nil = absolute figure only
	Ratio      float64 `json:"ratio,omitempty"`      // Meshnode / Comparison (0 without a comparison)
	Target     string  `json:"target,omitempty"`     // "≥ 1.0×", "≥ 100000 msgs/s"; "" = informational
	Met        string  `json:"met,omitempty"`        // "yes", "no", "n/a"; "" = informational
	Note       string  `json:"note,omitempty"`       // drops, scale, caveats
}

// Report is the result of a run.
type Report struct {
	Started  time.Time `json:"started"`
	Machine  Machine   `json:"machine"`
	Config   string    `json:"config"` // the flags that reproduce it
	Rows     []Row     `json:"rows"`
	Curves   []Point   `json:"curves,omitempty"` // the curves phase's points
	Duration string    `json:"duration"`
}

// Machine describes where the figures were taken.
type Machine struct {
	CPUs      int    `json:"cpus"`
	CPUModel  string `json:"cpu_model"`
	GoVersion string `json:"go_version"`
	OS        string `json:"os"`
}

// ratio returns a/b, or 0 when b is 0.
func ratio(a, b float64) float64 {
	if b == 0 || math.IsNaN(b) {
		return 0
	}
	return a / b
}

func yesNo(ok bool) string {
	if ok {
		return "yes"
	}
	return "no"
}

// format prints v with a precision that suits its size.
func format(v float64) string {
	switch {
	case v == 0:
		return "0"
	case math.Abs(v) >= 1000:
		return fmt.Sprintf("%.0f", v)
	case math.Abs(v) >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func (f Figure) String() string {
	s := format(f.Value) + " " + f.Unit
	if f.Name != "" {
		s = f.Name + ": " + s
	}
	return s
}

// WriteTable prints the rows as an aligned table:
// phase | meshnode | comparison | ratio | target | met?
func (r *Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "phase\tmeshnode\tcomparison\tratio\ttarget\tmet?\tnote")
	fmt.Fprintln(tw, "-----\t--------\t----------\t-----\t------\t----\t----")
	for _, row := range r.Rows {
		cmp, rat := "-", "-"
		if row.Comparison != nil {
			cmp = row.Comparison.String()
			rat = fmt.Sprintf("%.2f×", row.Ratio)
			if row.Ratio < 0.1 {
				rat = fmt.Sprintf("%.3f×", row.Ratio)
			}
		}
		tgt, met := row.Target, row.Met
		if tgt == "" {
			tgt = "-"
		}
		if met == "" {
			met = "-"
		}
		fmt.Fprintf(tw, "%s\t%s %s\t%s\t%s\t%s\t%s\t%s\n", row.Phase, format(row.Meshnode.Value), row.Meshnode.Unit, cmp, rat, tgt, met, strings.TrimSpace(row.Note))
	}
	return tw.Flush()
}

// WriteJSON writes the report as indented JSON to path.
func (r *Report) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("bench: encode report: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("bench: write report: %w", err)
	}
	return nil
}
