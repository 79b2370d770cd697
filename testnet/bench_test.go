package testnet

import (
	"context"
	"testing"

	"github.com/meshnode/meshnode/node"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// BenchmarkReliableThroughFaultNet measures TellReliable between two nodes
// whose packets go through the fault network (healed): the overhead the
// harness adds on the hot path shows against node's own benchmarks.
func BenchmarkReliableThroughFaultNet(b *testing.B) {
	c := New(b, 2, WithSpawn(func(_ int, n *node.Node) error {
		_, err := n.Spawn("sink", func(context.Context, *node.Message) (proto.Message, error) { return nil, nil })
		return err
	}))
	ctx := context.Background()
	to := c.Addr("sink", 1)
	msg := wrapperspb.Bytes(make([]byte, 128))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := c.Node(0).TellReliable(ctx, to, msg); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	if err := c.WaitDrained(30e9); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}
