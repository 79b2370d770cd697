package outbox

import (
	"cmp"
	"math"
	"slices"

	bolt "go.etcd.io/bbolt"
)

// seqList is one queue's order: the sequences of its records, ascending.
// The records of every queue share one bucket keyed by the outbox-wide
// sequence, so that a commit appending to many queues writes the same few
// pages at the end of that bucket as a commit appending to one; each
// queue's order lives here, in memory, rebuilt at Open by one scan of the
// bucket.
//
// It is kept in blocks of at most seqBlock entries, each a base sequence
// and 4-byte offsets from it: about 4 bytes a queued message, a queue of
// millions grows without copying itself whole, and an insertion below the
// last entry moves at most a block. Removing marks an entry (markBit) and
// drops marked entries from the front, where a drain removes them; marked
// entries elsewhere (a replaced version, a message given up) are
// compacted away once they are half of the list.
type seqList struct {
	blocks []seqRun // ascending, none empty; the first entry of the first is never marked
	n      int      // entries, marked or not
	gone   int      // marked entries
}

// seqRun is one block: base + offsets, ascending.
type seqRun struct {
	base uint64
	off  []uint32
}

const (
	seqBlock = 512
	markBit  = 1 << 31
	maxOff   = markBit - 1
)

func (b *seqRun) seq(i int) uint64       { return b.base + uint64(b.off[i]&^markBit) }
func (b *seqRun) marked(i int) bool      { return b.off[i]&markBit != 0 }
func (b *seqRun) last() uint64           { return b.seq(len(b.off) - 1) }
func (b *seqRun) offCmp(o, t uint32) int { return cmp.Compare(o&^markBit, t) }

// find returns where seq is, or would go, in b, and whether it is there.
func (b *seqRun) find(seq uint64) (int, bool) {
	switch {
	case seq < b.base:
		return 0, false
	case seq-b.base > maxOff:
		return len(b.off), false
	}
	return slices.BinarySearchFunc(b.off, uint32(seq-b.base), b.offCmp)
}

// len returns the number of live entries.
func (l *seqList) len() int { return l.n - l.gone }

// first returns the lowest live sequence.
func (l *seqList) first() (uint64, bool) {
	if len(l.blocks) == 0 {
		return 0, false
	}
	return l.blocks[0].seq(0), true
}

// block returns the index of the first block whose last entry is at or
// above seq (len(blocks) when none is).
func (l *seqList) block(seq uint64) int {
	i, _ := slices.BinarySearchFunc(l.blocks, seq, func(b seqRun, t uint64) int {
		return cmp.Compare(b.last(), t)
	})
	return i
}

// newRun starts a block at seq. It grows by appending, as a small queue
// does: a queue whose neighbouring sequences are too far apart for one
// block has a block per message, and each stays small.
func newRun(seq uint64) seqRun {
	return seqRun{base: seq, off: make([]uint32, 1, 4)}
}

// add inserts seq (a no-op when it is there).
func (l *seqList) add(seq uint64) {
	nb := len(l.blocks)
	if nb == 0 || l.blocks[nb-1].last() < seq {
		// Appended: most adds.
		if nb == 0 || len(l.blocks[nb-1].off) >= seqBlock || seq-l.blocks[nb-1].base > maxOff {
			l.blocks = append(l.blocks, newRun(seq))
		} else {
			b := &l.blocks[nb-1]
			b.off = append(b.off, uint32(seq-b.base))
		}
		l.n++
		return
	}
	bi := l.block(seq)
	b := &l.blocks[bi]
	if seq < b.base {
		if b.last()-seq > maxOff {
			// Too far below this block for its offsets: after the block
			// before it (above whose last entry it is), if that has room
			// and reach, else a block of its own there.
			if bi > 0 {
				if p := &l.blocks[bi-1]; len(p.off) < seqBlock && seq-p.base <= maxOff {
					p.off = append(p.off, uint32(seq-p.base))
					l.n++
					return
				}
			}
			l.blocks = slices.Insert(l.blocks, bi, newRun(seq))
			l.n++
			return
		}
		// Rebase the block on seq.
		d := uint32(b.base - seq)
		for i := range b.off {
			b.off[i] += d // below markBit: last - seq <= maxOff
		}
		b.base = seq
		b.off = slices.Insert(b.off, 0, 0)
	} else {
		i, found := b.find(seq)
		if found {
			if b.marked(i) {
				b.off[i] &^= markBit
				l.gone--
			}
			return
		}
		b.off = slices.Insert(b.off, i, uint32(seq-b.base))
	}
	l.n++
	if len(b.off) <= seqBlock {
		return
	}
	half := len(b.off) / 2
	second := seqRun{base: b.seq(half), off: make([]uint32, len(b.off)-half)}
	d := uint32(second.base - b.base)
	for i, o := range b.off[half:] {
		second.off[i] = o - d // keeps the mark: o's offset is at least d
	}
	b.off = slices.Clip(b.off[:half])
	l.blocks = slices.Insert(l.blocks, bi+1, second)
}

