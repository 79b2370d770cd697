package partition

import (
	"sync"
	"sync/atomic"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

// Reading ahead: while an emission awaits its receipts (most of a drain's
// time), the stream's next emission is read from the store, so that when
// every receipt is positive the next one goes out without waiting for a
// Head. What was read ahead is used only if a Head at that moment would
// return the same messages first:
//   - the emission was clean and every ack since has committed or is
//     still committing or to be retried (any other outcome drops it);
//   - the store's Edits was even before the read and has not moved since
//     (nothing was replaced, retried, expired, replayed or dropped in any
//     queue, nor is being);
//   - what the stream skips now (acks committing) was skipped by the read;
//   - the read stopped below every sequence that could still commit after
//     it (aheadBelow), and nothing read is at or above the stream's Below
//     now, or has run out of TTL or age since (Head would give it up).
// Otherwise the stream reads with Head as usual. A proven stream whose
// Deliverer said the emission is queued sends what it read before the
// receipts come (follow, stream.go), under the same conditions but the
// first, with the emission's messages skipped as if acked: whether the
// emission comes back clean then decides whether the receipts of the one
// sent early are read.

// maxAhead bounds the streams reading ahead at a time: each holds up to
// BatchSize messages in memory beside the emission in flight.
const maxAhead = 4

// staleAheadMs: a read ahead older than this gives its place to another
// stream's (an emission takes milliseconds).
const staleAheadMs = 1000

// ahead is one stream's next emission, read ahead.
type ahead struct {
	done  chan struct{} // closed when the read ended
	at    int64         // the store's elapsed ms when it started
	edits uint64        // the store's Edits before the read
	skip  []uint64      // ascending: what the read skipped
	msgs  []*pb.StoredMessage
	ok    bool // read without error, and nothing held back by a TTL
}

// aheads are the streams' reads ahead.
type aheads struct {
	// mu guards the field below. Nothing is locked under it.
	mu sync.Mutex
	m  map[*stream]*ahead

	used atomic.Uint64 // emissions sent as read ahead (Stats.ReadAhead)
}

// readAhead starts reading st's next emission after msgs, the emission
// about to be sent under req (hw: the stream's emitted high-water with
// it; below: aheadBelow), if it filled its grant and more waits. It reads
// up to size messages.
func (r *Relay) readAhead(st *stream, req outbox.HeadRequest, msgs []*pb.StoredMessage, hw, below uint64, size int) {
	if len(msgs) < req.Max || r.store.PendingExcept(st.rcpt, req.Skip) <= len(msgs) {
		return
	}
	skip := mergeSorted(req.Skip, sequences(msgs))
	now := r.store.ElapsedMs()
	a := &ahead{done: make(chan struct{}), at: now, edits: r.store.Edits(), skip: skip}
	r.ahead.mu.Lock()
	if r.ahead.m == nil {
		r.ahead.m = make(map[*stream]*ahead)
	}
	if len(r.ahead.m) >= maxAhead {
		// A stream that has not come back for what it read (its peer went
		// down, say) gives its place up.
		for s, old := range r.ahead.m {
			if now-old.at > staleAheadMs {
				delete(r.ahead.m, s)
			}
		}
	}
	if len(r.ahead.m) >= maxAhead || r.ahead.m[st] != nil {
		r.ahead.mu.Unlock()
		return
	}
	r.ahead.m[st] = a
	r.ahead.mu.Unlock()
	next := outbox.HeadRequest{Recipient: st.rcpt, Max: size, MaxBytes: r.cfg.BatchBytes,
		Skip: skip, Below: below, EmittedHW: hw}
	r.wg.Go(func() {
		defer close(a.done)
		msgs, waitUntil, err := r.store.Head(next)
		a.msgs, a.ok = msgs, err == nil && waitUntil == 0 && len(msgs) > 0
	})
}

// sequences returns the sequences of msgs, ascending as Head returns them.
func sequences(msgs []*pb.StoredMessage) []uint64 {
	out := make([]uint64, len(msgs))
	for i, m := range msgs {
		out[i] = m.GetEnvelope().GetSequence()
	}
	return out
}

// aheadBelow is the Below of st's read ahead, taken under st.mu: below
// the first sequence still being stored, and below every sequence not yet
// handed out (handed: the store's HandedOutBelow). A stream's sequences are
// taken and listed as storing in one step under st.mu, so every sequence
// under the bound is, when the read runs, committed (and read) or was
// given up: none can appear later below what was read. Without the second
// bound, a sequence taken after this moment but committed after the read
// could sort below one taken later and committed before it.
func aheadBelow(st *stream, req outbox.HeadRequest, handed uint64) uint64 {
	below := handed
	if len(st.storing) > 0 {
		below = min(below, st.storing[0])
	}
	if req.Below != 0 {
		below = min(below, req.Below)
	}
	return below
}

// dropAhead forgets what st read ahead (its read may still be running).
func (r *Relay) dropAhead(st *stream) {
	r.ahead.mu.Lock()
	delete(r.ahead.m, st)
	r.ahead.mu.Unlock()
}

// dropAheadOf forgets what the stream of rcpt read ahead, if any.
func (r *Relay) dropAheadOf(rcpt string) {
	r.ahead.mu.Lock()
	defer r.ahead.mu.Unlock()
	for st := range r.ahead.m {
		if st.rcpt == rcpt {
			delete(r.ahead.m, st)
		}
	}
}

// head returns st's next emission under req: what it read ahead, if a
// Head now would return it, or else what Head returns.
func (r *Relay) head(st *stream, req outbox.HeadRequest) ([]*pb.StoredMessage, int64, error) {
	r.ahead.mu.Lock()
	a := r.ahead.m[st]
	delete(r.ahead.m, st)
	r.ahead.mu.Unlock()
	if a != nil {
		<-a.done
		if msgs := r.usable(a, req); msgs != nil {
			r.ahead.used.Add(1)
			return msgs, 0, nil
		}
	}
	return r.store.Head(req)
}

// usable returns the part of a that a Head under req would return now,
// or nil when it might differ.
func (r *Relay) usable(a *ahead, req outbox.HeadRequest) []*pb.StoredMessage {
	if !a.ok || req.Max <= 0 || a.edits%2 != 0 || a.edits != r.store.Edits() || !subset(req.Skip, a.skip) {
		return nil
	}
	msgs := a.msgs[:min(len(a.msgs), req.Max)]
	if req.Below != 0 && msgs[len(msgs)-1].GetEnvelope().GetSequence() >= req.Below {
		return nil
	}
	now := r.store.ElapsedMs()
	maxAge := r.store.Config().MaxAge().Milliseconds()
	for _, m := range msgs {
		created := m.GetCreatedElapsedMs()
		if created+maxAge <= now {
			return nil
		}
		if ttl := m.GetEnvelope().GetTtlMs(); ttl > 0 && created+ttl <= now {
			return nil
		}
	}
	return msgs
}

// subset reports whether every element of a (ascending) is in b
// (ascending).
func subset(a, b []uint64) bool {
	for _, x := range a {
		for len(b) > 0 && b[0] < x {
			b = b[1:]
		}
		if len(b) == 0 || b[0] != x {
			return false
		}
	}
	return true
}
