package nodetest_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/node/nodetest"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func TestMain(m *testing.M) { testutil.VerifyTestMain(m) }

// TestClusterSetsUpEveryStart: the setup runs before each start, so a
// restarted node answers at once; a killed one is down for the others.
func TestClusterSetsUpEveryStart(t *testing.T) {
	var setups atomic.Int32
	c := nodetest.New(t, []string{"a", "b"}, nodetest.WithSetup(func(n *node.Node) error {
		setups.Add(1)
		_, err := n.Spawn("echo", func(ctx context.Context, m *node.Message) (proto.Message, error) {
			return wrapperspb.String(m.Recipient().Node), nil
		})
		return err
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var resp wrapperspb.StringValue
	if err := c.Node("a").Ask(ctx, node.Addr("echo", "b"), wrapperspb.String("x"), &resp); err != nil || resp.GetValue() != "b" {
		t.Fatalf("ask b: %q %v", resp.GetValue(), err)
	}
	c.Kill("b")
	if c.Node("b") != nil {
		t.Fatal("a killed node is still returned")
	}
	if err := c.Node("a").Ask(ctx, node.Addr("echo", "b"), wrapperspb.String("x"), &resp); err == nil {
		t.Fatal("ask to a killed node succeeded")
	}
	c.Restart("b")
	if err := c.Node("a").Ask(ctx, node.Addr("echo", "b"), wrapperspb.String("x"), &resp); err != nil {
		t.Fatalf("ask restarted b: %v", err)
	}
	if got := setups.Load(); got != 3 {
		t.Fatalf("setup ran %d times, want 3 (a, b, b again)", got)
	}
}
