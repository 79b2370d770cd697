package node_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
)

// A reliable message larger than the byte bound was refused once, then
// delivered. After its window lapsed, while reliable traffic keeps a
// stream message queued, a small tell to a nearly empty mailbox is
// accepted: the room in bytes kept for the message expected back does not
// outlive its window.
func TestRoomForALargeReliableMessageLapses(t *testing.T) {
	n := startNode(t, "n1", t.TempDir())
	const maxBytes = 4096
	gate := map[string]chan struct{}{"block": make(chan struct{}), "m3": make(chan struct{})}
	started := map[string]chan struct{}{"block": make(chan struct{}), "m3": make(chan struct{})}
	h := func(_ context.Context, m *node.Message) (proto.Message, error) {
		id := m.Envelope().GetMsgId()
		if m.Sequence() == 0 {
			var v wrapperspb.StringValue
			_ = m.Decode(&v)
			id = v.GetValue()
		}
		if g, ok := gate[id]; ok {
			close(started[id])
			<-g
		}
		return nil, nil
	}
	if _, err := n.Spawn("a", h, node.WithMailbox(8, mailbox.Reject), node.WithMailboxBytes(maxBytes)); err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, g := range gate {
			select {
			case <-g:
			default:
				close(g)
			}
		}
	}()
	var rs receipts
	rel := func(seq, prev uint64, body int) {
		env := streamEnv("a", "n1", seq, prev)
		if body > 0 {
			env.Body = &anypb.Any{TypeUrl: "type.googleapis.com/google.protobuf.BytesValue", Value: make([]byte, body)}
		}
		n.DeliverIncoming(peerP, env, rs.reply(env.GetMsgId()))
	}
	if err := n.Tell(ctxT(t), node.Addr("a", "n1"), wrapperspb.String("block")); err != nil {
		t.Fatal(err)
	}
	<-started["block"]
	rel(1, 0, 0)    // queued behind the blocked handler
	rel(2, 1, 5000) // larger than the bound: refused for room, expected back
	testutil.WaitFor(t, 5*time.Second, "m2 refused", func() bool { return rs.code("m2") == pb.Receipt_CAPACITY })
	close(gate["block"])
	testutil.WaitFor(t, 5*time.Second, "m1 processed", func() bool { return rs.code("m1") == pb.Receipt_PROCESSED })
	rel(2, 1, 5000) // sent again: fits the empty mailbox, runs
	testutil.WaitFor(t, 5*time.Second, "m2 processed", func() bool { return rs.code("m2") == pb.Receipt_PROCESSED })
	// Steady reliable traffic: m3 runs (slowly), m4 waits behind it.
	rel(3, 2, 0)
	<-started["m3"]
	rel(4, 3, 0)
	// The window kept for m2 lapses (twice its hint and a second).
	testutil.WaitFor(t, 10*time.Second, "the window lapsed", func() bool {
		_, until, now := n.RoomState("a")
		return until == 0 || now > until+100
	})
	sq, until, now := n.RoomState("a")
	var st mailbox.Stats
	for _, a := range n.ActorStats() {
		if a.Name == "a" {
			st = a.Stats
		}
	}
	t.Logf("streamsQueued=%d waitUntil=%d now=%d; mailbox depth %d/%d, bytes %d/%d", sq, until, now, st.Depth, st.Capacity, st.Bytes, st.MaxBytes)
	err := n.Tell(ctxT(t), node.Addr("a", "n1"), wrapperspb.String("small"))
	var ce *node.CapacityError
	if errors.As(err, &ce) {
		t.Fatalf("a small tell to a mailbox holding %d of %d items and %d of %d bytes was refused after the window lapsed: %v",
			st.Depth, st.Capacity, st.Bytes, st.MaxBytes, err)
	}
	if err != nil {
		t.Fatal(err)
	}
}
