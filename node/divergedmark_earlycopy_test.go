package node_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
)

// A copy decided on the receiving goroutine (early: below the durable
// watermark) while the owner marks the stream divergent must not go out
// DUPLICATE with the watermark and no digest (the mark took the digest's
// place): beside the mark's CAPACITY while the disk refuses it, a restored
// sender would take its new message under that sequence for a copy and
// ack it. Whether the stream is marked and the digest are read in one
// step: a copy answered before the mark carries the digest, one after it
// is answered as a marked stream's message.
//
// Each round is a new stream (epoch): a1, a2 run (durable 2, digest of
// a2); goroutines hand the receiver b1 (new contents under sequence 1, as
// a restored sender's emission sent again carries it) over and over while
// x2 (other contents at the watermark's sequence) reaches the owner,
// which marks the stream.
func TestEarlyCopyRacingAMarkOfDivergenceIsNeverADigestlessDuplicate(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "outbox.db")
	n := newNode(t, "n1", dir, func(c *node.Config) {})
	var s sink
	if _, err := n.Spawn("sink", s.handler); err != nil {
		t.Fatal(err)
	}
	const rounds = 100 // without the one-step read, 2 to 13 rounds found it
	var bad atomic.Pointer[string]
	var outstanding sync.WaitGroup
	for e := uint64(1); e <= rounds && bad.Load() == nil; e++ {
		var rs receipts
		for i := uint64(1); i <= 2; i++ {
			if c := rs.deliverWait(t, n, epochEnv(t, e, i, i-1, "a")).GetCode(); c != pb.Receipt_PROCESSED {
				t.Fatalf("epoch %d a%d: %v", e, i, c)
			}
		}
		var marked atomic.Bool
		var wg sync.WaitGroup
		var copies atomic.Int64
		for g := 0; g < 2; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := 0; !marked.Load() && k < 200000; k++ {
					b := epochEnv(t, e, 1, 0, "b")
					b.MsgId = fmt.Sprintf("b-%d-%d-%d", e, g, k)
					outstanding.Add(1)
					copies.Add(1)
					n.DeliverIncoming(peerP, b, func(rc *pb.Receipt) {
						defer outstanding.Done()
						switch rc.GetCode() {
						case pb.Receipt_DUPLICATE:
							if rc.GetWatermarkDigest() == 0 {
								msg := fmt.Sprintf("epoch %d: copy %s of b1 (never ran) answered DUPLICATE watermark %d with no watermark digest", e, b.GetMsgId(), rc.GetWatermark())
								bad.CompareAndSwap(nil, &msg)
							}
						default:
							marked.Store(true)
						}
					})
				}
			}()
		}
		testutil.WaitFor(t, 5*time.Second, "copies under way", func() bool { return copies.Load() > 20 })
		// The disk refuses the mark's commit: x2 is answered CAPACITY
		// (mark of divergence not durable), no DIVERGED beside the copy.
		restore, _ := faults.FailCommits(path, errors.New("write outbox.db: no space left on device"))
		n.DeliverIncoming(peerP, epochEnv(t, e, 2, 1, "x"), rs.reply("x"))
		testutil.WaitFor(t, 10*time.Second, "x's receipt", func() bool { return rs.code("x") != pb.Receipt_CODE_UNSPECIFIED })
		marked.Store(true)
		wg.Wait()
		restore()
		if m := bad.Load(); m != nil {
			rs.mu.Lock()
			rx := rs.got["x"]
			rs.mu.Unlock()
			t.Fatalf("%s; x2 (other contents at the watermark) answered %v %q: an emission [b1, x2] answered so gives nothing away, and its sender acks b1, which never ran (sink ran b? %v)",
				*m, rx.GetCode(), rx.GetMessage(), slices.Contains(s.values(), "b"))
		}
	}
	waitAll(t, &outstanding, 20*time.Second, "every copy answered")
	if m := bad.Load(); m != nil {
		t.Fatal(*m)
	}
}

// waitAll waits up to d for wg's count to reach zero (every receipt it
// counts has come), and fails t with what if it does not.
func waitAll(t *testing.T, wg *sync.WaitGroup, d time.Duration, what string) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	testutil.WaitFor(t, d, what, func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	})
}
