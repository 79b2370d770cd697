package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

// Many callers with mixed ops (coalescing enqueues, acks,
// failures to the DLQ, expiries, drops, replays, purges, stream commits);
// the Nth meta page write fails. Memory (Stats, Pending) must agree with
// what a reopen reads, and the reopened queues must be in order, once.
func TestSyncFailureAmidMixedOpsLeavesMemoryAsTheFile(t *testing.T) {
	for trial := range 12 {
		t.Run(fmt.Sprint(trial), func(t *testing.T) { mixTrial(t, uint64(trial)) })
	}
}

func mixTrial(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 61))
	e := open(t, func(c *outbox.Config) { c.MaxBatch = 8; c.MaxAttempts = 2; c.SequenceBlock = 4 })
	rcpts := []string{"a@n1", "b@n1", "c@n2"}
	for _, r := range rcpts {
		e.send(t, r, "base0", "base1", "base2")
	}
	syncErr := errors.New("fdatasync outbox.db: input/output error")
	var metas atomic.Int64
	failAt := int64(3 + rng.IntN(25))
	defer faults.FailWrites(e.path, syncErr, func(meta bool) bool {
		return meta && metas.Add(1) == failAt
	})()
	e.reopen(t, nil)

	var wg sync.WaitGroup
	for g := range 6 {
		r := rcpts[g%len(rcpts)]
		grng := rand.New(rand.NewPCG(seed, uint64(g)))
		wg.Go(func() {
			var mine []uint64
			for i := range 20 {
				if e.Err() != nil && i > 2 {
					return
				}
				switch grng.IntN(9) {
				case 0, 1:
					seq, err := e.ReserveSequence()
					if err != nil {
						continue
					}
					env := &pb.Envelope{Recipient: r, Sender: "app@n0", Type: fmt.Sprint("g", g, "-", i), Sequence: seq}
					if grng.IntN(2) == 0 {
						env.Conflict, env.CoalesceKey = pb.Envelope_OVERWRITE, fmt.Sprint("k", grng.IntN(2))
					}
					if _, err := e.Enqueue(context.Background(), &pb.StoredMessage{Envelope: env}); err == nil {
						mine = append(mine, seq)
					}
				case 2:
					if len(mine) > 0 {
						_ = e.Ack(r, mine[:1])
						mine = mine[1:]
					}
				case 3:
					if h, _, err := e.Head(outbox.HeadRequest{Recipient: r, Max: 2}); err == nil && len(h) > 0 {
						_, _, _ = e.Fail(r, h[0].GetEnvelope().GetSequence(), outbox.Failure{Reason: "x", Counts: true})
					}
				case 4:
					if h, _, err := e.Head(outbox.HeadRequest{Recipient: r, Max: 1}); err == nil && len(h) > 0 {
						_, _ = e.Expire(r, []uint64{h[0].GetEnvelope().GetSequence()}, outbox.ReasonExpired)
					}
				case 5:
					if grng.IntN(4) == 0 {
						_, _ = e.DropQueue(r, "test")
					}
				case 6:
					_, _ = e.Replay(outbox.DLQFilter{Recipient: r, Limit: 3})
				case 7:
					if grng.IntN(3) == 0 {
						_, _ = e.Purge(outbox.DLQFilter{Recipient: r, Limit: 1})
					}
				case 8:
					done := make(chan struct{})
					e.CommitStream(&outbox.StreamCommit{Stream: outbox.StreamKey("n9", [16]byte{}, 1, r), Watermark: uint64(i + 1),
						Keys: [][]byte{outbox.ScopedKey("n9", r, fmt.Sprint("key", g, i))}}, func(error) { close(done) })
					<-done
				}
			}
		})
	}
	wg.Wait()
	if e.Err() == nil {
		t.Skipf("meta write %d never came (%d meta writes)", failAt, metas.Load())
	}
	before := e.Stats()
	pend := map[string]int{}
	for _, r := range rcpts {
		pend[r] = e.Pending(r)
	}
	metas.Store(-1 << 40) // no more failures
	e.reopen(t, nil)
	after := e.Stats()
	for _, r := range rcpts {
		seqs := e.seqs(t, r)
		if !slices.IsSorted(seqs) || len(slices.Compact(slices.Clone(seqs))) != len(seqs) {
			t.Errorf("%s: queue after reopen not in order/once: %v", r, seqs)
		}
		if len(seqs) != pend[r] {
			t.Errorf("%s: Pending at the failure %d, file holds %d", r, pend[r], len(seqs))
		}
	}
	if before.Depth != after.Depth || before.DLQDepth != after.DLQDepth || !maps.Equal(before.DepthByPeer, after.DepthByPeer) {
		t.Errorf("memory at the failure: depth %d DLQ %d by peer %v; the file: depth %d DLQ %d by peer %v",
			before.Depth, before.DLQDepth, before.DepthByPeer, after.Depth, after.DLQDepth, after.DepthByPeer)
	}
}
