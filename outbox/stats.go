package outbox

import "time"

// Stats is a snapshot of the outbox.
type Stats struct {
	Depth       int            // messages waiting, all recipients
	DepthByPeer map[string]int // messages waiting per destination node
	OldestAge   time.Duration  // age of the oldest waiting message (elapsed clock)

	Retries      uint64 // handler failures that left the message queued
	DeadLettered uint64 // records moved to the DLQ
	Expired      uint64 // given up for TTL or age (at enqueue, at the head, by the sweep)
	Delivered    uint64 // acked records
	Enqueued     uint64 // records stored (including replacements and replays)
	Coalesced    uint64 // waiting messages replaced by a newer OVERWRITE
	Superseded   uint64 // OVERWRITE messages dropped as older

	DLQDepth       int    // records in the DLQ
	Fsyncs         uint64 // committed transactions (one fsync each)
	CommitFailures uint64 // transactions that failed (a full or failing disk); their callers got the error
	// Failure says why the store stopped taking writes (Err: the disk
	// failed a commit it had already written); "" while it takes them.
	Failure string
	// StreamsForgotten counts the receiver streams this node forgot,
	// idle for StreamRetention: their watermarks are gone (and, through
	// OnForget, what was kept beside them).
	StreamsForgotten uint64
}

// Stats returns a snapshot. It walks the per-recipient queues, so it is
// meant for metrics scrapes, not hot paths.
func (s *Store) Stats() Stats {
	st := Stats{
		DepthByPeer:    map[string]int{},
		Retries:        s.retries.Load(),
		DeadLettered:   s.deadLettered.Load(),
		Expired:        s.expired.Load(),
		Delivered:      s.delivered.Load(),
		Enqueued:       s.enqueued.Load(),
		Coalesced:      s.coalesced.Load(),
		Superseded:     s.superseded.Load(),
		Fsyncs:         s.fsyncs.Load(),
		CommitFailures: s.commitFails.Load(),

		StreamsForgotten: s.forgotten.Load(),
	}
	if err := s.Err(); err != nil {
		st.Failure = err.Error()
	}
	nowMs := s.clock.nowMs()
	oldest, any := int64(0), false
	s.mu.RLock()
	st.Depth = s.depth
	st.DLQDepth = s.dlqLen
	for _, r := range s.queues {
		st.DepthByPeer[r.node] += r.count()
		if !any || r.oldestMs < oldest {
			oldest, any = r.oldestMs, true
		}
	}
	s.mu.RUnlock()
	if any && nowMs > oldest {
		st.OldestAge = time.Duration(nowMs-oldest) * time.Millisecond
	}
	return st
}
