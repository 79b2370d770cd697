package outbox

import "time"

// Stats is a snapshot of the outbox.
type Stats struct {
	Depth       int            // messages waiting, all recipients
	DepthByPeer map[string]int // messages waiting per destination node
	OldestAge   time.Duration  // age of the oldest waiting message
	InFlight    int            // limiter slots held, all nodes
	LimitByPeer map[string]int // current AIMD limit per node

	Retries      uint64 // failed attempts that stayed queued
	DeadLettered uint64 // records moved to the DLQ
	Expired      uint64 // expired at enqueue or at the head
	Delivered    uint64 // acked records
	Enqueued     uint64 // records appended (including replacements and replays)
	Coalesced    uint64 // waiting messages replaced by a newer OVERWRITE
	Superseded   uint64 // OVERWRITE envelopes dropped as older
	DedupeHits   uint64 // Seen calls that returned true

	DLQDepth   int    // records in the DLQ
	DedupeKeys int    // idempotency keys held by the receiver's dedupe window
	Fsyncs     uint64 // committed transactions (one fsync each)
}

// Stats returns a snapshot. It walks the per-recipient states, so it is
// meant for metrics scrapes, not hot paths.
func (s *Store) Stats() Stats {
	st := Stats{
		DepthByPeer:  map[string]int{},
		LimitByPeer:  map[string]int{},
		Retries:      s.retries.Load(),
		DeadLettered: s.deadLettered.Load(),
		Expired:      s.expired.Load(),
		Delivered:    s.delivered.Load(),
		Enqueued:     s.enqueued.Load(),
		Coalesced:    s.coalesced.Load(),
		Superseded:   s.superseded.Load(),
		DedupeHits:   s.dedupeHits.Load(),
		Fsyncs:       s.fsyncs.Load(),
	}
	nowMs := s.cfg.Now().UnixMilli()
	oldest := int64(0)
	s.mu.RLock()
	st.Depth = s.depth
	st.DLQDepth = s.dlqLen
	for _, r := range s.rs {
		st.DepthByPeer[r.node] += r.count
		if oldest == 0 || (r.oldestMs != 0 && r.oldestMs < oldest) {
			oldest = r.oldestMs
		}
	}
	s.mu.RUnlock()
	s.dmu.RLock()
	st.DedupeKeys = len(s.dedupe)
	s.dmu.RUnlock()
	if oldest != 0 && nowMs > oldest {
		st.OldestAge = time.Duration(nowMs-oldest) * time.Millisecond
	}
	s.lmu.Lock()
	for n, l := range s.limiters {
		st.LimitByPeer[n] = l.Limit()
		st.InFlight += l.InFlight()
	}
	s.lmu.Unlock()
	return st
}
