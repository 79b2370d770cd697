package outbox

import (
	"encoding/binary"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	"github.com/meshnode/meshnode/mailbox/pb"
)

type opKind uint8

const (
	opEnqueue opKind = iota
	opAck
	opFail
	opExpire
	opRecord
	opReplay
	opPurge
	opDeadLetter
)

func (k opKind) String() string {
	return [...]string{"enqueue", "ack", "fail", "expire", "record", "replay", "purge", "dead-letter"}[k]
}

// op is one caller's request to the committer. The committer fills the
// result fields and closes done after the transaction committed.
type op struct {
	kind      opKind
	envs      []*pb.Envelope // opEnqueue
	recipient string         // opAck, opFail, opExpire
	seqs      []uint64       // opAck, opExpire; opFail uses seqs[0]
	failure   Failure        // opFail
	key       string         // opRecord: sender\x00key
	filter    DLQFilter      // opReplay, opPurge
	async     func(error)    // opRecord by RecordAsync: called after the commit instead of closing done

	err     error    // whole-op result
	results []Result // opEnqueue: per envelope
	errs    []error  // opEnqueue: per envelope
	n       int      // opReplay, opPurge: records affected
	dead    bool     // opFail: went to the DLQ
	done    chan struct{}
}

func (o *op) weight() int {
	return max(1, len(o.envs), len(o.seqs))
}

// qdelta is what one batch did to one recipient's queue.
type qdelta struct {
	count    int
	sendAt   int64 // 0 = leave as is
	empty    bool  // queue empty after the batch
	headSeq  uint64
	oldestMs int64
	enqueued bool // wake the relay
}

// batch accumulates the in-memory effects of one transaction; they are
// applied only after it committed.
type batch struct {
	now      time.Time
	nowMs    int64
	q        map[string]*qdelta
	dlq      int
	dedupe   map[string]int64
	pruned   []string
	pruneRan bool
	counters struct{ retries, dead, expired, delivered, enqueued, coalesced, superseded uint64 }
}

func (b *batch) delta(r string) *qdelta {
	d := b.q[r]
	if d == nil {
		d = &qdelta{}
		b.q[r] = d
	}
	return d
}

// run is the committer goroutine: it owns every write transaction. It
// takes what is queued (up to MaxBatch records), applies it in one
// db.Update (one fsync) and then releases every waiting caller.
func (s *Store) run() {
	defer close(s.stopped)
	buf := make([]*op, 0, 256)
	released := 0 // callers released by the previous commit
	backlog := 0  // ops queued when the previous commit ended
	linger := time.NewTimer(time.Hour)
	linger.Stop()
	defer linger.Stop()
	for {
		var first *op
		select {
		case first = <-s.ops:
		case <-s.closing:
			// Commit what callers already handed over, then stop.
			for {
				buf, _ = s.gather(buf[:0], 0)
				if len(buf) == 0 {
					return
				}
				s.commit(buf)
			}
		}
		buf, n := s.gather(append(buf[:0], first), first.weight())
		// Linger: the callers the last commit released are likely to come
		// straight back (a sender loop, an actor recording its next key).
		// Waiting a little for them lets one fsync carry all the callers
		// instead of alternating between two half batches.
		// want estimates the concurrent callers: those released plus those
		// that queued up during the last commit.
		if want := released + backlog; s.cfg.CommitLinger > 0 && len(buf) < want && n < s.cfg.MaxBatch {
			linger.Reset(s.cfg.CommitLinger)
		wait:
			for len(buf) < want && n < s.cfg.MaxBatch {
				select {
				case o := <-s.ops:
					buf = append(buf, o)
					n += o.weight()
				case <-linger.C:
					break wait
				case <-s.closing:
					break wait
				}
			}
			if !linger.Stop() {
				select {
				case <-linger.C:
				default:
				}
			}
		}
		released = len(buf)
		s.commit(buf)
		backlog = len(s.ops)
		clear(buf)
	}
}

