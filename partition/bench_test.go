package partition_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/partition"
)

// BenchmarkRelayDrain drains a preloaded backlog of b.N messages over 16
// recipients of one node through the fake receiver, which answers at once
// (e.g. -benchtime=200000x for a 200k backlog). It measures the relay and
// the store's Head/Ack, not a network.
func BenchmarkRelayDrain(b *testing.B) {
	rg := newRig(b, nil, nil)
	const recipients = 16
	batch := make([]*pb.StoredMessage, 0, 4096)
	for i := range b.N {
		batch = append(batch, rg.msg(fmt.Sprintf("a%d@n1", i%recipients), "x"))
		if len(batch) == cap(batch) || i == b.N-1 {
			for _, err := range rg.relay.Store(context.Background(), batch) {
				if err != nil {
					b.Fatal(err)
				}
			}
			batch = batch[:0]
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	rg.relay.Start()
	testutil.WaitFor(b, 10*time.Minute, "drained", func() bool { return rg.store.Stats().Depth == 0 })
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkSendDirect measures Send's direct attempt (the common case of a
// settled stream to a live peer) from 16 concurrent callers, each on its
// own stream: no fsync on the sender's side.
func BenchmarkSendDirect(b *testing.B) {
	rg := newRig(b, nil, nil)
	rg.relay.Start()
	const callers = 16
	per := (b.N + callers - 1) / callers
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := fmt.Sprintf("a%d@n1", c)
			for range per {
				res, err := rg.relay.Send(context.Background(), rg.msg(r, "x"), true)
				if err != nil {
					b.Error(err)
					return
				}
				if res.Outcome != partition.Delivered && res.Outcome != partition.Queued {
					b.Errorf("outcome %v", res.Outcome)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(per*callers)/b.Elapsed().Seconds(), "msgs/s")
	b.ReportMetric(float64(rg.relay.Stats().Direct)/float64(per*callers), "direct/msg")
}
