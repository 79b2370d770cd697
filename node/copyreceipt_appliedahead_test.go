package node_test

import (
	"path/filepath"
	"testing"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
)

// A stream whose handler is ahead (WithApplied 2) ran a1 (durable 1) and
// a2 (its watermark 2, its commit stalled). A copy of a1 is answered early
// (DUPLICATE) with the applied watermark 2, which is also the stream's
// watermark, whose digest (a2's) is known: the receipt must carry it.
// Without it, a restored sender holding another message under 2 could
// not tell its sequences went back, and would ack a new message under 1.
func TestCopyAnsweredWithTheAppliedWatermarkKeepsItsDigest(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "outbox.db")
	g := newMetaGate(t, path)
	n := newNode(t, "n1", dir, func(c *node.Config) {})
	s := new(sink)
	if _, err := n.Spawn("sink", s.handler, node.WithApplied(func(node.StreamID) uint64 { return 2 })); err != nil {
		t.Fatal(err)
	}
	var rs receipts
	if rc := rs.deliverWait(t, n, stringEnv(t, 1, 0, "a")); rc.GetCode() != pb.Receipt_PROCESSED {
		t.Fatalf("a1: %v", rc.GetCode())
	}
	g.armed.Store(true)
	defer g.releaseAll()
	a2 := stringEnv(t, 2, 1, "a")
	n.DeliverIncoming(peerP, a2, rs.reply("a2"))
	rel := g.next(t, "a2's watermark commit") // st.w = 2 (= applied), durable 1
	defer close(rel)
	cp := stringEnv(t, 1, 0, "a")
	cp.MsgId = "a1-copy"
	rc := rs.deliverWait(t, n, cp)
	t.Logf("copy of a1: %v watermark %d digest %d (a2's digest %d)", rc.GetCode(), rc.GetWatermark(), rc.GetWatermarkDigest(), pb.StreamDigest(a2))
	if rc.GetCode() == pb.Receipt_DUPLICATE && rc.GetWatermark() == 2 && rc.GetWatermarkDigest() != pb.StreamDigest(a2) {
		t.Fatalf("copy of a1 answered DUPLICATE watermark 2 (the stream's watermark, a2 ran there) with digest %d, not a2's %d: a restored sender holding another message under 2 cannot tell", rc.GetWatermarkDigest(), pb.StreamDigest(a2))
	}
}