// gather appends the ops already queued to buf, without waiting, until the
// batch weighs MaxBatch; n is the weight buf already has.
func (s *Store) gather(buf []*op, n int) ([]*op, int) {
	for n < s.cfg.MaxBatch {
		select {
		case o := <-s.ops:
			buf = append(buf, o)
			n += o.weight()
		default:
			return buf, n
		}
	}
	return buf, n
}

// commit applies ops in one transaction.
func (s *Store) commit(ops []*op) {
	now := s.cfg.Now()
	b := &batch{now: now, nowMs: now.UnixMilli(), q: make(map[string]*qdelta)}
	err := s.db.Update(func(tx *bolt.Tx) error {
		for _, o := range ops {
			if err := s.apply(tx, b, o); err != nil {
				return fmt.Errorf("%s: %w", o.kind, err)
			}
		}
		if err := s.pruneDedupe(tx, b); err != nil {
			return err
		}
		q := tx.Bucket(bucketQueues)
		for r, d := range b.q {
			qb := q.Bucket([]byte(r))
			var k, v []byte
			if qb != nil {
				k, v = qb.Cursor().First()
			}
			if k == nil {
				d.empty = true
				if qb != nil {
					if err := q.DeleteBucket([]byte(r)); err != nil {
						return fmt.Errorf("drop empty queue %s: %w", r, err)
					}
				}
				continue
			}
			d.headSeq = binary.BigEndian.Uint64(k)
			d.oldestMs = enqueuedMs(v)
		}
		return tx.Bucket(bucketMeta).Put(keySeqHigh, u64(s.seq.Load()))
	})
	if err != nil {
		err = fmt.Errorf("outbox: commit: %w", err)
		s.cfg.Logger.Error("outbox commit failed", "err", err, "ops", len(ops))
		for _, o := range ops {
			o.err = err
			for i := range o.errs {
				o.errs[i] = err
			}
		}
		s.forgetPending(ops)
		s.finish(ops)
		return
	}
	s.fsyncs.Add(1)
	s.applyEffects(b)
	s.forgetPending(ops)
	s.finish(ops)
	if f := s.onEnqueue.Load(); f != nil {
		for r, d := range b.q {
			if d.enqueued && !d.empty {
				(*f)(r)
			}
		}
	}
}

// finish releases the callers of ops: it closes done, or calls the
// RecordAsync callback.
func (s *Store) finish(ops []*op) {
	for _, o := range ops {
		if o.async != nil {
			o.async(o.err)
			continue
		}
		close(o.done)
	}
}

// forgetPending drops RecordAsync keys of ops from the pending set: after a
// commit they are in the dedupe map, after a failure they are not recorded.
func (s *Store) forgetPending(ops []*op) {
	locked := false
	for _, o := range ops {
		if o.async == nil {
			continue
		}
		if !locked {
			s.dmu.Lock()
			locked = true
		}
		if s.pendingKeys[o.key]--; s.pendingKeys[o.key] <= 0 {
			delete(s.pendingKeys, o.key)
		}
	}
	if locked {
		s.dmu.Unlock()
	}
}

