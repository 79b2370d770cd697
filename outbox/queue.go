package outbox

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"strings"

	bolt "go.etcd.io/bbolt"

	"github.com/meshnode/meshnode/internal/address"
	"github.com/meshnode/meshnode/mailbox/pb"
)

// The queue API: what the relay (package partition) uses to drain the
// outbox. The store executes; the relay decides (what is due, what counts,
// what has expired).

// HeadRequest says which messages of a queue Head returns.
type HeadRequest struct {
	Recipient string
	Max       int // at most this many messages
	// MaxBytes: stop before the message whose stored record would take
	// the total over it (0 = no bound); the first always comes.
	MaxBytes int
	Skip     []uint64 // ascending: sequences to pass over (acks still committing)
	// Below: only sequences < Below (0 = no bound), because a message with
	// a lower sequence may still be committing.
	Below uint64
	// EmittedHW: sequences above it have never been on the wire, so one
	// whose TTL ran out is given up at once rather than after MaxClockSkew.
	EmittedHW uint64
}

// Head returns up to req.Max oldest messages of a queue in sequence order.
// Messages whose TTL or age ran out are moved to the dead-letter queue on
// the way ("expired", counted) and never returned. A message that has run
// out of TTL but may still have a copy at the receiver (it was on the wire)
// cannot be sent and cannot be given up before its TTL plus MaxClockSkew:
// Head stops before it and returns its give-up time as waitUntil (elapsed
// ms), so the stream stays in order.
func (s *Store) Head(req HeadRequest) (msgs []*pb.StoredMessage, waitUntil int64, err error) {
	if err := s.usableErr(); err != nil {
		return nil, 0, err
	}
	if req.Max <= 0 {
		return nil, 0, nil
	}
	maxAge := s.cfg.MaxAge().Milliseconds()
	skew := s.cfg.MaxClockSkew.Milliseconds()
	for tries := 1; ; tries++ {
		nowMs := s.clock.nowMs()
		msgs, waitUntil = nil, 0
		var expire []uint64
		var reasons []string
		more := false  // the queue may hold more than what was looked at
		short := false // cut short where the snapshot and the order may disagree
		var wait chan struct{}
		err := s.db.View(func(tx *bolt.Tx) error {
			// The queue's order comes from memory, a slice at a time; a
			// sequence it names that the snapshot does not hold for the
			// recipient left the queue since (seqlist.go says why the two
			// agree below the bound).
			x := uint64(tx.ID())
			c := tx.Bucket(bucketRecords).Cursor()
			var at []byte // the cursor's key
			var last uint64
			var state uint64 // the order's commit at the first slice
			sk := req.Skip
			size := 0 // stored bytes of msgs
			for first := true; ; first = false {
				if len(msgs) == req.Max {
					more = true
					return nil
				}
				n := min(req.Max-len(msgs), maxHeadSlice) + min(len(sk), maxHeadSlice) + headSlack
				seqs, bound, st, w, ok := s.orderChunk(nil, req.Recipient, last, n, x)
				switch {
				case !ok:
					short = true
					return nil
				case first:
					state, wait = st, w
				case st != state:
					// The order moved on since the first slice: this
					// snapshot's prefix is what it is.
					more, short = true, true
					return nil
				}
				if len(seqs) == 0 {
					return nil // the end of the queue
				}
				for _, sq := range seqs {
					if len(msgs) == req.Max {
						more = true
						return nil
					}
					last = sq
					if req.Below != 0 && sq >= req.Below {
						more = true
						return nil
					}
					if bound != noBound && sq >= bound {
						more, short = true, true
						return nil
					}
					for len(sk) > 0 && sk[0] < sq {
						sk = sk[1:]
					}
					if len(sk) > 0 && sk[0] == sq {
						sk = sk[1:]
						continue
					}
					var v []byte
					if at, v = seekSeq(c, at, sq); v == nil || !ofRecipient(v, req.Recipient) {
						continue
					}
					created := createdMs(v)
					if created+maxAge <= nowMs {
						expire, reasons = append(expire, sq), append(reasons, TooOldReason(sq, req.EmittedHW))
						continue
					}
					if dl := deadlineMs(v); dl != 0 && dl <= nowMs {
						switch {
						case sq > req.EmittedHW:
							expire, reasons = append(expire, sq), append(reasons, ReasonExpired)
							continue
						case dl+skew <= nowMs:
							expire, reasons = append(expire, sq), append(reasons, ReasonExpiredUnknown)
							continue
						}
						waitUntil = dl + skew
						return nil
					}
					if req.MaxBytes > 0 && len(msgs) > 0 && size+len(v) > req.MaxBytes {
						more = true
						return nil
					}
					sm, err := decodeRecord(v)
					if err != nil {
						expire, reasons = append(expire, sq), append(reasons, "undecodable: "+err.Error())
						continue
					}
					msgs = append(msgs, sm)
					size += len(v)
				}
			}
		})
		if err != nil {
			return nil, 0, fmt.Errorf("outbox: head %s: %w", req.Recipient, err)
		}
		if short && tries < headTries {
			// A commit in flight (or just applied) changed the queue
			// below what this snapshot could read: read again once it is
			// in memory.
			if wait != nil {
				select {
				case <-wait:
				case <-s.stopped:
				}
			}
			continue
		}
		if len(expire) == 0 {
			return msgs, waitUntil, nil
		}
		byReason := make(map[string][]uint64)
		for i, sq := range expire {
			byReason[reasons[i]] = append(byReason[reasons[i]], sq)
		}
		for reason, sqs := range byReason {
			if _, err := s.Expire(req.Recipient, sqs, reason); err != nil {
				return nil, 0, fmt.Errorf("outbox: head %s: %w", req.Recipient, err)
			}
		}
		if len(msgs) > 0 || !more || waitUntil != 0 {
			return msgs, waitUntil, nil
		}
	}
}

