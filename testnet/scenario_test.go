package testnet

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestScenarios runs every seed scenario at SmallSize and checks its own
// claims, the summary table and the SVG report. TESTNET_REPORT_DIR keeps
// the reports.
func TestScenarios(t *testing.T) {
	for _, name := range ScenarioNames() {
		t.Run(name, func(t *testing.T) {
			var out bytes.Buffer
			res, err := RunScenario(context.Background(), name, SmallSizeOf(name), &out)
			if err != nil {
				t.Fatalf("%v\n%s", err, out.String())
			}
			t.Logf("\n%s", out.String())
			if !res.OK() {
				t.Fatalf("scenario %s failed its checks:\n%s", name, out.String())
			}
			if len(res.Checks) == 0 || res.Sent == 0 || res.Processed == 0 {
				t.Fatalf("scenario %s checked nothing or sent nothing: %+v", name, res.Counts)
			}
			if len(res.Samples) < 2 {
				t.Fatalf("only %d samples", len(res.Samples))
			}
			for _, want := range []string{"<svg", "AIMD limit", "Outbox depth", "Delivery rate", "</svg>"} {
				if !bytes.Contains(res.SVG, []byte(want)) {
					t.Fatalf("SVG lacks %q", want)
				}
			}
			if !strings.Contains(out.String(), "scenario") {
				t.Fatal("no summary table")
			}
			// Scenarios with faults mark them on the time axis.
			faults := map[string][]string{
				"thundering-herd":  {"leader cut off", "healed"},
				"offline-delivery": {"worker nodes killed", "sender restarted", "worker nodes restarted"},
				"fleet":            {"links cut", "devices offline", "devices back", "links healed"},
			}
			for _, label := range faults[name] {
				if !bytes.Contains(res.SVG, []byte(">"+label)) || !bytes.Contains(res.SVG, []byte(`class="mark"`)) {
					t.Errorf("the report does not mark %q on its time axis", label)
				}
			}
			dir := os.Getenv("TESTNET_REPORT_DIR")
			if dir == "" {
				dir = t.TempDir()
			}
			p, err := res.WriteSVG(dir)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Clean(p)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestRunScenarioBadInput(t *testing.T) {
	if _, err := RunScenario(context.Background(), "nope", SmallSize(), nil); !errors.Is(err, ErrUnknownScenario) {
		t.Errorf("unknown scenario: %v", err)
	}
	if _, err := RunScenario(context.Background(), "thundering-herd", Size{Nodes: 1, Workers: 1, Messages: 1}, nil); !errors.Is(err, ErrBadSize) {
		t.Errorf("bad size: %v", err)
	}
}
