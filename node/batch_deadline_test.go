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

// A message's handler deadline is its own, not the earliest TTL of the
// batch it runs in. Were a batch run under one context bounded by its
// earliest TTL, a message without a TTL (m2, from p) would be cut short
// by another sender's message with a short one (n1, from q) that happens
// to wait behind it: the handler, a commit that honours its context as
// any database call does, would fail at that deadline, and m2, which
// alone has HandlerTimeout (30 s) and succeeds, would be answered
// TRANSIENT, an attempt counted for another sender's TTL; repeated
// MaxAttempts times (a peer that keeps sending short-TTL messages), m2
// would be dead-lettered.
func TestAnotherMessagesDeadlineDoesNotChargeAHealthyOne(t *testing.T) {
	// A commit that takes a while (a slow disk); q1 has 400 ms to live.
	rs := batchBehindAnotherSendersTTL(t, 1500*time.Millisecond, 400)
	if c := rs.code("m2"); c != pb.Receipt_PROCESSED {
		rs.mu.Lock()
		msg := rs.got["m2"].GetMessage()
		rs.mu.Unlock()
		t.Fatalf("m2 (no TTL, healthy handler) answered %v %q: charged an attempt because q1's TTL bounded its batch", c, msg)
	}
}

// batchBehindAnotherSendersTTL runs a batch actor whose first batch (m1,
// from p) holds until m2 (from p, no TTL) and q1 (from q, ttlMs to live)
// wait behind it; its later batches take commit, a commit that honours
// its context as any database call does. It returns the three receipts
// once all are in.
func batchBehindAnotherSendersTTL(t *testing.T, commit time.Duration, ttlMs int64) *receipts {
	t.Helper()
	n := startNode(t, "n1", t.TempDir())
	hold, started := make(chan struct{}), make(chan struct{})
	var once sync.Once
	h := func(ctx context.Context, msgs []*node.Message) (int, error) {
		if msgs[0].ID() == "m1" {
			once.Do(func() { close(started) })
			<-hold
			return len(msgs), nil
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(commit):
			return len(msgs), nil
		}
	}
	if _, err := n.Spawn("a", noHandler, node.WithBatch(h, 0)); err != nil {
		t.Fatal(err)
	}
	rs := &receipts{}
	n.DeliverIncoming(peerP, streamEnv("a", "n1", 1, 0), rs.reply("m1"))
	<-started
	n.DeliverIncoming(peerP, streamEnv("a", "n1", 2, 1), rs.reply("m2"))
	q1 := streamEnv("a", "n1", 1, 0)
	q1.MsgId, q1.Sender, q1.TtlMs = "q1", "@q", ttlMs
	n.DeliverIncoming(peerQ, q1, rs.reply("q1"))
	close(hold)
	testutil.WaitFor(t, 10*time.Second, "all receipts", func() bool { return rs.len() == 3 })
	return rs
}