// headSlack is how many sequences beyond what it needs Head takes from a
// queue's order at a time, for those it passes over (expired, gone);
// maxHeadSlice bounds a slice (a Max of "everything" reads in slices).
const (
	headSlack    = 16
	maxHeadSlice = 1 << 14
)

// headTries is how many snapshots Head reads before it returns a prefix
// cut short by a commit that kept changing the queue below it.
const headTries = 4

// seekSeq moves c, which is at key at (nil: nowhere yet), to sequence sq
// and returns the key it is at and sq's record (nil: none). A queue's
// records often follow each other in the bucket: one step then spares a
// search.
func seekSeq(c *bolt.Cursor, at []byte, sq uint64) ([]byte, []byte) {
	var k, v []byte
	if at != nil && seqOf(at) < sq {
		k, v = c.Next()
	}
	if k == nil || seqOf(k) < sq {
		k, v = c.Seek(seqKey(sq))
	}
	if k == nil {
		return nil, nil
	}
	if seqOf(k) != sq {
		return k, nil
	}
	return k, v
}

// Reasons for messages given up for age.
const (
	// ReasonExpired: the TTL ran out before the message ran, and no copy
	// of it can run later: it was never sent, or its receiver answered
	// EXPIRED and no copy of it went through a forwarder unanswered.
	ReasonExpired = "expired"
	// ReasonExpiredUnknown: the TTL ran out after the message was sent
	// without a receipt coming back, or after a restart, when the outbox
	// cannot tell whether the run before sent it (it counts everything it
	// had stored as sent): it may or may not have run.
	ReasonExpiredUnknown = "expired (outcome unknown: it may have been sent, and no receipt came back)"
	// ReasonTooOld: the message waited longer than a receiver keeps a
	// stream (StreamRetention - RetentionMargin).
	ReasonTooOld = "expired: older than the retention limit"
	// ReasonTooOldUnknown: the same for a message that was sent (or may
	// have been, before a restart) without a receipt coming back: it may
	// have run, and a copy in flight, or held at a forwarder, may still.
	ReasonTooOldUnknown = ReasonTooOld + " (outcome unknown: it may have been sent, and no receipt came back)"
	// ReasonForgotten: the receiver answered that it forgot the stream
	// (idle past its StreamRetention) and the message is older than what
	// it forgot. The sender's clock undercounted the message's age (it was
	// down longer than MaxDowntime): it may have run before the receiver
	// forgot it, so it is not sent again.
	ReasonForgotten = "expired: older than the receiver's retention (it forgot the stream; outcome unknown: it may have run)"
	// OutcomeUnknownForwarded ends the reason of a failure ("rejected: …",
	// "max attempts: …") of a message a copy of which was sent through a
	// forwarder and got no answer: the forwarder may hold that copy and it
	// may run when it arrives, so the dead letter may have run.
	OutcomeUnknownForwarded = " (outcome unknown: a copy sent through a forwarder got no answer)"
	// OutcomeUnknownSent ends the reason of a failure that does not say
	// whether an earlier copy of the message, sent without a receipt
	// coming back, ran: no such actor (the actor gone after it ran), or a
	// message that can no longer be put on the wire.
	OutcomeUnknownSent = " (outcome unknown: an earlier copy was sent, and no receipt came back)"
	// OutcomeUnknownDropped ends the reason of a message DropQueue gave up.
	OutcomeUnknownDropped = " (outcome unknown: it may have been sent before it was dropped)"
)

