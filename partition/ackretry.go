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
// fails, from minAckRetry up to maxAckRetry. Close tries once more; what
// still fails is in the store and goes again after a restart, answered
// DUPLICATE by the receiver.

const (
	minAckRetry = 100 * time.Millisecond
	maxAckRetry = 10 * time.Second
)

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
	r.failedAcks.mu.Lock()
	r.failedAcks.list = append(r.failedAcks.list, failedAck{st: st, seqs: seqs})
	r.failedAcks.mu.Unlock()
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

// retryAcks retries the failed Acks, oldest first, until one fails again.
// It reports whether some are still to retry, and after how long.
func (r *Relay) retryAcks() (wait time.Duration, pending bool) {
	f := &r.failedAcks
	f.mu.Lock()
	list := f.list
	f.list = nil
	f.mu.Unlock()
	var err error
	done := 0
	for _, a := range list {
		if err = r.ack(a.st.rcpt, a.seqs); err != nil {
			break // the disk still refuses: the rest next round
		}
		done++
		r.acked(a.st, a.seqs)
		r.Notify(a.st.rcpt) // it may have stopped at MaxAckPending
		r.forget(a.st)
	}
	f.mu.Lock()
	f.list = append(list[done:], f.list...)
	switch {
	case err != nil:
		f.wait = min(max(2*f.wait, minAckRetry), maxAckRetry)
	case len(f.list) > 0:
		f.wait = minAckRetry // new failures came while this round ran
	default:
		f.wait = 0
	}
	wait, left := f.wait, len(f.list)
	f.mu.Unlock()
	if err != nil {
		r.cfg.Logger.Warn("relay: ack retry failed", "acks", left, "next", wait, "err", err)
	}
	return wait, left > 0
}
