package node_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/node"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// A Tell of a message that can never fit a frame (body > MaxFrameSize)
// fails with a permanent error whether or not the send queue is crowded:
// refused by Admit (or the lane's early check) as a *CapacityError while
// it is, it would tell its caller to retry a message no retry can send.
func TestOversizedTellIsRefusedAsTooLargeWhileCrowded(t *testing.T) {
	const size = 200 << 10
	nodes := clusterWith(t, 2, func(i int, cfg *node.Config) {
		if i == 0 {
			cfg.Transport.MaxFrameSize, cfg.Transport.SendQueueBytes = 256<<10, 512<<10
		}
	})
	_, to := counter(t, nodes[1], "sink", 1<<16, -1)
	tooBig := wrapperspb.Bytes(make([]byte, 300<<10))
	ctx := context.Background()

	err := nodes[0].Tell(ctx, to, tooBig)
	var ce *node.CapacityError
	if err == nil || errors.As(err, &ce) {
		t.Fatalf("oversized Tell to an idle connection: %v, want a permanent error", err)
	}
	t.Logf("oversized Tell, idle queue: %v", err)

	// Keep the queue crowded with 200 KiB Tells from 8 senders.
	var stop atomic.Bool
	var refused atomic.Int64
	var wg sync.WaitGroup
	msg := wrapperspb.Bytes(make([]byte, size))
	for range 8 {
		wg.Go(func() {
			for !stop.Load() {
				var ce *node.CapacityError
				if err := nodes[0].Tell(ctx, to, msg); errors.As(err, &ce) {
					refused.Add(1)
					time.Sleep(ce.RetryAfter)
				}
			}
		})
	}
	defer func() { stop.Store(true); wg.Wait() }()

	deadline := time.Now().Add(3 * time.Second)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(deadline) {
		err := nodes[0].Tell(ctx, to, tooBig)
		if errors.As(err, &ce) {
			t.Fatalf("oversized Tell (300 KiB body, MaxFrameSize 256 KiB) while the queue is crowded: %v (RetryAfter %v), want the permanent error (%v)",
				err, ce.RetryAfter, "too large")
		}
		<-tick.C
	}
	if refused.Load() == 0 {
		t.Fatal("the senders were never refused: the test did not fill the queue")
	}
}
