package node_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
	"google.golang.org/protobuf/proto"
)

// A handler that stores its effects with their sequences can be ahead of
// the node's watermark after a crash. Spawned WithApplied, its progress is
// what the stream's receipts report while it is ahead, so a sender whose
// state went back learns what ran; the messages still run (the handler
// skips what it applied; keys and replies are recorded as usual), and once
// the watermark passes it the receipts report the watermark.
func TestAppliedSequencesAreTheWatermark(t *testing.T) {
	n := startNode(t, "n1", t.TempDir())
	var ran atomic.Int64
	var asked atomic.Int64
	if _, err := n.Spawn("a", func(context.Context, *node.Message) (proto.Message, error) {
		ran.Add(1)
		return nil, nil
	}, node.WithApplied(func(s node.StreamID) uint64 {
		asked.Add(1)
		if s.Node != "p" || s.Actor != "a" {
			t.Errorf("applied asked for %v", s)
		}
		return 10
	})); err != nil {
		t.Fatal(err)
	}
	var rs receipts
	deliver := func(env *pb.Envelope) *pb.Receipt { t.Helper(); return rs.deliverWait(t, n, env) }
	if rc := deliver(streamEnv("a", "n1", 5, 0)); rc.GetCode() != pb.Receipt_PROCESSED || rc.GetWatermark() != 10 {
		t.Fatalf("sequence 5 below the applied 10: %v watermark %d, want PROCESSED reporting 10", rc.GetCode(), rc.GetWatermark())
	}
	cp := streamEnv("a", "n1", 5, 0)
	cp.MsgId += "-copy" // each emission gives a message its own msg id
	if rc := deliver(cp); rc.GetCode() != pb.Receipt_DUPLICATE || rc.GetWatermark() != 10 {
		t.Fatalf("a copy of 5: %v watermark %d, want DUPLICATE reporting 10", rc.GetCode(), rc.GetWatermark())
	}
	if rc := deliver(streamEnv("a", "n1", 11, 5)); rc.GetCode() != pb.Receipt_PROCESSED || rc.GetWatermark() != 11 {
		t.Fatalf("sequence 11: %v watermark %d, want PROCESSED reporting its own 11", rc.GetCode(), rc.GetWatermark())
	}
	if ran.Load() != 2 || asked.Load() != 1 {
		t.Fatalf("handler ran %d times, applied asked %d times; want 2 and 1 (once, when the stream loaded)", ran.Load(), asked.Load())
	}
}
