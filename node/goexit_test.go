package node_test

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/node"
	"google.golang.org/protobuf/proto"
)

// A handler that ends its goroutine (runtime.Goexit, as t.FailNow does)
// gives its message's bytes back to the sending peer's budget, and its
// actor goes on with the next message.
func TestHandlerGoexitGivesBackItsCharge(t *testing.T) {
	nodes := cluster(t, 2)
	var runs atomic.Int64
	to, err := nodes[1].Spawn("quits", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		if runs.Add(1) == 1 {
			runtime.Goexit()
		}
		return nil, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nodes[0].Tell(context.Background(), to, payload128); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "the handler ran", func() bool { return runs.Load() == 1 })
	testutil.WaitFor(t, 5*time.Second, "the charge given back", func() bool { return nodes[1].PeerQueuedBytes(nodes[0].Name()) == 0 })
	if err := nodes[0].Tell(context.Background(), to, payload128); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "the next message handled", func() bool { return runs.Load() == 2 })
}
