package partition_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
)

// BenchmarkRelayDrain drains a preloaded backlog of b.N messages over 16
// recipients of one node through a fake that answers instantly (e.g.
// -benchtime=200000x for the DESIGN's 200k backlog).
func BenchmarkRelayDrain(b *testing.B) {
	rg := newRig(b, nil, nil)
	rg.fake.set(func(f *fake) { f.behave["*"] = nil })
	const recipients = 16
	envs := make([]*pb.Envelope, 0, 4096)
	for i := 0; i < b.N; i++ {
		envs = append(envs, &pb.Envelope{Recipient: fmt.Sprintf("a%d@n1", i%recipients), Type: "x"})
		if len(envs) == cap(envs) || i == b.N-1 {
			for _, err := range rg.store.EnqueueBatch(context.Background(), envs) {
				if err != nil {
					b.Fatal(err)
				}
			}
			envs = envs[:0]
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	rg.relay.Start()
	testutil.WaitFor(b, 10*60e9, "drained", func() bool { return rg.store.Stats().Depth == 0 })
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}
