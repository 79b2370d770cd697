package node_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
)

// A copy decided on the receiving goroutine (early, below the durable
// watermark) while the stream's commits end one after another must carry
// the digest of the watermark it gives. Read apart from the watermark,
// the digest was lost when a commit ended in between (the watermark read
// was then neither the stream's nor its durable one): a DUPLICATE with a
// watermark and no digest tells a restored sender nothing, and one whose
// emission held only a new message under that sequence acked it. Every
// watermark here has a known digest and the stream is never marked.
func TestEarlyCopyRacingACommitIsNeverADigestlessDuplicate(t *testing.T) {
	dir := t.TempDir()
	n := newNode(t, "n1", dir, func(c *node.Config) {})
	var s sink
	if _, err := n.Spawn("sink", s.handler); err != nil {
		t.Fatal(err)
	}
	var rs receipts
	const e = 1
	for i := uint64(1); i <= 2; i++ {
		if c := rs.deliverWait(t, n, epochEnv(t, e, i, i-1, "a")).GetCode(); c != pb.Receipt_PROCESSED {
			t.Fatalf("a%d: %v", i, c)
		}
	}
	var bad atomic.Pointer[string]
	var stop atomic.Bool
	var outstanding sync.WaitGroup
	var wg sync.WaitGroup
	var dups, answered atomic.Int64
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; !stop.Load(); k++ {
				b := epochEnv(t, e, 1, 0, "b")
				b.MsgId = fmt.Sprintf("b-%d-%d", g, k)
				outstanding.Add(1)
				n.DeliverIncoming(peerP, b, func(rc *pb.Receipt) {
					defer outstanding.Done()
					answered.Add(1)
					if rc.GetCode() == pb.Receipt_DUPLICATE {
						dups.Add(1)
						if rc.GetWatermarkDigest() == 0 {
							msg := fmt.Sprintf("copy %s of b1 (new contents under sequence 1, never ran) answered DUPLICATE watermark %d with no watermark digest (stream never marked)", b.GetMsgId(), rc.GetWatermark())
							bad.CompareAndSwap(nil, &msg)
						}
					}
				})
			}
		}()
	}
	const top = 400 // without the one-step read, it failed within the first rounds
	for i := uint64(3); i <= top && bad.Load() == nil; i++ {
		if c := rs.deliverWait(t, n, epochEnv(t, e, i, i-1, "a")).GetCode(); c != pb.Receipt_PROCESSED {
			stop.Store(true)
			wg.Wait()
			t.Fatalf("a%d: %v", i, c)
		}
	}
	stop.Store(true)
	wg.Wait()
	waitAll(t, &outstanding, 20*time.Second, "every copy answered")
	t.Logf("%d copies answered, %d DUPLICATE", answered.Load(), dups.Load())
	if m := bad.Load(); m != nil {
		t.Fatal(*m)
	}
}
