package outbox

import (
	"context"
	"fmt"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/meshnode/meshnode/mailbox/pb"
)

// DueRecipients returns up to limit recipients whose queue is non-empty,
// whose send_at <= now and for which keep returns true (the relay passes
// its partition and in-flight filter; keep is called with the store's lock
// held and must not call back into the Store). next is the earliest send_at
// among the kept recipients that are not yet due (zero if none). The
// in-memory index makes this O(due + skipped), never a scan of the file.
func (s *Store) DueRecipients(now time.Time, keep func(recipient string) bool, limit int) (due []string, next time.Time) {
	if limit <= 0 {
		limit = 1
	}
	nowNs := now.UnixNano()
	s.mu.RLock()
	defer s.mu.RUnlock()
	s.due.Ascend(func(st *rstate) bool {
		if st.sendAt > nowNs {
			if st.sendAt == farFuture {
				return false
			}
			if keep == nil || keep(st.name) {
				next = time.Unix(0, st.sendAt)
				return false
			}
			return true
		}
		if keep != nil && !keep(st.name) {
			return true
		}
		if len(due) < limit {
			due = append(due, st.name)
			return true
		}
		// Full: more are due now.
		next = now
		return false
	})
	return due, next
}

// Head returns up to n oldest messages of recipient in FIFO order. Expired
// messages met on the way are moved to the dead-letter queue with reason
// "expired" (counted) and are never returned.
func (s *Store) Head(recipient string, n int) ([]*pb.StoredMessage, error) {
	return s.HeadSkip(recipient, n, nil)
}