func isExpiredReason(r string) bool { return strings.HasPrefix(r, ReasonExpired) }

// TooOldReason returns the reason for message seq given up for its age,
// where emitted is its stream's emitted high-water (HeadRequest.EmittedHW):
// one that was ever sent may have run.
func TooOldReason(seq, emitted uint64) string {
	if seq > emitted {
		return ReasonTooOld // never on the wire
	}
	return ReasonTooOldUnknown
}

// Ack removes delivered messages (a positive receipt came back). Acks are
// group-committed: many concurrent acks share one fsync. Unknown sequences
// are ignored (already acked, replaced or given up).
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

// Stored returns the message queued under sequence seq, whatever its
// recipient, or nil when none is (acked, replaced, given up, or never
// handed out). It reads the file.
func (s *Store) Stored(seq uint64) (*pb.StoredMessage, error) {
	var sm *pb.StoredMessage
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketRecords).Get(seqKey(seq))
		if v == nil {
			return nil
		}
		var err error
		sm, err = decodeRecord(v)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: stored #%d: %w", seq, err)
	}
	return sm, nil
}

// Failure is the receiver's verdict on one message, as far as it counts.
type Failure struct {
	Reason    string // stored as last_error, and in the dead-letter reason
	Counts    bool   // a handler failure: counts toward MaxAttempts
	Permanent bool   // poison: straight to the dead-letter queue
}

// Fail records a verdict on message seq of recipient. It returns the
// message's counted attempts and whether it went to the dead-letter queue
// (Permanent, or MaxAttempts reached: reason "max attempts: <Reason>"). A
// message that is no longer queued is ignored.
func (s *Store) Fail(recipient string, seq uint64, f Failure) (attempts int, deadLettered bool, err error) {
	o := &op{kind: opFail, recipient: recipient, seqs: []uint64{seq}, failure: f}
	if err := s.submit(context.Background(), o); err != nil {
		return 0, false, fmt.Errorf("outbox: fail %s/%d: %w", recipient, seq, err)
	}
	return o.n, o.dead, o.err
}

func (s *Store) applyFail(tx *bolt.Tx, b *batch, o *op) error {
	qb := b.records(tx)
	seq := o.seqs[0]
	v := qb.Get(seqKey(seq))
	if !ofRecipient(v, o.recipient) {
		return nil
	}
	f := o.failure
	sm, err := decodeRecord(v)
	if err != nil {
		o.dead = true
		return s.deadLetter(tx, b, o.recipient, qb, seq, v, "undecodable", nil)
	}
	if f.Permanent {
		o.dead = true
		reason := f.Reason
		if reason == "" {
			reason = "rejected"
		}
		return s.deadLetter(tx, b, o.recipient, qb, seq, v, reason, func(sm *pb.StoredMessage) { sm.LastError = f.Reason })
	}
	sm.LastError = f.Reason
	if f.Counts {
		sm.Attempts++
		// Compared as stored: an int may have 32 bits, a record's count
		// 32 unsigned ones.
		if uint64(sm.Attempts) >= uint64(s.cfg.MaxAttempts) {
			o.dead, o.n = true, attemptsInt(sm.Attempts)
			return s.deadLetter(tx, b, o.recipient, qb, seq, v, "max attempts: "+f.Reason, func(x *pb.StoredMessage) {
				x.Attempts, x.LastError = sm.Attempts, f.Reason
			})
		}
	}
	o.n = attemptsInt(sm.Attempts)
	val, err := rewriteRecord(v, sm)
	if err != nil {
		return err
	}
	if err := qb.Put(seqKey(seq), val); err != nil {
		return err
	}
	b.counters.retries++
	b.delta(o.recipient) // the head's record changed; nothing else did
	return nil
}

