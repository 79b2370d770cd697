package partition_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/partition"
)

// The stall of TestDispatchThatLosesItsSlotToADirectSendIsRetried and
// TestDirectSendsReleaseWakesTheLoop with no hook and no held lock:
// x is queued while direct Sends (1 ms round trips) to y, another
// recipient of the same node in the other partition, come and go. When a
// direct attempt holds n2's one slot at the moment x's loop scans or
// dispatches x, the loop skips x and sleeps without a timer; the
// attempt's release wakes no loop (n2 was never excluded) and Send
// notifies only y's partition. x, queued to a live peer whose slot is
// free, is never sent. With release waking every loop, 300 trials pass.
func TestQueuedMessageIsSentBesideDirectSends(t *testing.T) {
	rg := newRig(t, nil, func(c *partition.Config) {
		c.Partitions = 2
		c.Limiter = partition.LimiterConfig{Initial: 1, Min: 1, Max: 1}
	})
	rg.fake.set(func(f *fake) {
		f.intercept = func(_ context.Context, _ int, envs []*pb.Envelope) ([]*pb.Receipt, error, bool) {
			if envs[0].GetRecipient()[0] == 'y' {
				time.Sleep(time.Millisecond) // a round trip's latency
			}
			return nil, nil, false
		}
	})
	rg.relay.Start()
	ctx := context.Background()
	const trials = 300
	for i := range trials {
		var x, y string
		for j := 0; ; j++ {
			x = fmt.Sprintf("x%d_%d@n2", i, j)
			if partition.PartitionOf(x, 2) == 0 {
				break
			}
		}
		for j := 0; ; j++ {
			y = fmt.Sprintf("y%d_%d@n2", i, j)
			if partition.PartitionOf(y, 2) == 1 {
				break
			}
		}
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range 10 {
				sm := rg.msg(y, fmt.Sprintf("y%d", k))
				if _, err := rg.relay.Send(ctx, sm, true); err != nil {
					t.Error(err)
				}
			}
		}()
		rg.queue(t, x, "x")
		wg.Wait()
		deadline := time.Now().Add(3 * time.Second)
		for rg.fake.ranCount(x) == 0 || rg.fake.ranCount(y) < 10 {
			if time.Now().After(deadline) {
				lim := rg.relay.Limiter("n2")
				t.Fatalf("trial %d: %s stalled: ran x %d, y %d; pending x %d; n2 limiter %d/%d, %d excluded: queued to a live peer with a free slot, never sent",
					i, x, rg.fake.ranCount(x), rg.fake.ranCount(y), rg.store.Pending(x), lim.InFlight(), lim.Limit(), rg.store.ExcludedNodes())
			}
			time.Sleep(time.Millisecond) // polling interval; the condition decides
		}
	}
}