// HeadSkip is Head that passes over the sequences in skip (sorted
// ascending): the relay's messages whose positive receipts came back but
// whose Ack has not committed yet, so the next batch can be sent while that
// Ack waits for its fsync. Skipped records are not decoded, and n counts
// only returned messages.
func (s *Store) HeadSkip(recipient string, n int, skip []uint64) ([]*pb.StoredMessage, error) {
	if err := s.closedErr(); err != nil {
		return nil, err
	}
	if n <= 0 {
		return nil, nil
	}
	for {
		nowMs := s.cfg.Now().UnixMilli()
		var out []*pb.StoredMessage
		var expired []uint64
		more := false
		err := s.db.View(func(tx *bolt.Tx) error {
			qb := tx.Bucket(bucketQueues).Bucket([]byte(recipient))
			if qb == nil {
				return nil
			}
			c := qb.Cursor()
			k, v := c.First()
			sk := skip
			for ; k != nil && len(out) < n; k, v = c.Next() {
				if len(sk) > 0 {
					sq := seqFromKey(k)
					for len(sk) > 0 && sk[0] < sq {
						sk = sk[1:]
					}
					if len(sk) > 0 && sk[0] == sq {
						sk = sk[1:]
						continue
					}
				}
				sm, err := decodeQueued(v)
				if err != nil || expiredAt(sm.GetEnvelope(), nowMs) {
					// An undecodable record can never be delivered either;
					// it goes to the DLQ through the same path.
					expired = append(expired, seqFromKey(k))
					continue
				}
				out = append(out, sm)
			}
			more = k != nil
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("outbox: head %s: %w", recipient, err)
		}
		if len(expired) > 0 {
			o := &op{kind: opExpire, recipient: recipient, seqs: expired}
			if err := s.submit(context.Background(), o); err != nil {
				return nil, fmt.Errorf("outbox: head %s: expire: %w", recipient, err)
			}
			if o.err != nil {
				return nil, o.err
			}
			if len(out) == 0 && more {
				continue
			}
		}
		return out, nil
	}
}

func seqFromKey(k []byte) uint64 {
	var v uint64
	for _, b := range k[:8] {
		v = v<<8 | uint64(b)
	}
	return v
}

// Ack removes delivered messages (a positive receipt came back). Acks are
// group-committed: many concurrent acks share one fsync. Unknown sequences
// are ignored (already acked, replaced or dead-lettered).
func (s *Store) Ack(recipient string, seqs []uint64) error {
	if len(seqs) == 0 {
		return nil
	}
	o := &op{kind: opAck, recipient: recipient, seqs: seqs}
	if err := s.submit(context.Background(), o); err != nil {
		return fmt.Errorf("outbox: ack %s: %w", recipient, err)
	}
	return o.err
}

// Failure describes one failed delivery attempt.
type Failure struct {
	Reason     string        // stored as last_error (and as the dead-letter reason if Permanent)
	Counts     bool          // counts toward MaxAttempts (handler error, NO_SUCH_ACTOR); false for capacity / peer down (rule 3)
	Permanent  bool          // straight to the DLQ (REJECTED receipt, node.Permanent, undecodable)
	RetryAfter time.Duration // >0: the recipient's send_at = now+RetryAfter; 0 and Counts: now+Backoff.Delay(attempts)
}

// Fail records a failed attempt of message seq (the head) of recipient. It
// returns true if the message went to the dead-letter queue (Permanent, or
// MaxAttempts counted attempts reached). A message that is no longer queued
// is ignored.
func (s *Store) Fail(recipient string, seq uint64, f Failure) (deadLettered bool, err error) {
	o := &op{kind: opFail, recipient: recipient, seqs: []uint64{seq}, failure: f}
	if err := s.submit(context.Background(), o); err != nil {
		return false, fmt.Errorf("outbox: fail %s/%d: %w", recipient, seq, err)
	}
	return o.dead, o.err
}

func (s *Store) applyFail(tx *bolt.Tx, b *batch, o *op) error {
	qb := tx.Bucket(bucketQueues).Bucket([]byte(o.recipient))
	if qb == nil {
		return nil
	}
	seq := o.seqs[0]
	v := qb.Get(seqKey(seq))
	if v == nil {
		return nil
	}
	f := o.failure
	sm, err := decodeQueued(v)
	if err != nil {
		o.dead = true
		return s.deadLetter(tx, b, o.recipient, qb, seq, &pb.StoredMessage{LastError: err.Error()}, "undecodable")
	}
	sm.LastError = f.Reason
	if f.Permanent {
		o.dead = true
		reason := f.Reason
		if reason == "" {
			reason = "rejected"
		}
		return s.deadLetter(tx, b, o.recipient, qb, seq, sm, reason)
	}
	if f.Counts {
		sm.Attempts++
		if int(sm.Attempts) >= s.cfg.MaxAttempts {
			o.dead = true
			return s.deadLetter(tx, b, o.recipient, qb, seq, sm, "max attempts")
		}
	}
	val, err := encodeQueued(sm)
	if err != nil {
		return err
	}
	if err := qb.Put(seqKey(seq), val); err != nil {
		return err
	}
	b.counters.retries++
	d := b.delta(o.recipient)
	switch {
	case f.RetryAfter > 0:
		d.sendAt = b.now.Add(f.RetryAfter).UnixNano()
	case f.Counts:
		d.sendAt = b.now.Add(s.cfg.Backoff.Delay(int(sm.Attempts))).UnixNano()
	}
	return nil
}

// Defer pushes recipient's send_at to until without counting anything (the
// peer is down or full). It is in memory only: after a restart every queue
// is due at once.
func (s *Store) Defer(recipient string, until time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.rs[recipient]; st != nil {
		s.setSendAt(st, until.UnixNano())
	}
}

// WakeNode makes every recipient "…@node" due now (the peer came back:
// rule 4), cancelling backoff and deferrals.
func (s *Store) WakeNode(node string) {
	now := s.cfg.Now().UnixNano()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, st := range s.byNode[node] {
		if st.sendAt > now {
			s.setSendAt(st, now)
		}
	}
}

// Recipients returns every recipient with waiting messages of node ("" =
// all nodes). It is meant for tools and tests, not hot paths.
func (s *Store) Recipients(node string) []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []string
	for r, st := range s.rs {
		if node == "" || st.node == node || strings.HasSuffix(r, "@"+node) {
			out = append(out, r)
		}
	}
	return out
}
