package demo

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
)

func TestMain(m *testing.M) { testutil.VerifyTestMain(m) }

// TestRunSmall runs the whole tour at a small size: every step must
// succeed and the summary must show nothing lost.
func TestRunSmall(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Offline, cfg.Herd, cfg.LeaderCap = 50, 200, 4
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := Run(ctx, cfg, &out); err != nil {
		t.Fatalf("demo failed: %v\n%s", err, out.String())
	}
	if strings.Contains(out.String(), "\r") {
		t.Errorf("carriage returns written into a non-terminal:\n%q", out.String())
	}
	for _, want := range []string{"Summary", "50 queued, 50 delivered after heal, 0 out of order", "400 sent, 400 processed"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
