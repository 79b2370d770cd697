package node_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
)

// The owner's path: a copy's DUPLICATE, made by a commit callback (the
// committer's goroutine) while the owner marks the stream on the next
// message, must not go out with the watermark and no digest (as in
// TestEarlyCopyRacingAMarkOfDivergenceIsNeverADigestlessDuplicate).
//
// Each round is a new stream (epoch): a1 runs and is durable; a2, a3 run
// (a2's commit under way, a3's waits for the next); b2 (new contents under
// sequence 2) is decided a copy by the owner and waits for that next
// commit, behind a3's PROCESSED; a tell holds the owner; x3 (other
// contents at the watermark's sequence) waits behind it. a3's receipt,
// made on the committer just before b2's, lets the owner go on to x3 (it
// marks the stream) and waits a few microseconds, so that b2's receipt is
// made while the owner marks.
func TestOwnersCopyReceiptRacingAMarkOfDivergenceIsNeverADigestlessDuplicate(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "outbox.db")
	n := newNode(t, "n1", dir, func(c *node.Config) {})
	var gmu sync.Mutex
	gates := map[string]chan struct{}{}
	gate := func(v string) chan struct{} {
		gmu.Lock()
		defer gmu.Unlock()
		if gates[v] == nil {
			gates[v] = make(chan struct{})
		}
		return gates[v]
	}
	var ranMu sync.Mutex
	var ran []string
	h := func(ctx context.Context, m *node.Message) (proto.Message, error) {
		var v wrapperspb.StringValue
		if err := m.Decode(&v); err != nil {
			return nil, err
		}
		if len(v.GetValue()) > 5 && v.GetValue()[:5] == "gate-" {
			select {
			case <-gate(v.GetValue()):
			case <-ctx.Done():
			}
			return nil, nil
		}
		ranMu.Lock()
		ran = append(ran, v.GetValue())
		ranMu.Unlock()
		return nil, nil
	}
	if _, err := n.Spawn("sink", h); err != nil {
		t.Fatal(err)
	}
	const rounds = 300 // without the one-step read, 12 to 126 rounds found it
	hitsAt3 := 0
	for e := uint64(1); e <= rounds; e++ {
		var rs receipts
		if c := rs.deliverWait(t, n, epochEnv(t, e, 1, 0, "a")).GetCode(); c != pb.Receipt_PROCESSED {
			t.Fatalf("epoch %d a1: %v", e, c)
		}
		g := gate(fmt.Sprintf("gate-%d", e))
		spin := time.Duration(25+rand.IntN(35)) * time.Microsecond
		var restore func()
		n.DeliverIncoming(peerP, epochEnv(t, e, 2, 1, "a"), rs.reply("a2"))
		n.DeliverIncoming(peerP, epochEnv(t, e, 3, 2, "a"), func(rc *pb.Receipt) {
			// On the committer, just before b2's receipt is made.
			rs.reply("a3")(rc)
			// From here on the disk refuses: the mark's commit fails,
			// and x3 is answered CAPACITY, no DIVERGED.
			restore, _ = faults.FailCommits(path, errors.New("write outbox.db: no space left on device"))
			close(g)
			for end := time.Now().Add(spin); time.Now().Before(end); {
			}
		})
		n.DeliverIncoming(peerP, epochEnv(t, e, 2, 0, "b"), rs.reply("b2"))
		if err := n.Tell(context.Background(), node.Addr("sink", "n1"), wrapperspb.String(fmt.Sprintf("gate-%d", e))); err != nil {
			t.Fatal(err)
		}
		n.DeliverIncoming(peerP, epochEnv(t, e, 3, 2, "x"), rs.reply("x3"))
		testutil.WaitFor(t, 10*time.Second, "receipts of the round", func() bool { return rs.len() == 5 })
		restore()
		rs.mu.Lock()
		rb, rx, ra3 := rs.got["b2"], rs.got["x3"], rs.got["a3"]
		rs.mu.Unlock()
		if ra3.GetCode() != pb.Receipt_PROCESSED {
			t.Fatalf("epoch %d: a3 %v", e, ra3.GetCode())
		}
		if rb.GetWatermark() == 3 {
			hitsAt3++
		}
		if rb.GetCode() == pb.Receipt_DUPLICATE && rb.GetWatermarkDigest() == 0 {
			t.Fatalf("epoch %d (spin %v): b2, which never ran (new contents under sequence 2), answered DUPLICATE watermark %d with no watermark digest, while the owner marked the stream on x3, answered %v %q: an emission [b2, x3] answered so gives nothing away and its restored sender acks b2, which never ran (b2 ran: %v)",
				e, spin, rb.GetWatermark(), rx.GetCode(), rx.GetMessage(), slices.Contains(ran, "b"))
		}
	}
	t.Logf("b2 answered by the commit of 3 in %d of %d rounds", hitsAt3, rounds)
}
