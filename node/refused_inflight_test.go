package node_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
)

// A sender restored from a backup sends x under the sequence (3) of c,
// which its old self sent just before it was lost and which the actor is
// running. x is dropped from a full two-place DropOldest mailbox while c
// runs, when the watermark (2) says nothing about x. What must hold: y,
// chained to x, does not run after c in the old history, and x is never
// answered as a copy without having run. (c ends: the watermark is 3,
// another message than x's; y and z are answered DIVERGED, and the sender
// sends x, y and z again in a new epoch.)
func TestRestoredMessageDroppedWhileTheOneAtItsSequenceRunsIsNotLost(t *testing.T) {
	n := newNode(t, "n1", t.TempDir(), func(c *node.Config) {})
	h := newHoldSink("c")
	defer h.freeAll()
	if _, err := n.Spawn("sink", h.handler, node.WithMailbox(2, mailbox.DropOldest)); err != nil {
		t.Fatal(err)
	}
	var rs receipts
	runAB(t, n, &rs)
	n.DeliverIncoming(peerP, stringEnv(t, 3, 2, "c"), rs.reply("c"))
	waitStarted(t, h, "c")
	// The restored sender's emission [x y z] under 3, 4, 5; z evicts x.
	n.DeliverIncoming(peerP, stringEnv(t, 3, 2, "x"), rs.reply("x"))
	n.DeliverIncoming(peerP, stringEnv(t, 4, 3, "y"), rs.reply("y"))
	n.DeliverIncoming(peerP, stringEnv(t, 5, 4, "z"), rs.reply("z"))
	testutil.WaitFor(t, 5*time.Second, "x answered", func() bool { return rs.code("x") != 0 })
	h.free("c")
	testutil.WaitFor(t, 10*time.Second, "c, y, z answered", func() bool {
		return rs.code("c") != 0 && rs.code("y") != 0 && rs.code("z") != 0
	})
	checkRefusedNotLost(t, n, h, &rs, stringEnv(t, 3, 2, "x"), "x", "y", "z")
}

// The same with x refused at arrival because its sender's share of the
// node is full (c holds part of it while it runs), and y, small, taken
// into the mailbox behind c; and with x refused before the old c even
// arrived (a message of another stream holds the share), then c and y
// taken. Either way y must not run after c, and x must not be answered
// as a copy without having run.
func TestRestoredMessageRefusedForRoomBesideTheOneAtItsSequenceIsNotLost(t *testing.T) {
	big := strings.Repeat("x", 2000)
	for _, tc := range []struct {
		name     string
		oldFirst bool // c arrives (and runs) before x is refused
	}{{"old one running", true}, {"old one arriving after", false}} {
		t.Run(tc.name, func(t *testing.T) {
			x := stringEnv(t, 3, 2, big)
			budget := int64(proto.Size(x)) + 10 // x alone fits; beside anything else, not
			n := newNode(t, "n1", t.TempDir(), func(c *node.Config) { c.PeerQueuedBytes = budget })
			h := newHoldSink("c", "hold")
			defer h.freeAll()
			if _, err := n.Spawn("sink", h.handler); err != nil {
				t.Fatal(err)
			}
			var rs receipts
			runAB(t, n, &rs)
			if tc.oldFirst {
				n.DeliverIncoming(peerP, stringEnv(t, 3, 2, "c"), rs.reply("c"))
				waitStarted(t, h, "c")
			} else {
				// Another stream of the same sender holds part of its share.
				other := stringEnv(t, 1, 0, "hold")
				other.StreamEpoch = 7
				n.DeliverIncoming(peerP, other, rs.reply("hold"))
				waitStarted(t, h, "hold")
			}
			n.DeliverIncoming(peerP, x, rs.reply(big))
			testutil.WaitFor(t, 5*time.Second, "x answered", func() bool { return rs.code(big) != 0 })
			if got := rs.code(big); got != pb.Receipt_CAPACITY {
				t.Fatalf("x answered %v, want CAPACITY (refused for room)", got)
			}
			if !tc.oldFirst {
				n.DeliverIncoming(peerP, stringEnv(t, 3, 2, "c"), rs.reply("c"))
			}
			n.DeliverIncoming(peerP, stringEnv(t, 4, 3, "y"), rs.reply("y"))
			h.free("hold")
			h.free("c")
			testutil.WaitFor(t, 10*time.Second, "c and y answered", func() bool {
				return rs.code("c") != 0 && rs.code("y") != 0
			})
			checkRefusedNotLost(t, n, h, &rs, stringEnv(t, 3, 2, big), big, "y")
		})
	}
}

// runAB runs a (1) and b (2) of peer p's stream to sink@n1.
func runAB(t *testing.T, n *node.Node, rs *receipts) {
	t.Helper()
	for _, m := range []struct {
		v         string
		seq, prev uint64
	}{{"a", 1, 0}, {"b", 2, 1}} {
		if rc := rs.deliverWait(t, n, stringEnv(t, m.seq, m.prev, m.v)); rc.GetCode() != pb.Receipt_PROCESSED {
			t.Fatalf("%s: %v", m.v, rc)
		}
	}
}

// waitStarted waits until h's handler holds v.
func waitStarted(t *testing.T, h *holdSink, v string) {
	t.Helper()
	select {
	case <-h.started[v]:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not start", v)
	}
}

// checkRefusedNotLost sends the refused message again (its CAPACITY is
// not a verdict) as again, and fails if it is answered as delivered
// without having run, or if a message chained behind it (chained, by
// value) ran without it.
func checkRefusedNotLost(t *testing.T, n *node.Node, h *holdSink, rs *receipts, again *pb.Envelope, refused string, chained ...string) {
	t.Helper()
	again.MsgId = "again"
	rc := rs.deliverWait(t, n, again)
	ran := h.values()
	if slices.Contains(ran, refused) {
		return // it ran: nothing was taken for it
	}
	if code := rc.GetCode(); code == pb.Receipt_DUPLICATE || code == pb.Receipt_PROCESSED {
		t.Errorf("the refused message, sent again, was answered %v (its sender acks it) but never ran; ran %v", code, ran)
	}
	for _, v := range chained {
		if slices.Contains(ran, v) {
			t.Errorf("%s, chained behind the refused message, ran without it (answered %v); ran %v", v, rs.code(v), ran)
		}
	}
}
