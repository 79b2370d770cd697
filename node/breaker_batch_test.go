package node_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/transport"
)

// peerQ is a second fake verified sender.
var peerQ = transport.PeerInfo{Name: "q", BootID: "b", OutboxID: [16]byte{'q', 1}}

// A batch runs under one context bounded by the earliest TTL among its
// messages, so a message without a TTL (m2, from p) is cut short by
// another sender's message with a short one (n1, from q) that happens to
// wait behind it. The handler, a commit that honours its context as any
// database call does, fails at that deadline, and m2, which alone would
// have had HandlerTimeout (30 s) and succeeded, is answered TRANSIENT: an
// attempt counted against a healthy message for another sender's TTL.
// Repeated MaxAttempts times (a peer that keeps sending short-TTL
// messages), m2 is dead-lettered.
func TestBreakerBatchDeadlineOfAnotherMessageChargesHealthyOne(t *testing.T) {
	n := startNode(t, "n1", t.TempDir())
	hold, started := make(chan struct{}), make(chan struct{})
	var once sync.Once
	h := func(ctx context.Context, msgs []*node.Message) (int, error) {
		if msgs[0].ID() == "m1" {
			once.Do(func() { close(started) })
			<-hold
			return len(msgs), nil
		}
		// A commit that takes a while (a slow disk) and honours ctx.
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(1500 * time.Millisecond):
			return len(msgs), nil
		}
	}
	if _, err := n.Spawn("a", noHandler, node.WithBatch(h, 0)); err != nil {
		t.Fatal(err)
	}
	var rs receipts
	m1 := streamEnv("a", "n1", 1, 0)
	n.DeliverIncoming(peerP, m1, rs.reply("m1"))
	<-started
	m2 := streamEnv("a", "n1", 2, 1) // no TTL
	n.DeliverIncoming(peerP, m2, rs.reply("m2"))
	q1 := streamEnv("a", "n1", 1, 0)
	q1.MsgId, q1.Sender, q1.TtlMs = "q1", "@q", 400 // another sender's message, 400 ms to live
	n.DeliverIncoming(peerQ, q1, rs.reply("q1"))
	close(hold)
	testutil.WaitFor(t, 10*time.Second, "all receipts", func() bool { return rs.len() == 3 })
	if c := rs.code("m2"); c != pb.Receipt_PROCESSED {
		rs.mu.Lock()
		msg := rs.got["m2"].GetMessage()
		rs.mu.Unlock()
		t.Fatalf("m2 (no TTL, healthy handler) answered %v %q: charged an attempt because q1's TTL bounded its batch", c, msg)
	}
}
