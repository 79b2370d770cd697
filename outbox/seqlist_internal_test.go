package outbox

import (
	"maps"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// A queue's order in memory agrees with a plain sorted set through any
// mix of appends, inserts below the last, removals at the front and in the
// middle; and marked entries never make up much more than half of it.
func TestSeqListAgreesWithASortedSet(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		var l seqList
		model := map[uint64]bool{}
		sorted := func() []uint64 { return slices.Sorted(maps.Keys(model)) }
		next := uint64(1)
		for range rapid.IntRange(1, 400).Draw(rt, "steps") {
			switch rapid.IntRange(0, 5).Draw(rt, "op") {
			case 0, 1: // append, across blocks
				n := rapid.IntRange(1, 2*seqBlock).Draw(rt, "n")
				for range n {
					l.add(next)
					model[next] = true
					next++
				}
			case 2: // a sequence below the last, or one already there
				sq := rapid.Uint64Range(1, next).Draw(rt, "below")
				l.add(sq)
				model[sq] = true
				if rapid.Bool().Draw(rt, "gap") {
					// Far above, or far below everything: blocks span at
					// most maxOff.
					next += rapid.Uint64Range(maxOff-8, 3*maxOff).Draw(rt, "jump")
					l.add(next)
					model[next] = true
					next++
				}
			case 3: // drain from the front
				s := sorted()
				n := rapid.IntRange(0, len(s)).Draw(rt, "drain")
				for _, sq := range s[:n] {
					l.remove(sq)
					delete(model, sq)
				}
			case 4: // anywhere, present or not
				sq := rapid.Uint64Range(0, next+1).Draw(rt, "remove")
				l.remove(sq)
				delete(model, sq)
			case 5: // many in the middle
				s := sorted()
				for i, sq := range s {
					if i%3 != 0 {
						l.remove(sq)
						delete(model, sq)
					}
				}
			}
			want := sorted()
			l.agrees(rt, want)
			l.agreesAfter(rt, want, rapid.Uint64Range(0, next).Draw(rt, "after"), rapid.IntRange(0, 20).Draw(rt, "count"))
			l.agreesCountIn(rt, model, rapid.SliceOfNDistinct(rapid.Uint64Range(0, next+1), 0, 40, rapid.ID).Draw(rt, "seqs"))
		}
	})
}

// agrees checks l against want, the sorted set it should hold: its order,
// len, first, the share of marked entries and its structure.
func (l *seqList) agrees(rt *rapid.T, want []uint64) {
	var got []uint64
	l.each(func(sq uint64) bool { got = append(got, sq); return true })
	if !slices.Equal(got, want) || l.len() != len(want) {
		rt.Fatalf("order %v (len %d), want %v", got, l.len(), want)
	}
	if f, ok := l.first(); ok != (len(want) > 0) || (ok && f != want[0]) {
		rt.Fatalf("first %d %v, want %v", f, ok, want)
	}
	if l.gone > 33 && 2*l.gone > l.n+1 {
		rt.Fatalf("%d of %d entries marked", l.gone, l.n)
	}
	l.check(rt)
}

// agreesAfter checks l.after(after, n) against want.
func (l *seqList) agreesAfter(rt *rapid.T, want []uint64, after uint64, n int) {
	var wantAfter []uint64
	for _, sq := range want {
		if sq > after && len(wantAfter) < n {
			wantAfter = append(wantAfter, sq)
		}
	}
	if got := l.after(nil, after, n); !slices.Equal(got, wantAfter) {
		rt.Fatalf("after(%d, %d) = %v, want %v", after, n, got, wantAfter)
	}
}

// agreesCountIn checks l.countIn(seqs) against model.
func (l *seqList) agreesCountIn(rt *rapid.T, model map[uint64]bool, seqs []uint64) {
	slices.Sort(seqs)
	if len(seqs) > 1 && rapid.Bool().Draw(rt, "run") {
		// A run of neighbours, as a stream's acks are.
		for i := range seqs {
			seqs[i] = seqs[0] + uint64(i)
		}
	}
	want := 0
	for _, sq := range seqs {
		if model[sq] {
			want++
		}
	}
	if len(seqs) > 0 && rapid.Bool().Draw(rt, "repeat") {
		// One repeated counts once.
		i := rapid.IntRange(0, len(seqs)-1).Draw(rt, "repeated")
		seqs = slices.Insert(seqs, i, seqs[i])
	}
	if got := l.countIn(seqs); got != want {
		rt.Fatalf("countIn(%v) = %d, want %d", seqs, got, want)
	}
}

// check verifies the list's structure: blocks not empty nor over seqBlock,
// entries ascending across blocks, the counts right, the front live.
func (l *seqList) check(rt *rapid.T) {
	n, gone := 0, 0
	var prev uint64
	for i := range l.blocks {
		b := &l.blocks[i]
		if len(b.off) == 0 || len(b.off) > seqBlock {
			rt.Fatalf("block %d holds %d entries", i, len(b.off))
		}
		for j := range b.off {
			if n > 0 && b.seq(j) <= prev {
				rt.Fatalf("entry %d after %d", b.seq(j), prev)
			}
			prev = b.seq(j)
			n++
			if b.marked(j) {
				gone++
			}
		}
	}
	if n != l.n || gone != l.gone {
		rt.Fatalf("counts %d/%d, entries %d/%d", l.n, l.gone, n, gone)
	}
	if len(l.blocks) > 0 && l.blocks[0].marked(0) {
		rt.Fatal("the front is marked")
	}
}

// capacity returns the entries the list's blocks have room for.
func (l *seqList) capacity() int {
	c := 0
	for _, b := range l.blocks {
		c += cap(b.off)
	}
	return c
}