// remove takes seq out (a no-op when it is not there).
func (l *seqList) remove(seq uint64) {
	bi := l.block(seq)
	if bi == len(l.blocks) {
		return
	}
	b := &l.blocks[bi]
	i, found := b.find(seq)
	if !found || b.marked(i) {
		return
	}
	b.off[i] |= markBit
	l.gone++
	// Drop marked entries from the front, and the blocks they empty.
	for len(l.blocks) > 0 && l.blocks[0].marked(0) {
		f := &l.blocks[0]
		j := 0
		for j < len(f.off) && f.marked(j) {
			j++
		}
		l.n, l.gone = l.n-j, l.gone-j
		if j == len(f.off) {
			l.blocks[0] = seqRun{}
			l.blocks = l.blocks[1:]
		} else {
			f.off = f.off[j:]
		}
	}
	if l.gone > 32 && 2*l.gone > l.n {
		l.compact()
	}
}

// compact rewrites the list without its marked entries.
func (l *seqList) compact() {
	var live seqList
	l.each(func(sq uint64) bool {
		live.add(sq)
		return true
	})
	*l = live
}

// after appends to dst up to n live sequences above after, in order.
func (l *seqList) after(dst []uint64, after uint64, n int) []uint64 {
	for bi := l.block(after); bi < len(l.blocks) && n > 0; bi++ {
		b := &l.blocks[bi]
		i, found := b.find(after)
		if found {
			i++
		}
		for ; i < len(b.off) && n > 0; i++ {
			if !b.marked(i) {
				dst = append(dst, b.seq(i))
				n--
			}
		}
	}
	return dst
}

// countIn returns how many of seqs (ascending; one repeated counts once)
// are live in l. A run of neighbouring sequences, as a stream's acks are,
// costs a step each.
func (l *seqList) countIn(seqs []uint64) int {
	n := 0
	var prev uint64
	for len(seqs) > 0 {
		bi := l.block(seqs[0])
		if bi == len(l.blocks) {
			break
		}
		b := &l.blocks[bi]
		i := 0
		for len(seqs) > 0 && seqs[0] <= b.last() {
			sq := seqs[0]
			seqs = seqs[1:]
			if n > 0 && sq == prev {
				continue // looked at already
			}
			prev = sq
			if i >= len(b.off) || b.seq(i) != sq {
				var found bool
				if i, found = b.find(sq); !found {
					continue
				}
			}
			if !b.marked(i) {
				n++
			}
			i++
		}
	}
	return n
}

// each calls f with every live sequence in order until f returns false.
func (l *seqList) each(f func(uint64) bool) {
	for bi := range l.blocks {
		b := &l.blocks[bi]
		for i := range b.off {
			if !b.marked(i) && !f(b.seq(i)) {
				return
			}
		}
	}
}

// apply makes the changes of a committed batch, in the order it made them.
func (l *seqList) apply(ev []seqEvent) {
	for _, e := range ev {
		if e.gone {
			l.remove(e.seq)
		} else {
			l.add(e.seq)
		}
	}
}

// liveSeqs appends to dst up to limit of the first sequences of r's queue
// as the committed order and the batch so far (d, which may be nil) leave
// it. Committer only: it reads the order without mu, which only the
// committer changes.
func (s *Store) liveSeqs(dst []uint64, r string, d *qdelta, limit int) []uint64 {
	var ev []seqEvent
	if d != nil {
		ev = d.ev
	}
	removes := slices.ContainsFunc(ev, func(e seqEvent) bool { return e.gone })
	st := s.queues[r]
	if limit == 1 && !removes {
		// The head after appends alone (most commits): no copies.
		head, ok := uint64(0), false
		if st != nil {
			head, ok = st.seqs.first()
		}
		for _, e := range ev {
			if !ok || e.seq < head {
				head, ok = e.seq, true
			}
		}
		if ok {
			dst = append(dst, head)
		}
		return dst
	}
	var final map[uint64]bool // sequence -> removed: the batch's last word on it
	var added []uint64
	if removes {
		final = make(map[uint64]bool, len(d.ev))
		for _, e := range d.ev {
			final[e.seq] = e.gone
		}
		for sq, gone := range final {
			if !gone {
				added = append(added, sq)
			}
		}
	} else {
		for _, e := range ev {
			added = append(added, e.seq)
		}
	}
	slices.Sort(added)
	i := 0 // into added
	if st != nil {
		st.seqs.each(func(sq uint64) bool {
			if final[sq] {
				return true // removed by the batch
			}
			for ; i < len(added) && added[i] <= sq && len(dst) < limit; i++ {
				if added[i] < sq {
					dst = append(dst, added[i])
				}
			}
			if len(dst) < limit {
				dst = append(dst, sq)
			}
			return len(dst) < limit
		})
	}
	for ; i < len(added) && len(dst) < limit; i++ {
		dst = append(dst, added[i])
	}
	return dst
}

