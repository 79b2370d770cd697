package testnet

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/outbox"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// A backlog drained over a link of 5 ms each way into an actor that takes
// about 200 µs a message, through a mailbox of one emission (BatchSize;
// the defaults pair them too): the receiver takes less in a round trip
// than its mailbox holds, so early emissions keep no more in flight than
// it does, and the drain meets no refusal. Counting what the receiver
// takes in a round trip as room whatever its size made each early
// emission fill the mailbox exactly at the receiver's pace, and every
// wavering of that pace overran it: refusals, the chained emission behind
// each answered OUT_OF_ORDER, and the AIMD limit halved.
func TestBusyReceiverOverALinkIsNotOverrun(t *testing.T) {
	const (
		batchSize = 64
		total     = 2000
		delay     = 5 * time.Millisecond
	)
	var mu sync.Mutex
	var ran []int64
	cl := New(t, 2,
		WithConfig(func(_ int, cfg *node.Config) { cfg.Relay.BatchSize = batchSize }),
		WithSpawn(func(i int, n *node.Node) error {
			if i != 1 {
				return nil
			}
			_, err := n.Spawn("sink", func(_ context.Context, m *node.Message) (proto.Message, error) {
				var v wrapperspb.Int64Value
				if err := m.Decode(&v); err != nil {
					return nil, err
				}
				mu.Lock()
				ran = append(ran, v.GetValue())
				mu.Unlock()
				time.Sleep(200 * time.Microsecond) // the handler's work, not a wait for a state
				return nil, nil
			}, node.WithMailbox(batchSize, mailbox.Reject))
			return err
		}))
	if err := cl.Stop(1); err != nil {
		t.Fatal(err)
	}
	if err := cl.WaitDown(1, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	to := cl.Addr("sink", 1)
	ps := make([]*node.Pending, 0, total)
	for i := range total {
		p, err := cl.Node(0).TellReliableAsync(ctx, to, wrapperspb.Int64(int64(i)))
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	for _, p := range ps {
		if _, err := p.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range [][2]int{{0, 1}, {1, 0}} {
		if err := cl.Delay(l[0], l[1], delay); err != nil {
			t.Fatal(err)
		}
	}
	if err := cl.Restart(1); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 90*time.Second, "the drain", func() bool { return cl.Node(0).Outbox().Stats().Depth == 0 })
	mu.Lock()
	defer mu.Unlock()
	if len(ran) != total {
		t.Fatalf("ran %d of %d", len(ran), total)
	}
	for i, v := range ran {
		if v != int64(i) {
			t.Fatalf("ran %d at %d", v, i)
		}
	}
	if dl, err := cl.Node(0).Outbox().DeadLetters(outbox.DLQFilter{}); err != nil || len(dl) > 0 {
		t.Fatalf("dead letters %d (%v)", len(dl), err)
	}
	if s := cl.Node(1).Stats(); s.RefusedFull > 0 || s.OutOfOrder > 0 {
		t.Fatalf("the drain was refused: %d messages CAPACITY (mailbox full), %d OUT_OF_ORDER", s.RefusedFull, s.OutOfOrder)
	}
}