// Expire moves the given queued messages of recipient to the dead-letter
// queue with reason (which starts with "expired") and returns how many it
// moved. Messages no longer queued are ignored.
func (s *Store) Expire(recipient string, seqs []uint64, reason string) (int, error) {
	o := &op{kind: opExpire, recipient: recipient, seqs: seqs, reason: reason}
	if err := s.submit(context.Background(), o); err != nil {
		return 0, fmt.Errorf("outbox: expire %s: %w", recipient, err)
	}
	return o.n, o.err
}

func (s *Store) applyExpire(tx *bolt.Tx, b *batch, o *op) error {
	qb := b.records(tx)
	for _, sq := range o.seqs {
		v := qb.Get(seqKey(sq))
		if !ofRecipient(v, o.recipient) {
			continue
		}
		if err := s.deadLetter(tx, b, o.recipient, qb, sq, v, o.reason, nil); err != nil {
			return err
		}
		o.n++
	}
	return nil
}

// Expiring is a queued message whose TTL deadline or age limit has come.
type Expiring struct {
	Recipient string
	Seq       uint64
	// DeadlineMs is its TTL deadline (elapsed ms); 0 when it is its age
	// that passed the retention limit.
	DeadlineMs int64
}

// ExpiryCandidates returns up to limit queued messages whose TTL deadline
// has passed at nowMs, oldest deadline first, then the head of every
// queue whose age limit has, and the earliest time (elapsed ms) another
// one's will (0 = none known; now when limit cut the list short). The
// relay, which knows which of them were sent and which streams are being
// sent, decides when to give each up (a sent one only MaxClockSkew after
// its deadline) and calls Expire.
func (s *Store) ExpiryCandidates(nowMs int64, limit int) (out []Expiring, next int64, err error) {
	return s.ExpiryCandidatesAfter(nowMs, limit, Expiring{})
}

// ExpiryCandidatesAfter is ExpiryCandidates going on from after, the last
// candidate with a TTL deadline of an earlier call that returned limit of
// them (the zero Expiring: from the first): a caller that can give none
// of those up yet (sent ones waiting out the clock skew, ones in flight)
// is not held to them. Candidates whose age passed the retention limit
// come after those with a TTL deadline, from the call that reached the
// last of them.
func (s *Store) ExpiryCandidatesAfter(nowMs int64, limit int, after Expiring) (out []Expiring, next int64, err error) {
	maxAge := s.cfg.MaxAge().Milliseconds()
	from := after.DeadlineMs != 0
	err = s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketExpiry).Cursor()
		k, _ := c.First()
		if from {
			ak := expiryKey(after.DeadlineMs, after.Seq, after.Recipient)
			if k, _ = c.Seek(ak); k != nil && bytes.Equal(k, ak) {
				k, _ = c.Next()
			}
		}
		for ; k != nil; k, _ = c.Next() {
			dl := int64(seqOf(k))
			if dl > nowMs {
				next = dl
				break
			}
			if len(out) >= limit {
				next = nowMs
				break
			}
			out = append(out, Expiring{Recipient: string(bytes.Clone(k[16:])), Seq: seqOf(k[8:]), DeadlineMs: dl})
		}
		return nil
	})
	if err != nil {
		return nil, 0, fmt.Errorf("outbox: expiry candidates: %w", err)
	}
	if len(out) >= limit {
		return out, next, nil // the rest after them, next time
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, st := range s.queues {
		at := st.oldestMs + maxAge
		if at <= nowMs {
			// At most one a queue, and the caller decides when: not
			// bounded by limit, nor a reason to look again now.
			out = append(out, Expiring{Recipient: st.name, Seq: st.headSeq})
			continue
		}
		if next == 0 || at < next {
			next = at
		}
	}
	return out, next, nil
}

// Defer pushes recipient's send_at to atMs (elapsed) without counting
// anything. It is persisted (asynchronously: it is only a delay), so a
// restart does not make every deferred queue due at once.
func (s *Store) Defer(recipient string, atMs int64) {
	s.mu.Lock()
	st := s.queues[recipient]
	if st != nil {
		s.setSendAt(st, atMs)
	}
	s.mu.Unlock()
	if st != nil {
		s.submitAsync(&op{kind: opDefer, recipient: recipient, at: atMs, async: func(error) {}})
	}
}