// applyEffects mirrors a committed batch into the in-memory indexes.
func (s *Store) applyEffects(b *batch) {
	c := &b.counters
	s.retries.Add(c.retries)
	s.deadLettered.Add(c.dead)
	s.expired.Add(c.expired)
	s.delivered.Add(c.delivered)
	s.enqueued.Add(c.enqueued)
	s.coalesced.Add(c.coalesced)
	s.superseded.Add(c.superseded)

	s.mu.Lock()
	s.dlqLen += b.dlq
	for r, d := range b.q {
		st := s.rs[r]
		if d.empty {
			if st != nil {
				s.depth -= st.count
				s.removeRS(st)
			}
			continue
		}
		if st == nil {
			st = &rstate{name: r, node: nodeOf(r), count: d.count, headSeq: d.headSeq, oldestMs: d.oldestMs, sendAt: b.now.UnixNano()}
			if d.sendAt != 0 {
				st.sendAt = d.sendAt
			}
			s.insertRS(st)
			continue
		}
		st.count += d.count
		s.depth += d.count
		st.headSeq, st.oldestMs = d.headSeq, d.oldestMs
		if d.sendAt != 0 {
			s.setSendAt(st, d.sendAt)
		}
	}
	s.mu.Unlock()

	if len(b.dedupe) > 0 || b.pruneRan {
		s.dmu.Lock()
		for k, v := range b.dedupe {
			s.dedupe[k] = v
		}
		for _, k := range b.pruned {
			if s.dedupe[k] < b.nowMs-s.cfg.DedupeWindow.Milliseconds() {
				delete(s.dedupe, k)
			}
		}
		if b.pruneRan && len(b.pruned) < maxPrunePerCommit {
			// All old keys are gone; otherwise the next commit prunes on,
			// so the window never holds more than it should.
			s.lastPrune = b.now
		}
		s.dmu.Unlock()
	}
}

// apply performs one op inside the transaction. A returned error aborts
// the whole transaction (storage failure); per-record problems are
// reported in the op instead.
func (s *Store) apply(tx *bolt.Tx, b *batch, o *op) error {
	switch o.kind {
	case opDeadLetter:
		return s.putDeadLetter(tx, b, &pb.StoredMessage{Envelope: o.envs[0], FirstEnqueuedUnixMs: b.nowMs, LastError: o.failure.Reason}, o.failure.Reason)
	case opEnqueue:
		for i, env := range o.envs {
			if o.errs[i] != nil {
				continue
			}
			res, err := s.applyEnqueue(tx, b, env, true, &pb.StoredMessage{Envelope: env, FirstEnqueuedUnixMs: b.nowMs})
			if err != nil {
				return err
			}
			o.results[i] = res
		}
	case opAck:
		qb := tx.Bucket(bucketQueues).Bucket([]byte(o.recipient))
		if qb == nil {
			return nil
		}
		d := b.delta(o.recipient)
		for _, sq := range o.seqs {
			k := seqKey(sq)
			if qb.Get(k) == nil {
				continue
			}
			if err := qb.Delete(k); err != nil {
				return err
			}
			d.count--
			b.counters.delivered++
		}
	case opFail:
		return s.applyFail(tx, b, o)
	case opExpire:
		qb := tx.Bucket(bucketQueues).Bucket([]byte(o.recipient))
		if qb == nil {
			return nil
		}
		for _, sq := range o.seqs {
			v := qb.Get(seqKey(sq))
			if v == nil {
				continue
			}
			sm, err := decodeQueued(v)
			if err != nil {
				// Undecodable: still never deliverable.
				sm = &pb.StoredMessage{LastError: err.Error()}
			}
			if err := s.deadLetter(tx, b, o.recipient, qb, sq, sm, "expired"); err != nil {
				return err
			}
		}
	case opRecord:
		if err := tx.Bucket(bucketDedupe).Put([]byte(o.key), u64(uint64(b.nowMs))); err != nil {
			return err
		}
		if b.dedupe == nil {
			b.dedupe = make(map[string]int64)
		}
		b.dedupe[o.key] = b.nowMs
	case opReplay, opPurge:
		return s.applyDLQ(tx, b, o)
	}
	return nil
}

