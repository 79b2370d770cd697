package partition

import (
	"sync"
	"time"
)

// Acks that fail. An Ack records that the receiver ran messages; its
// commit can fail (a full or failing disk) after the receiver's verdict is
// in. The messages are then the receiver's all the same: sending them
// again would bring back DUPLICATE and another failing commit, as fast as
// the peer answers, and giving them up at their TTL would put messages
// that ran into the dead-letter queue as "outcome unknown", for an
// operator to replay. So their sequences stay in their stream's acking
// list (skipped by Head, left alone by the sweeper, and counted against
// MaxAckPending: a stream stops after that many failed batches), and the
// sweeper retries the Ack, waiting twice as long after each round that
// fails, from minWriteRetry up to maxWriteRetry (the sweeper's give-ups
// back off the same way when the disk refuses them). Close tries once more; what
// still fails is in the store and goes again after a restart, answered
// DUPLICATE by the receiver.

// The waits before writing again after the disk refused a write.
const (
	minWriteRetry = 100 * time.Millisecond
	maxWriteRetry = 10 * time.Second
)

// nextWriteRetry is the wait after prev when a write failed again.
func nextWriteRetry(prev time.Duration) time.Duration {
	return min(max(2*prev, minWriteRetry), maxWriteRetry)
}

// failedAck is one Ack to retry: seqs of st, in st.acking, counted in
// st.ackBatches.
type failedAck struct {
	st   *stream
	seqs []uint64
}

type failedAcks struct {
	mu   sync.Mutex
	list []failedAck   // oldest first
	wait time.Duration // before the next round; grows while rounds fail
}

// ackLater keeps the acks of st, whose Ack failed with err, for the
// sweeper to retry. The caller has put them in st.acking and counted them
// in st.ackBatches.
func (r *Relay) ackLater(st *stream, seqs []uint64, err error) {
	f := &r.failedAcks
	f.mu.Lock()
	f.list = append(f.list, failedAck{st: st, seqs: seqs})
	f.mu.Unlock()
	r.cfg.Logger.Warn("relay: ack failed; the receiver ran the messages, which stay queued until the ack is retried and commits",
		"recipient", st.rcpt, "messages", len(seqs), "err", err)
	select {
	case r.sweepWake <- struct{}{}:
	default:
	}
}

// acked records that the Ack of seqs of st committed.
func (r *Relay) acked(st *stream, seqs []uint64) {
	st.mu.Lock()
	st.ackBatches--
	st.acking = removeSorted(st.acking, seqs)
	st.updateBlocked(r.cfg.MaxAckPending)
	st.mu.Unlock()
	r.delivered.Add(uint64(len(seqs)))
}

// retryAcks retries every failed Ack, one Ack per stream. It reports
// whether some are still to retry, and after how long. A commit can fail
// for what it writes as well as for the disk as a whole, so one stream's
// failing Ack does not hold back the others'.
func (r *Relay) retryAcks() (wait time.Duration, pending bool) {
	f := &r.failedAcks
	f.mu.Lock()
	list := f.list
	f.list = nil
	f.mu.Unlock()
	var left []failedAck
	var lastErr error
	for len(list) > 0 {
		// The entries of list[0].st, merged into one Ack.
		st := list[0].st
		var mine []failedAck
		var seqs []uint64
		rest := list[:0:0]
		for _, a := range list {
			if a.st == st {
				mine, seqs = append(mine, a), mergeSorted(seqs, a.seqs)
			} else {
				rest = append(rest, a)
			}
		}
		list = rest
		if err := r.ack(st.rcpt, seqs); err != nil {
			lastErr = err
			left = append(left, mine...)
			continue
		}
		for _, a := range mine {
			r.acked(st, a.seqs)
		}
		r.Notify(st.rcpt) // it may have stopped at MaxAckPending
		r.forget(st)
	}
	f.mu.Lock()
	f.list = append(left, f.list...)
	switch {
	case lastErr != nil:
		f.wait = nextWriteRetry(f.wait)
	case len(f.list) > 0:
		f.wait = minWriteRetry // new failures came while this round ran
	default:
		f.wait = 0
	}
	wait, n := f.wait, len(f.list)
	f.mu.Unlock()
	if lastErr != nil {
		r.cfg.Logger.Warn("relay: ack retry failed", "acks", n, "next", wait, "err", lastErr)
	}
	return wait, n > 0
}
