package node_test

import (
	"context"
	"errors"
	"testing"

	"github.com/meshnode/meshnode/node"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// A node opened but not started knows no peer: a remote tell or ask is
// refused at once as unreachable (never a panic, never a dial).
func TestRemoteSendsBeforeStartAreUnreachable(t *testing.T) {
	n, err := node.Open(testConfig(t, "n1", t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	ctx := context.Background()
	to := node.Addr("sink", "n2")
	if err := n.Tell(ctx, to, wrapperspb.String("x")); !errors.Is(err, node.ErrUnreachable) {
		t.Fatalf("Tell before Start = %v, want ErrUnreachable", err)
	}
	if err := n.Tell(ctx, to, wrapperspb.String("x"), node.WithHeaders(map[string]string{"k": "v"})); !errors.Is(err, node.ErrUnreachable) {
		t.Fatalf("Tell with headers before Start = %v, want ErrUnreachable", err)
	}
	if err := n.Ask(ctx, to, wrapperspb.String("x"), nil); !errors.Is(err, node.ErrUnreachable) {
		t.Fatalf("Ask before Start = %v, want ErrUnreachable", err)
	}
}