// applyEnqueue appends sm (whose envelope is env) to its recipient's queue.
// With coalesce, an OVERWRITE envelope with an idempotency key replaces the
// waiting message of the same (recipient, key) if it is newer, and is
// dropped as superseded if it is older.
func (s *Store) applyEnqueue(tx *bolt.Tx, b *batch, env *pb.Envelope, coalesce bool, sm *pb.StoredMessage) (Result, error) {
	r := env.GetRecipient()
	if env.Sequence == 0 {
		env.Sequence = s.NextSequence()
	} else {
		s.observeSeq(env.Sequence)
	}
	q := tx.Bucket(bucketQueues)
	qb, err := q.CreateBucketIfNotExists([]byte(r))
	if err != nil {
		return 0, err
	}
	d := b.delta(r)
	res := Queued
	var ck []byte
	co := tx.Bucket(bucketCoalesce)
	if coalesce && env.GetConflict() == pb.Envelope_OVERWRITE && env.GetIdempotencyKey() != "" {
		ck = []byte(r + "\x00" + env.GetIdempotencyKey())
		if v := co.Get(ck); len(v) == 8 {
			old := binary.BigEndian.Uint64(v)
			if env.Sequence <= old {
				b.counters.superseded++
				return Superseded, nil
			}
			if qb.Get(seqKey(old)) != nil {
				if err := qb.Delete(seqKey(old)); err != nil {
					return 0, err
				}
				d.count--
				res = Replaced
				b.counters.coalesced++
			}
		}
	}
	// Rule 1: a new message always goes behind the waiting ones, even if
	// its caller-chosen sequence is lower.
	if k, _ := qb.Cursor().Last(); k != nil && binary.BigEndian.Uint64(k) >= env.Sequence {
		env.Sequence = s.NextSequence()
	}
	if ck != nil {
		if err := co.Put(ck, u64(env.Sequence)); err != nil {
			return 0, err
		}
	}
	val, err := encodeQueued(sm)
	if err != nil {
		return 0, err
	}
	if err := qb.Put(seqKey(env.Sequence), val); err != nil {
		return 0, err
	}
	d.count++
	d.enqueued = true
	b.counters.enqueued++
	return res, nil
}

func encodeQueued(sm *pb.StoredMessage) ([]byte, error) {
	buf := make([]byte, 8, 8+proto.Size(sm))
	binary.BigEndian.PutUint64(buf, uint64(sm.GetFirstEnqueuedUnixMs()))
	out, err := proto.MarshalOptions{}.MarshalAppend(buf, sm)
	if err != nil {
		return nil, fmt.Errorf("marshal: %w", err)
	}
	return out, nil
}

func decodeQueued(v []byte) (*pb.StoredMessage, error) {
	if len(v) < 8 {
		return nil, fmt.Errorf("%w: short queue record", ErrCorrupt)
	}
	sm := &pb.StoredMessage{}
	if err := proto.Unmarshal(v[8:], sm); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	if sm.Envelope == nil {
		sm.Envelope = &pb.Envelope{}
	}
	return sm, nil
}

// deadLetter moves the queued record seq of recipient into the DLQ.
func (s *Store) deadLetter(tx *bolt.Tx, b *batch, recipient string, qb *bolt.Bucket, seq uint64, sm *pb.StoredMessage, reason string) error {
	if err := qb.Delete(seqKey(seq)); err != nil {
		return err
	}
	b.delta(recipient).count--
	if sm.Envelope == nil {
		sm.Envelope = &pb.Envelope{Recipient: recipient, Sequence: seq}
	}
	return s.putDeadLetter(tx, b, sm, reason)
}

// putDeadLetter writes sm into the dead-letter queue with reason.
func (s *Store) putDeadLetter(tx *bolt.Tx, b *batch, sm *pb.StoredMessage, reason string) error {
	sm.DeadLetteredUnixMs = b.nowMs
	sm.DeadLetterReason = reason
	val, err := proto.Marshal(sm)
	if err != nil {
		return fmt.Errorf("marshal dead letter: %w", err)
	}
	dlq := tx.Bucket(bucketDLQ)
	id, err := dlq.NextSequence()
	if err != nil {
		return err
	}
	if err := dlq.Put(u64(id), val); err != nil {
		return err
	}
	b.dlq++
	b.counters.dead++
	if reason == "expired" {
		b.counters.expired++
	}
	return nil
}
