package node_test

import (
	"context"
	"testing"

	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
	"google.golang.org/protobuf/proto"
)

// A stream message refused for room did not run, and its CAPACITY receipt
// says the stream's durable watermark (a DUPLICATE's does too): a sender
// restored from a backup learns from it that its sequences went back.
func TestRoomRefusalSaysTheStreamsWatermark(t *testing.T) {
	n := startNode(t, "n1", t.TempDir())
	started, release := make(chan struct{}), make(chan struct{})
	if _, err := n.Spawn("a", func(_ context.Context, m *node.Message) (proto.Message, error) {
		if m.Sequence() == 2 {
			close(started)
			<-release
		}
		return nil, nil
	}, node.WithMailbox(1, mailbox.Reject)); err != nil {
		t.Fatal(err)
	}
	defer close(release)
	var rs receipts
	if c := rs.deliverWait(t, n, streamEnv("a", "n1", 1, 0)).GetCode(); c != pb.Receipt_PROCESSED {
		t.Fatalf("m1: %v, want PROCESSED", c)
	}
	n.DeliverIncoming(peerP, streamEnv("a", "n1", 2, 1), rs.reply("m2"))
	<-started                                                            // m2 in the handler
	n.DeliverIncoming(peerP, streamEnv("a", "n1", 3, 2), rs.reply("m3")) // in the mailbox: full
	rc := rs.deliverWait(t, n, streamEnv("a", "n1", 4, 3))
	if rc.GetCode() != pb.Receipt_CAPACITY || rc.GetWatermark() != 1 {
		t.Fatalf("m4 refused for room: %v, watermark %d; want CAPACITY with the watermark 1", rc.GetCode(), rc.GetWatermark())
	}
}
