package node_test

import (
	"context"
	"testing"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
	"google.golang.org/protobuf/proto"
)

// BenchmarkStreamMessage measures one stream message at a receiver, from
// arrival to its PROCESSED receipt (which waits for the watermark's
// group commit), one at a time.
func BenchmarkStreamMessage(b *testing.B) {
	n := startNode(b, "n1", b.TempDir())
	if _, err := n.Spawn("a", func(context.Context, *node.Message) (proto.Message, error) { return nil, nil }); err != nil {
		b.Fatal(err)
	}
	ch := make(chan *pb.Receipt, 1)
	b.ResetTimer()
	for i := range b.N {
		env := streamEnv("a", "n1", uint64(i+1), uint64(i))
		n.DeliverIncoming(peerP, env, func(rc *pb.Receipt) { ch <- rc })
		if rc := <-ch; rc.GetCode() != pb.Receipt_PROCESSED {
			b.Fatalf("receipt %v", rc)
		}
	}
}
