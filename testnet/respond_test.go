package testnet

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/node"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestAskerOnADeadLinkDoesNotHoldTheActor: node 1's asks reach node 0,
// but nothing node 0 sends reaches node 1 (a one-way outage), so node 0's
// send queue to it stays full. A response waits for room only while the
// queue drains and at most a second: the actor goes on, and node 2's ask,
// queued behind node 1's, is answered (had a response waited for its
// asker's deadline, 30 s, node 2's would have waited out its own, 10 s).
func TestAskerOnADeadLinkDoesNotHoldTheActor(t *testing.T) {
	big := wrapperspb.String(strings.Repeat("x", 200<<10))
	var fromOne atomic.Int64
	gate := make(chan struct{})
	var openGate sync.Once
	c := New(t, 3,
		WithConfig(func(i int, cfg *node.Config) {
			if i == 0 {
				cfg.Transport.SendQueueSize = 1 // the responder's queue; askers keep theirs
			}
		}),
		WithSpawn(func(i int, n *node.Node) error {
			if i != 0 {
				return nil
			}
			_, err := n.Spawn("big", func(ctx context.Context, m *node.Message) (proto.Message, error) {
				if m.Sender().Node == "n1" && fromOne.Add(1) == 2 {
					<-gate // the rest of node 1's asks queue up meanwhile
				}
				return big, nil
			})
			return err
		}))
	t.Cleanup(func() { openGate.Do(func() { close(gate) }) }) // before the cluster's Close
	to := c.Addr("big", 0)
	var reply wrapperspb.StringValue
	for _, i := range []int{1, 2} { // connections up before the outage
		if err := c.Node(i).Ask(context.Background(), to, wrapperspb.String("warm-up"), &reply); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	framesIn := c.Node(0).PeerStats()[c.Name(1)].FramesIn
	const asks = 20
	for range asks {
		wg.Go(func() {
			var r wrapperspb.StringValue
			long, cancelLong := context.WithTimeout(ctx, 30*time.Second)
			defer cancelLong()
			_ = c.Node(1).Ask(long, to, wrapperspb.String("q"), &r) // never answered: the link back is down
		})
	}
	defer func() { cancel(); wg.Wait() }()
	// Every ask of node 1's is at node 0, the first answered, the second in
	// the handler: then the link back goes down, and the answers to the
	// rest find node 0's send queue to node 1 full.
	testutil.WaitFor(t, 10*time.Second, "node 1's asks at node 0", func() bool {
		return c.Node(0).PeerStats()[c.Name(1)].FramesIn >= framesIn+asks && fromOne.Load() == 2
	})
	if err := c.Drop(0, 1, 1); err != nil {
		t.Fatal(err)
	}
	openGate.Do(func() { close(gate) })
	short, cancelShort := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelShort()
	if err := c.Node(2).Ask(short, to, wrapperspb.String("q"), &reply); err != nil {
		t.Fatalf("node 2's ask behind those of an asker whose link back is down: %v (the actor ran %d of node 1's)", err, fromOne.Load())
	}
}
