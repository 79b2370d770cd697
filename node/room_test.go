package node_test

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
	"google.golang.org/protobuf/proto"
)

// The receipts of stream messages say how many more messages the actor's
// mailbox could take as each was written, and the highest sequence of the
// stream that had reached the mailbox by then: its sender sizes what it
// sends ahead of its receipts by them. m1 runs while m2..m5 wait in a
// mailbox of 8, and m2 does not end before m1's receipt came: room 4, or
// 5 with m2 taken (a batch actor takes m2..m5 one after another into its
// batch, and m1's receipt, written when its watermark is durable, may come
// at any point of that: 4 to 8), arrived 5.
// Once all ran, the mailbox is empty.
func TestReceiptsSayTheMailboxRoom(t *testing.T) {
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
			n := startNode(t, "r", t.TempDir())
			started, gate, gate2 := make(chan struct{}, 8), make(chan struct{}), make(chan struct{})
			wait := func() {
				started <- struct{}{}
				<-gate
			}
			calls := 0
			opts := []node.SpawnOption{node.WithMailbox(8, mailbox.Reject)}
			if batch {
				opts = append(opts, node.WithBatch(func(_ context.Context, msgs []*node.Message) (int, error) {
					switch calls++; calls {
					case 1:
						wait()
					case 2:
						<-gate2
					}
					return len(msgs), nil
				}, 0))
			}
			if _, err := n.Spawn("a", func(_ context.Context, m *node.Message) (proto.Message, error) {
				switch m.Envelope().GetSequence() {
				case 1:
					wait()
				case 2:
					<-gate2
				}
				return nil, nil
			}, opts...); err != nil {
				t.Fatal(err)
			}
			var rs receipts
			deliver := func(seq uint64) {
				env := streamEnv("a", "r", seq, seq-1)
				n.DeliverIncoming(peerP, env, rs.reply(env.GetMsgId()))
			}
			deliver(1)
			<-started // m1 is running
			for seq := uint64(2); seq <= 5; seq++ {
				deliver(seq)
			}
			close(gate)
			testutil.WaitFor(t, 5*time.Second, "m1's receipt", func() bool { return rs.len() == 1 })
			close(gate2)
			testutil.WaitFor(t, 5*time.Second, "every receipt", func() bool { return rs.len() == 5 })
			rs.mu.Lock()
			defer rs.mu.Unlock()
			for id, rc := range rs.got {
				if rc.GetCode() != pb.Receipt_PROCESSED {
					t.Fatalf("%s: %v", id, rc)
				}
			}
			want := map[uint32]bool{4: true, 5: true, 6: batch, 7: batch, 8: batch}
			if rc := rs.got["m1"]; rc.GetArrived() != 5 || !want[rc.GetRoom()] {
				t.Errorf("m1's receipt says room %d, arrived %d; want 4 to %d, and 5", rc.GetRoom(), rc.GetArrived(), map[bool]int{false: 5, true: 8}[batch])
			}
			if rc := rs.got["m5"]; rc.GetArrived() != 5 || rc.GetRoom() != 8 {
				t.Errorf("m5's receipt says room %d, arrived %d; want 8 and 5", rc.GetRoom(), rc.GetArrived())
			}
		})
	}
}

// A mailbox bounded by bytes says the room its bytes leave, not its free
// places: the sender sizes what it sends ahead by it. m1 runs while the
// byte bound of the mailbox fills; its receipt says no more room than the
// bound took in all.
func TestReceiptRoomCountsTheMailboxBytes(t *testing.T) {
	n := startNode(t, "r", t.TempDir())
	started, gate, gate2 := make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
	if _, err := n.Spawn("a", func(_ context.Context, m *node.Message) (proto.Message, error) {
		switch m.Envelope().GetSequence() {
		case 1:
			started <- struct{}{}
			<-gate
		case 2:
			<-gate2
		}
		return nil, nil
	}, node.WithMailbox(1024, mailbox.Reject), node.WithMailboxBytes(1800)); err != nil {
		t.Fatal(err)
	}
	var rs receipts
	deliver := func(seq uint64) string {
		env := streamEnv("a", "r", seq, seq-1)
		n.DeliverIncoming(peerP, env, rs.reply(env.GetMsgId()))
		return env.GetMsgId()
	}
	deliver(1)
	<-started
	fit := 0 // messages the byte bound took besides m1
	for seq := uint64(2); ; seq++ {
		if seq == 50 {
			t.Fatal("the byte bound never refused")
		}
		if rs.code(deliver(seq)) == pb.Receipt_CAPACITY {
			break
		}
		fit++
	}
	close(gate)
	testutil.WaitFor(t, 5*time.Second, "m1's receipt", func() bool { return rs.code("m1") != pb.Receipt_CODE_UNSPECIFIED })
	close(gate2)
	rs.mu.Lock()
	rc := rs.got["m1"]
	rs.mu.Unlock()
	if rc.GetCode() != pb.Receipt_PROCESSED || rc.GetRoom() > uint32(fit) {
		t.Fatalf("m1's receipt %v: room %d, but the mailbox's bytes took %d in all and were full", rc.GetCode(), rc.GetRoom(), fit)
	}
}

// A mailbox of more places than a receipt's room can say (2^32) says as
// much as it can, not its places cut to 32 bits (which reads 0 here).
func TestReceiptRoomOfAHugeMailbox(t *testing.T) {
	places := uint64(1) << 32
	if uint64(math.MaxInt) < places {
		t.Skip("where an int has 32 bits, no mailbox has more places than a receipt's room says")
	}
	n := startNodeWith(t, "r", t.TempDir(), func(c *node.Config) { c.PeerQueuedBytes = 1 << 60 })
	if _, err := n.Spawn("a", func(context.Context, *node.Message) (proto.Message, error) { return nil, nil },
		node.WithMailbox(int(places), mailbox.Reject), node.WithMailboxBytes(1<<60)); err != nil {
		t.Fatal(err)
	}
	var rs receipts
	if rc := rs.deliverWait(t, n, streamEnv("a", "r", 1, 0)); rc.GetCode() != pb.Receipt_PROCESSED || rc.GetRoom() != math.MaxUint32 {
		t.Fatalf("an empty mailbox of 2^32 places: %v, room %d", rc.GetCode(), rc.GetRoom())
	}
}
