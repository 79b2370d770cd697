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

// TestSmallSendQueueDrainsManyStreams: with a send queue of 16 on both
// nodes (a valid configuration), 32 streams of 200 reliable messages to
// batch actors drain in order. A receiver's group commit answers the
// messages of many streams in one loop, so its control lane holds far more
// receipts than SendQueueSize for a moment; a receipt dropped there left
// its emission waiting for DeliverTimeout on a healthy connection, holding
// the peer's slots, and the drain stalled (thousands of messages still
// queued after 10 s; about 0.4 s with every receipt kept).
func TestSmallSendQueueDrainsManyStreams(t *testing.T) {
	const actors, per = 32, 200
	nodes := clusterWith(t, 2, func(i int, cfg *node.Config) {
		cfg.Transport.SendQueueSize = 16
		cfg.Relay.DeliverTimeout = 15 * time.Second
	})
	var handled atomic.Int64
	for a := range actors {
		var mu sync.Mutex
		next := 0
		one := func(m *node.Message) error {
			var v wrapperspb.Int64Value
			if err := m.Decode(&v); err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			if int(v.GetValue()) != next {
				t.Errorf("actor a%d: got %d, want %d", a, v.GetValue(), next)
			}
			next = int(v.GetValue()) + 1
			handled.Add(1)
			return nil
		}
		batch := func(ctx context.Context, msgs []*node.Message) (int, error) {
			for i, m := range msgs {
				if err := one(m); err != nil {
					return i, err
				}
			}
			return len(msgs), nil
		}
		_, err := nodes[1].Spawn(fmt.Sprintf("a%d", a), func(ctx context.Context, m *node.Message) (proto.Message, error) {
			return nil, one(m)
		}, node.WithBatch(batch, 0))
		if err != nil {
			t.Fatal(err)
		}
	}
	ctx := ctxT(t)
	var wg sync.WaitGroup
	for a := range actors {
		wg.Go(func() {
			to := node.Addr(fmt.Sprintf("a%d", a), nodes[1].Name())
			for i := range per {
				if _, err := nodes[0].TellReliableAsync(ctx, to, wrapperspb.Int64(int64(i))); err != nil {
					t.Errorf("TellReliableAsync: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	testutil.WaitFor(t, 10*time.Second, "every message handled and acknowledged (DeliverTimeout is 15 s)", func() bool {
		return handled.Load() == actors*per && nodes[0].Outbox().Stats().Depth == 0
	})
}
