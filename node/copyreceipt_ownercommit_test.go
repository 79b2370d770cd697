package node_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
)

// The owner's copy (seq <= w) whose watermark is already durable is
// answered at once (afterDurable) while the commit of the owner's
// previous message, still under way, ends: its DUPLICATE must carry the
// digest of the watermark it gives (as in
// TestEarlyCopyRacingACommitIsNeverADigestlessDuplicate). Owner receipts
// are told apart from the receiving goroutine's by Room and Arrived,
// which only the owner's receipts set.
func TestOwnersCopyRacingACommitIsNeverADigestlessDuplicate(t *testing.T) {
	ownersCopyRacingACommit(t)
}

// The same on a batch actor (node.WithBatch), whose copies decided
// outside a batch are answered the same way.
func TestBatchOwnersCopyRacingACommitIsNeverADigestlessDuplicate(t *testing.T) {
	ownersCopyRacingACommit(t, node.WithBatch(func(_ context.Context, msgs []*node.Message) (int, error) { return len(msgs), nil }, 0))
}

func ownersCopyRacingACommit(t *testing.T, opts ...node.SpawnOption) {
	dir := t.TempDir()
	n := newNode(t, "n1", dir, func(c *node.Config) {})
	var s sink
	if _, err := n.Spawn("sink", s.handler, opts...); err != nil {
		t.Fatal(err)
	}
	var rs receipts
	const e = 1
	for i := uint64(1); i <= 2; i++ {
		if c := rs.deliverWait(t, n, epochEnv(t, e, i, i-1, "a")).GetCode(); c != pb.Receipt_PROCESSED {
			t.Fatalf("a%d: %v", i, c)
		}
	}
	const top = 2000 // without the one-step read, it failed within 150-230 rounds
	ownerDups := 0
	var ownerBad atomic.Pointer[string]
	defer func() {
		if m := ownerBad.Load(); m != nil && !t.Failed() {
			t.Error(*m)
		}
	}()
	for i := uint64(3); i <= top; i++ {
		n.DeliverIncoming(peerP, epochEnv(t, e, i, i-1, "a"), rs.reply(fmt.Sprintf("a%d", i)))
		b := epochEnv(t, e, i-1, i-2, "b")
		b.MsgId = fmt.Sprintf("b%d", i-1)
		n.DeliverIncoming(peerP, b, rs.reply(b.MsgId))
		for k := 0; k < 8; k++ {
			c := epochEnv(t, e, i-1, i-2, "b")
			c.MsgId = fmt.Sprintf("c%d-%d", i-1, k)
			n.DeliverIncoming(peerP, c, func(rc *pb.Receipt) {
				if rc.GetCode() == pb.Receipt_DUPLICATE && rc.GetWatermarkDigest() == 0 && (rc.GetArrived() != 0 || rc.GetRoom() != 0) {
					msg := fmt.Sprintf("%s answered by the owner DUPLICATE watermark %d with no watermark digest (arrived %d)", c.GetMsgId(), rc.GetWatermark(), rc.GetArrived())
					ownerBad.CompareAndSwap(nil, &msg)
				}
			})
		}
		if i > 6 {
			id := fmt.Sprintf("b%d", i-5)
			testutil.WaitFor(t, 10*time.Second, "receipt of "+id, func() bool { return rs.code(id) != pb.Receipt_CODE_UNSPECIFIED })
			rs.mu.Lock()
			rc := rs.got[id]
			rs.mu.Unlock()
			if rc.GetCode() != pb.Receipt_DUPLICATE {
				t.Fatalf("%s: %v %q", id, rc.GetCode(), rc.GetMessage())
			}
			owner := rc.GetArrived() != 0 || rc.GetRoom() != 0
			if owner {
				ownerDups++
			}
			if m := ownerBad.Load(); m != nil {
				t.Fatal(*m)
			}
			if rc.GetWatermarkDigest() == 0 && owner {
				t.Fatalf("%s (new contents under sequence %d, never ran) answered DUPLICATE watermark %d with no watermark digest, by the owner: %v (arrived %d), stream never marked; after %d owner DUPLICATEs",
					id, i-5, rc.GetWatermark(), owner, rc.GetArrived(), ownerDups)
			}
		}
	}
	t.Logf("%d owner DUPLICATEs, none digestless", ownerDups)
}