// NoteVersion durably records seq as the newest version of (recipient,
// coalesceKey) in the coalesce index (unless a newer one is recorded), and
// returns once it is committed. A sender notes the version of a message it
// is about to deliver without storing it (a direct attempt) first: were it
// noted only after the delivery, a Replay of an older version meanwhile,
// or after a crash before the note's commit, would run that older version
// after this one. Enqueueing the message under seq afterwards is not
// refused as superseded by its own note.
func (s *Store) NoteVersion(ctx context.Context, recipient, coalesceKey string, seq uint64) error {
	if coalesceKey == "" || len(coalesceKey) > MaxKeyLen || checkRecipient(recipient) != nil {
		return nil
	}
	o := &op{kind: opVersion, recipient: recipient, reason: coalesceKey, seq: seq}
	if err := s.submit(ctx, o); err != nil {
		return err
	}
	return o.err
}

// WakeNode makes every recipient "…@node" due now (the peer came back),
// cancelling backoff and deferrals in memory.
func (s *Store) WakeNode(node string) {
	now := s.clock.nowMs()
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.byNode[node]
	if n == nil {
		return
	}
	for _, st := range n.queues {
		if st.sendAt > now {
			s.setSendAt(st, now)
		}
	}
}

// StreamState returns the persisted epoch and high-water (the highest
// sequence ever stored) of recipient's stream.
func (s *Store) StreamState(recipient string) (epoch, highWater uint64, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		os, err := decodeOutStream(tx.Bucket(bucketOut).Get([]byte(recipient)))
		epoch, highWater = os.GetEpoch(), os.GetHighWater()
		return err
	})
	if err != nil {
		return 0, 0, fmt.Errorf("outbox: stream state %s: %w", recipient, err)
	}
	return epoch, highWater, nil
}

// SetEpoch durably starts a new epoch of recipient's stream.
func (s *Store) SetEpoch(recipient string, epoch uint64) error {
	o := &op{kind: opEpoch, recipient: recipient, seq: epoch}
	if err := s.submit(context.Background(), o); err != nil {
		return fmt.Errorf("outbox: set epoch %s: %w", recipient, err)
	}
	return o.err
}

// DropQueue moves every message queued for recipient (an "actor@node"
// address) or, given a bare node name, for every actor of that node, to the
// dead-letter queue with reason "dropped: <why> (outcome unknown: …)", in
// transactions bounded by MaxBatch and MaxBatchBytes: a message may have
// been sent, and run, before it was dropped (its receipt lost, or its copy
// on the wire), which the store cannot tell.
// It returns how many it moved; Replay brings them back.
func (s *Store) DropQueue(target, why string) (int, error) {
	var rcpts []string
	if _, _, ok := address.Split(target); ok {
		rcpts = []string{target}
	} else {
		rcpts = s.Recipients(target)
	}
	total := 0
	for _, r := range rcpts {
		for {
			o := &op{kind: opDrop, recipient: r, reason: "dropped: " + why + OutcomeUnknownDropped}
			if err := s.submit(context.Background(), o); err != nil {
				return total, fmt.Errorf("outbox: drop %s: %w", r, err)
			}
			if o.err != nil {
				return total, o.err
			}
			total += o.n
			if !o.more {
				break
			}
		}
	}
	return total, nil
}

func (s *Store) applyDrop(tx *bolt.Tx, b *batch, o *op) error {
	recs := b.records(tx)
	size := 0
	seqs := s.liveSeqs(nil, o.recipient, b.q[o.recipient], s.cfg.MaxBatch+1)
	for i, sq := range seqs {
		v := recs.Get(seqKey(sq))
		if !ofRecipient(v, o.recipient) {
			// Not expected: the order in memory names a record the file
			// does not hold. Mend the order rather than drop forever.
			s.cfg.Logger.Error("outbox: a queue's order named a message the file does not hold; dropped from the order",
				"recipient", o.recipient, "seq", sq)
			b.removed(o.recipient, sq)
			continue
		}
		if i == s.cfg.MaxBatch || (i > 0 && size+len(v) > s.cfg.MaxBatchBytes) {
			o.more = true
			break
		}
		size += len(v)
		if err := s.deadLetter(tx, b, o.recipient, recs, sq, v, o.reason, nil); err != nil {
			return err
		}
		o.n++
	}
	return nil
}

// Recipients returns every recipient with waiting messages of node ("" =
// all nodes). It is meant for tools and tests, not hot paths.
func (s *Store) Recipients(node string) []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []string
	for r, st := range s.queues {
		if node == "" || st.node == node {
			out = append(out, r)
		}
	}
	return out
}

// attemptsInt is a record's attempts as an int, at most the most an int
// holds (32 bits on some platforms).
func attemptsInt(n uint32) int { return int(min(uint64(n), math.MaxInt)) }