// queuedAfter returns how many messages r's queue holds as the committed
// state and the batch so far leave it. Committer only.
func (s *Store) queuedAfter(r string, b *batch) int {
	n := 0
	if st := s.queues[r]; st != nil {
		n = st.count()
	}
	if d := b.q[r]; d != nil {
		n += d.count
	}
	return n
}

// Head reads records from a bbolt snapshot and each queue's order from
// memory, which the committer changes only after bbolt returns from the
// commit, while readers see a commit as soon as bbolt has written its meta
// page. So a snapshot may be one commit ahead of the order, or, when
// commits were applied after it began, behind it. Either way the two agree
// on a queue below the lowest sequence the commits between them added to
// it: what they removed is missing from one of the two and skipped, and
// what they appended above the queue's end changes no earlier part. Head
// reads no further than that bound (orderChunk).

// pendingCommit is the committer's one commit between bbolt's writing it
// and its effects in memory. Guarded by omu.
type pendingCommit struct {
	tx      uint64
	adds    map[string]uint64 // recipient -> the lowest sequence the commit adds to its queue
	applied chan struct{}     // closed once its effects are in memory, or it failed
}

// addMark is a commit that added to a queue, and the lowest sequence it
// added.
type addMark struct{ tx, min uint64 }

// addHistory is how many of its last adding commits a queue remembers.
const addHistory = 8

// noteAdds remembers the commit tx's adds to q, if it made any. Caller holds
// omu.
func (q *queue) noteAdds(tx uint64, adds map[string]uint64) {
	m, ok := adds[q.name]
	if !ok {
		return
	}
	q.adds[q.nAdds%addHistory] = addMark{tx, m}
	q.nAdds++
}

// addedSince returns the lowest sequence added to q by commits after tx,
// and false when q no longer remembers them all. Caller holds omu.
func (q *queue) addedSince(tx uint64) (uint64, bool) {
	low := uint64(math.MaxUint64)
	n := min(q.nAdds, addHistory)
	for i := range n {
		m := q.adds[i]
		if m.tx > tx {
			low = min(low, m.min)
		}
	}
	if q.nAdds > addHistory {
		oldest := q.adds[q.nAdds%addHistory] // the next to be overwritten
		if oldest.tx > tx {
			return 0, false
		}
	}
	return low, true
}

// publish makes b the pending commit: called in its transaction, before
// bbolt writes it.
func (s *Store) publish(b *batch) {
	p := &pendingCommit{tx: b.tx, applied: make(chan struct{})}
	for r, d := range b.q {
		low := uint64(math.MaxUint64)
		for _, e := range d.ev {
			if !e.gone {
				low = min(low, e.seq)
			}
		}
		if low != math.MaxUint64 {
			if p.adds == nil {
				p.adds = make(map[string]uint64)
			}
			p.adds[r] = low
		}
	}
	s.omu.Lock()
	s.pending = p
	s.omu.Unlock()
}

// fileTx returns the transaction readers of the file see.
func (s *Store) fileTx() uint64 {
	var cur uint64
	_ = s.db.View(func(tx *bolt.Tx) error {
		cur = uint64(tx.ID())
		return nil
	})
	return cur
}

// unpublish drops the pending commit of a transaction that failed before
// bbolt wrote it (one it wrote is applied instead: commit). What readers
// see is then whatever bbolt shows them (cur, the transaction fileTx
// read): the order is counted as agreeing with it.
func (s *Store) unpublish(cur uint64) {
	s.omu.Lock()
	p := s.pending
	s.pending = nil
	if cur > s.appliedTx {
		s.appliedTx = cur
	}
	s.omu.Unlock()
	if p != nil {
		close(p.applied)
	}
}

// noBound: Head may read a queue's order as far as it goes (no sequence
// reaches it: MaxSequence is below).
const noBound = math.MaxUint64

// orderChunk returns up to n sequences of r's queue above after, with the
// bound below which they agree with a snapshot of transaction x (noBound:
// all of them), the transaction the order is at, and a channel to wait on
// for the order to catch up with x (nil: it need not). ok is false when
// the bound is not known (the snapshot is many commits behind the order,
// or a failed commit's effects are in the file): take a new snapshot.
func (s *Store) orderChunk(dst []uint64, r string, after uint64, n int, x uint64) (seqs []uint64, bound, at uint64, wait chan struct{}, ok bool) {
	s.omu.RLock()
	defer s.omu.RUnlock()
	at, bound = s.appliedTx, noBound
	st := s.queues[r]
	switch {
	case x == at:
	case s.pending != nil && x == s.pending.tx:
		if m, found := s.pending.adds[r]; found {
			bound, wait = m, s.pending.applied
		}
	case x < at:
		if st != nil {
			if bound, ok = st.addedSince(x); !ok {
				return dst, 0, at, nil, false
			}
		}
	default:
		return dst, 0, at, nil, false
	}
	if st != nil {
		dst = st.seqs.after(dst, after, n)
	}
	return dst, bound, at, wait, true
}
