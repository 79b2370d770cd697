package node_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/node"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Tells, asks and reliable sends from n1 to many actors of n2 (more
// routes than a lane stream names, so past the bound too), concurrently:
// every handler sees the recipient it was sent to and the sender "@n1",
// and every asker gets the reply of the actor it asked.
func TestEveryHandlerSeesItsRoute(t *testing.T) {
	nodes := cluster(t, 2)
	const actors = 1100
	var got, wrong atomic.Int64
	var bad atomic.Value
	addrs := make([]node.Address, actors)
	for i := range actors {
		name := fmt.Sprintf("r%d", i)
		to, err := nodes[1].Spawn(name, func(ctx context.Context, m *node.Message) (proto.Message, error) {
			var v wrapperspb.StringValue
			if err := m.Decode(&v); err != nil || v.GetValue() != name || m.Recipient().Actor != name || m.Sender().String() != "@n1" {
				wrong.Add(1)
				bad.Store(fmt.Sprintf("%s got %q from %s to %s", name, v.GetValue(), m.Sender(), m.Recipient()))
			}
			got.Add(1)
			return wrapperspb.String(name), nil
		})
		if err != nil {
			t.Fatal(err)
		}
		addrs[i] = to
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var sent atomic.Int64
	for g := range 8 {
		wg.Go(func() {
			for i := g; i < actors; i += 8 {
				to, v := addrs[i], wrapperspb.String(addrs[i].Actor)
				switch i % 3 {
				case 0:
					if err := nodes[0].Tell(ctx, to, v); err != nil {
						t.Error(err)
						return
					}
				case 1:
					var resp wrapperspb.StringValue
					if err := nodes[0].Ask(ctx, to, v, &resp); err != nil {
						t.Error(err)
						return
					}
					if resp.GetValue() != to.Actor {
						t.Errorf("ask of %s answered %q", to.Actor, resp.GetValue())
					}
				case 2:
					if _, err := nodes[0].TellReliable(ctx, to, v); err != nil {
						t.Error(err)
						return
					}
				}
				sent.Add(1)
			}
		})
	}
	wg.Wait()
	testutil.WaitFor(t, 30*time.Second, "every message handled", func() bool { return got.Load() >= sent.Load() })
	if n := wrong.Load(); n > 0 {
		t.Fatalf("%d handlers saw another route or message, e.g. %v", n, bad.Load())
	}
	if got.Load() != sent.Load() || sent.Load() != actors {
		t.Fatalf("%d handled, %d sent of %d", got.Load(), sent.Load(), actors)
	}
}
