package outbox

import (
	"context"
	"maps"
	"math"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/meshnode/meshnode/mailbox/pb"
)

// Ascending inserts between two blocks that are more than maxOff apart
// share blocks (each one used to become a block of its own, with room for
// up to seqBlock entries).
func TestInsertsBetweenFarBlocksShareABlock(t *testing.T) {
	var l seqList
	l.add(1)
	l.add(1 << 40)
	for sq := uint64(2); sq <= 1001; sq++ {
		l.add(sq)
	}
	if l.len() != 1002 {
		t.Fatalf("len %d", l.len())
	}
	if nb := len(l.blocks); nb > 4 {
		t.Fatalf("1002 sequences, 1001 of them consecutive, in %d blocks (capacity %d entries)", nb, l.capacity())
	}
}

// A sparse queue (sequences more than maxOff apart, one block each) of a
// few thousand messages keeps each block small (each used to get room for
// seqBlock entries once the list held that many).
func TestSparseQueueBlocksStaySmall(t *testing.T) {
	var l seqList
	const n = 2000
	for i := uint64(1); i <= n; i++ {
		l.add(i << 32)
	}
	if c := l.capacity(); c > 8*n {
		t.Fatalf("%d live entries, capacity for %d (%d bytes of offsets)", l.len(), c, 4*c)
	}
}

// The model test with sequences anywhere in uint64: near 0, near
// MaxUint64, top bit set, spans across maxOff.
func TestSeqListAgreesWithASortedSetAcrossTheRange(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		var l seqList
		model := map[uint64]bool{}
		sorted := func() []uint64 { return slices.Sorted(maps.Keys(model)) }
		anchors := []uint64{1, maxOff, markBit, markBit + 1, 1 << 32, 1 << 63, math.MaxUint64 - maxOff, math.MaxUint64 - 600, math.MaxUint64}
		gen := func(label string) uint64 {
			a := rapid.SampledFrom(anchors).Draw(rt, label+"a")
			d := rapid.Uint64Range(0, 1100).Draw(rt, label+"d")
			var sq uint64
			if rapid.Bool().Draw(rt, label+"s") {
				sq = a + d
				if sq < a {
					sq = math.MaxUint64
				}
			} else {
				sq = a - d
				if sq > a {
					sq = 1
				}
			}
			if sq == 0 {
				sq = 1
			}
			return sq
		}
		for range rapid.IntRange(1, 300).Draw(rt, "steps") {
			switch rapid.IntRange(0, 5).Draw(rt, "op") {
			case 0, 1:
				sq := gen("add")
				n := rapid.IntRange(1, 700).Draw(rt, "n")
				up := rapid.Bool().Draw(rt, "up")
				for range n {
					l.add(sq)
					model[sq] = true
					if up {
						if sq == math.MaxUint64 {
							break
						}
						sq++
					} else {
						if sq == 1 {
							break
						}
						sq--
					}
				}
			case 2:
				sq := gen("rm")
				l.remove(sq)
				delete(model, sq)
			case 3:
				s := sorted()
				n := rapid.IntRange(0, len(s)).Draw(rt, "drain")
				for _, sq := range s[:n] {
					l.remove(sq)
					delete(model, sq)
				}
			case 4:
				s := sorted()
				k := rapid.IntRange(2, 5).Draw(rt, "k")
				for i, sq := range s {
					if i%k != 0 {
						l.remove(sq)
						delete(model, sq)
					}
				}
			case 5:
				s := sorted()
				if len(s) > 0 {
					lo := rapid.IntRange(0, len(s)-1).Draw(rt, "lo")
					hi := rapid.IntRange(lo, len(s)).Draw(rt, "hi")
					for _, sq := range s[lo:hi] {
						l.remove(sq)
						delete(model, sq)
					}
				}
			}
			want := sorted()
			l.agrees(rt, want)
			after := gen("after")
			if rapid.Bool().Draw(rt, "after0") {
				after = 0
			}
			l.agreesAfter(rt, want, after, rapid.IntRange(0, 1200).Draw(rt, "count"))
		}
	})
}

// Through the outbox: a queue with one message far above the rest, then
// messages enqueued in between in ascending order, keeps few blocks (it
// used to cost a block, with room for up to seqBlock entries, per message).
func TestQueueWithAFarSequenceKeepsFewBlocks(t *testing.T) {
	s, err := Open(batchConfig(t.TempDir()+"/outbox.db", NewManualClock(batchEpoch), nil))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	put := func(seq uint64) {
		t.Helper()
		if _, err := s.Enqueue(context.Background(), &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "a@n1", Sender: "app@n0", Type: "t", Sequence: seq}}); err != nil {
			t.Fatal(err)
		}
	}
	put(1)
	put(1 << 40)
	msgs := make([]*pb.StoredMessage, 0, 1000)
	for sq := uint64(2); sq <= 1001; sq++ {
		msgs = append(msgs, &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "a@n1", Sender: "app@n0", Type: "t", Sequence: sq}})
	}
	for i := 0; i < len(msgs); i += 100 {
		_, errs := s.EnqueueBatch(context.Background(), msgs[i:i+100])
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	s.mu.RLock()
	l := &s.queues["a@n1"].seqs
	nb, c, n := len(l.blocks), l.capacity(), l.len()
	s.mu.RUnlock()
	if nb > 4 {
		t.Fatalf("%d messages in %d blocks, room for %d entries", n, nb, c)
	}
}
