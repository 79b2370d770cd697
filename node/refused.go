package node

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// refusals keeps, by stream key, the messages above their stream's
// watermark that were refused for room (divergentAtRoom) or answered by
// their actor without their effect (inbound.notRun): their sequences and
// digests. The message that later moves the stream's watermark to one of
// those sequences is compared with the one refused there (passed);
// another marks the stream divergent, since within one sender history a
// sequence names one message. Kept apart from the
// stream cache (a stream may leave it while its messages wait in a
// mailbox), until the watermark passes them or refusedKeep after the
// stream's last refusal; at most maxRefused a stream and
// maxRefusedPerPeer for all the streams of one sender node, which picks
// its streams' epochs and sequences. Its lock is taken under a stream's
// cmu and never the other way round.
type refusals struct {
	mu      sync.Mutex
	streams map[string]*refusedSet
	perPeer map[string]int // per sender node: its messages kept, and refusedStreamWeight a stream
	n       atomic.Int32   // len(streams), read without mu
}

// refusedSet is what refusals keeps of one stream: its refused messages
// by sequence (msgs[off:]: those the watermark passed are cut from the
// front, and the array copied once they are half of it), its sender
// node, and when the last was noted (the store's elapsed clock).
type refusedSet struct {
	msgs []refusedMsg
	off  int
	peer string
	atMs int64
}

// live is the set's kept messages.
func (set *refusedSet) live() []refusedMsg { return set.msgs[set.off:] }

// refusedMsg is a message refused above its stream's watermark.
type refusedMsg struct{ seq, digest uint64 }

// maxRefused bounds what refusals keeps of one stream (its lowest
// sequences): twice what a relay has in flight on a stream by default
// (two emissions of 1,024), the most of one sender history that is
// refused above a watermark before it moves.
const maxRefused = 4096

// maxRefusedPerPeer bounds what refusals keeps of all the streams of one
// sender node, about 1 MiB: a refused message counts 1 (16 bytes), and
// each stream refusedStreamWeight more for its own keeping (its key and
// entry, about 250 bytes), since the sender picks its streams' epochs.
// Sixteen streams refused as far as maxRefused at once.
const maxRefusedPerPeer = 16 * (maxRefused + refusedStreamWeight)

// refusedStreamWeight is what a stream's own keeping counts against
// maxRefusedPerPeer, in refused messages.
const refusedStreamWeight = 16

// refusedKeep is how long refusals keeps a stream's messages after its
// last refusal when its watermark does not pass them: their sender sends
// a refused message again within its retry hints, and one that does not
// (given up, wiped) would keep them for good. A day: an old message that
// waits in a mailbox longer than that after the refusal is not compared.
const refusedKeep = 24 * time.Hour

// findRefused is the index of seq in msgs, or where it would go.
func findRefused(msgs []refusedMsg, seq uint64) (int, bool) {
	return slices.BinarySearchFunc(msgs, seq, func(r refusedMsg, s uint64) int { return cmp.Compare(r.seq, s) })
}

// note keeps that a message of the stream key, from peer, under seq
// with digest d was refused without running, at nowMs. Two refused
// under one sequence with other contents leave divergedMark there, which
// no message that runs under it matches. Past the bounds it keeps
// nothing more.
func (r *refusals) note(key, peer string, seq, d uint64, nowMs int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	set := r.streams[key]
	if set == nil {
		if r.perPeer[peer]+refusedStreamWeight+1 > maxRefusedPerPeer {
			return
		}
		set = &refusedSet{peer: peer}
		if r.streams == nil {
			r.streams, r.perPeer = map[string]*refusedSet{}, map[string]int{}
		}
		r.streams[key] = set
		r.perPeer[peer] += refusedStreamWeight
		r.n.Store(int32(len(r.streams)))
	}
	set.atMs = nowMs
	live := set.live()
	i, found := findRefused(live, seq)
	switch {
	case found:
		if live[i].digest != d {
			live[i].digest = divergedMark
		}
	case i < maxRefused && r.perPeer[peer] < maxRefusedPerPeer:
		set.msgs = slices.Insert(set.msgs, set.off+i, refusedMsg{seq: seq, digest: d})
		r.perPeer[peer]++
		if len(set.live()) > maxRefused {
			set.msgs = set.msgs[:len(set.msgs)-1]
			r.perPeer[peer]--
		}
	}
	if len(set.live()) == 0 {
		r.dropLocked(key, set)
	}
}

// other reports whether a message of the stream key refused under seq
// is kept with another digest than digest gives (called only then): a
// batch does not run a message chained to seq beside the one under seq
// whose digest that is, which is another than the refused one, before
// that one moved the watermark and was found so.
func (r *refusals) other(key string, seq uint64, digest func() uint64) bool {
	if r.n.Load() == 0 {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	set, i, found := r.findLocked(key, seq)
	return found && set.live()[i].digest != digest()
}

// findLocked is the kept messages of the stream key (nil: none) and
// where seq is among them, or would go.
func (r *refusals) findLocked(key string, seq uint64) (set *refusedSet, i int, found bool) {
	if set = r.streams[key]; set == nil {
		return nil, 0, false
	}
	i, found = findRefused(set.live(), seq)
	return set, i, found
}

// passed reports whether the message that moves the watermark of the
// stream key to seq, whose digest is d, is another than one refused
// under seq before: the stream's sender then has two histories, and
// what is chained behind the refused one must not run in this one. It
// forgets what the watermark passes.
func (r *refusals) passed(key string, seq, d uint64) (other bool) {
	if r.n.Load() == 0 {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	set, i, found := r.findLocked(key, seq)
	if set == nil {
		return false
	}
	other = found && set.live()[i].digest != d
	if found {
		i++
	}
	switch {
	case i == len(set.live()):
		r.dropLocked(key, set)
	case i > 0:
		// Cut from the front, and the rest copied into an array of its
		// own once the cut part is half of it: a stream whose watermark
		// moves one message at a time neither copies its refusals each
		// time nor keeps the array of those it passed.
		set.off += i
		r.perPeer[set.peer] -= i
		if set.off > len(set.msgs)/2 {
			set.msgs, set.off = slices.Clone(set.live()), 0
		}
	}
	return other
}

// expire forgets the streams whose last refusal was noted before
// cutoffMs.
func (r *refusals) expire(cutoffMs int64) {
	if r.n.Load() == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, set := range r.streams {
		if set.atMs < cutoffMs {
			r.dropLocked(k, set)
		}
	}
}

// kept is how many refused messages are kept, and of how many streams.
func (r *refusals) kept() (msgs, streams int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, set := range r.streams {
		msgs += len(set.live())
	}
	return msgs, len(r.streams)
}

func (r *refusals) dropLocked(key string, set *refusedSet) {
	delete(r.streams, key)
	r.n.Store(int32(len(r.streams)))
	if k := r.perPeer[set.peer] - len(set.live()) - refusedStreamWeight; k > 0 {
		r.perPeer[set.peer] = k
	} else {
		delete(r.perPeer, set.peer)
	}
}
