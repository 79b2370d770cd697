package testnet

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/node"
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

// TestFleetOptions: a fleet larger than paceAbove runs with the relaxed
// timers (its devices share this process's cores); the test suite's small
// fleet keeps the defaults.
func TestFleetOptions(t *testing.T) {
	if opts := fleetOptions(fleetSmall); opts != nil {
		t.Errorf("small fleet: %d options, want none", len(opts))
	}
	var o options
	for _, f := range fleetOptions(fleetLarge) {
		f(&o)
	}
	if len(o.mutate) != 1 {
		t.Fatalf("large fleet: %d config changes, want 1", len(o.mutate))
	}
	cfg := node.DefaultConfig("n")
	cfg.Mesh = node.MeshPreset(fleetLarge.Nodes)
	shipped := cfg.Mesh
	o.mutate[0](0, &cfg)
	relaxed := node.MeshPreset(1024)
	if cfg.Mesh.ProbeInterval != relaxed.ProbeInterval || cfg.Mesh.ProbeTimeout != relaxed.ProbeTimeout ||
		cfg.Mesh.GossipInterval != relaxed.GossipInterval || cfg.Mesh.PushPullInterval != relaxed.PushPullInterval {
		t.Errorf("large fleet timers %v/%v/%v/%v, want the 1,024-member preset's %v/%v/%v/%v",
			cfg.Mesh.ProbeInterval, cfg.Mesh.ProbeTimeout, cfg.Mesh.GossipInterval, cfg.Mesh.PushPullInterval,
			relaxed.ProbeInterval, relaxed.ProbeTimeout, relaxed.GossipInterval, relaxed.PushPullInterval)
	}
	if cfg.Mesh.ProbeInterval <= shipped.ProbeInterval {
		t.Errorf("relaxed probe %v is not longer than the shipped %v", cfg.Mesh.ProbeInterval, shipped.ProbeInterval)
	}
}
