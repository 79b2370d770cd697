package outbox

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	"github.com/meshnode/meshnode/internal/address"
	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/mailbox/pb"
)

type opKind uint8

const (
	opEnqueue opKind = iota
	opAck
	opFail
	opExpire
	opReserve
	opStream
	opReplay
	opPurge
	opDeadLetter
	opDefer
	opEpoch
	opDrop
	opCheckpoint
	opVersion
	opForwarding
)

func (k opKind) String() string {
	return [...]string{"enqueue", "ack", "fail", "expire", "reserve", "stream", "replay", "purge",
		"dead-letter", "defer", "epoch", "drop", "checkpoint", "version", "forwarding"}[k]
}

// op is one caller's request to the committer. The committer fills the
// result fields and closes done (or calls async) after the transaction
// committed.
type op struct {
	kind      opKind
	msgs      []*pb.StoredMessage // opEnqueue, opDeadLetter
	recs      [][]byte            // opEnqueue: msgs[i] encoded as a queue record by the caller (nil: encode in the transaction)
	recipient string              // opAck, opFail, opExpire, opDefer, opEpoch, opDrop, opVersion
	seqs      []uint64            // opAck, opExpire, opReplay (new sequences); opFail uses seqs[0]
	seq       uint64              // opReserve: new high-water; opEpoch: the epoch; opVersion: the version; opForwarding: the mark
	at        int64               // opDefer: send_at (elapsed ms)
	failure   Failure             // opFail
	reason    string              // opExpire, opDeadLetter, opDrop; opVersion: the coalesce key
	ids       [][]byte            // opReplay, opPurge: dead-letter keys
	replayTTL int64               // opReplay: TTL override in ms (-1 = keep)
	stream    *StreamCommit       // opStream
	bytes     int                 // opEnqueue: marshalled size of msgs, bounded per transaction by MaxBatchBytes
	async     func(error)         // called after the commit instead of closing done
	enqueued  func(Result, error) // EnqueueAsync: called after the commit with its one message's outcome, instead of closing done

	err     error    // whole-op result
	results []Result // opEnqueue: per message
	errs    []error  // opEnqueue: per message
	n       int      // opReplay, opPurge, opDrop, opExpire: records affected
	skipped int      // opReplay: dead letters refused (superseded, unroutable)
	dead    bool     // opFail: went to the DLQ
	more    bool     // opDrop: records remain
	done    chan struct{}
}

func (o *op) weight() int {
	return max(1, len(o.msgs), len(o.seqs), len(o.ids))
}

// qdelta is what one batch did to one recipient's queue.
type qdelta struct {
	count     int
	sendAt    int64  // in-memory send_at to set (0 = leave as is)
	persistAt bool   // write sendAt into the stream record
	epoch     uint64 // with setEpoch: write it into the stream record
	setEpoch  bool
	highWater uint64 // highest sequence stored by this batch
	empty     bool   // queue empty after the batch
	headSeq   uint64
	oldestMs  int64
	enqueued  bool // wake the relay
	// ev is what the batch did to the queue's order, in the order it did
	// it: applied to the in-memory order after the commit.
	ev []seqEvent
}

// seqEvent is one record stored (gone false) or removed.
type seqEvent struct {
	seq  uint64
	gone bool
}

// batch accumulates the in-memory effects of one transaction; they are
// applied only after it committed.
type batch struct {
	minDeadline int64 // earliest TTL deadline of a message stored by the batch (0 = none)
	nowMs       int64
	wallMs      int64
	q           map[string]*qdelta
	recs        *bolt.Bucket // the records bucket of the transaction (records)
	recCur      *bolt.Cursor // a cursor on recs for lookups (recordAt)
	key         [8]byte      // recordAt's key
	dlq         int
	counters    struct{ retries, dead, expired, delivered, enqueued, coalesced, superseded uint64 }
	// edited: an op changed a queue other than by appending a message or
	// removing an acknowledged one (Edits); editing: Edits was made odd
	// for the commit.
	edited, editing bool
	forgot          []ForgottenStream // the receiver streams housekeeping forgot
	tx              uint64            // the transaction's id, once it has one
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
// takes what is queued (up to MaxBatch records and MaxBatchBytes message
// bytes), applies it in one db.Update (one fsync) and then releases every
// waiting caller.
func (s *Store) run() {
	defer close(s.stopped)
	g := &gathered{ops: make([]*op, 0, 256)}
	released := 0 // callers released by the previous commit
	backlog := 0  // ops queued when the previous commit ended
	linger := time.NewTimer(time.Hour)
	linger.Stop()
	defer linger.Stop()
	idle := time.NewTimer(s.cfg.CheckpointInterval)
	defer idle.Stop()
	for {
		g.reset() // an op carried over from the last batch opens this one
		if len(g.ops) == 0 {
			select {
			case o := <-s.ops:
				s.add(g, o)
			case <-idle.C:
				// Nothing committed for a while: persist the elapsed clock so
				// a crash does not lose the time the store was idle.
				s.add(g, &op{kind: opCheckpoint, async: func(error) {}})
			case <-s.closing:
				// Commit what callers already handed over, then stop.
				for {
					g.reset()
					s.gather(g)
					if len(g.ops) == 0 {
						return
					}
					s.commit(g.ops)
				}
			}
		}
		s.gather(g)
		// Linger: the callers the last commit released are likely to come
		// straight back (a sender loop, an actor committing its next
		// watermark). Waiting a little for them lets one fsync carry all
		// the callers instead of alternating between two half batches.
		// want estimates the concurrent callers: those released plus those
		// that queued up during the last commit.
		if want := released + backlog; s.cfg.CommitLinger > 0 && len(g.ops) < want && s.room(g) {
			linger.Reset(s.cfg.CommitLinger)
		wait:
			for len(g.ops) < want && s.room(g) {
				select {
				case o := <-s.ops:
					s.add(g, o)
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
		released = len(g.ops)
		s.commit(g.ops)
		backlog = len(s.ops)
		if !idle.Stop() {
			select {
			case <-idle.C:
			default:
			}
		}
		idle.Reset(s.cfg.CheckpointInterval)
	}
}

// gathered is the batch the committer is filling. Owned by run.
type gathered struct {
	ops   []*op
	n     int // records (op weights)
	bytes int // message bytes
	// carry was taken from s.ops but would have taken the batch over
	// MaxBatchBytes: it opens the next batch.
	carry *op
}

// reset empties g for the next batch, keeping its carried op.
func (g *gathered) reset() {
	clear(g.ops)
	if g.carry != nil {
		g.ops, g.n, g.bytes = append(g.ops[:0], g.carry), g.carry.weight(), g.carry.bytes
		g.carry = nil
		return
	}
	g.ops, g.n, g.bytes = g.ops[:0], 0, 0
}

// room reports whether g may take another op.
func (s *Store) room(g *gathered) bool {
	return g.carry == nil && g.n < s.cfg.MaxBatch && g.bytes < s.cfg.MaxBatchBytes
}

// add puts o into g, or carries it to the next batch when its message
// bytes would take a non-empty batch over MaxBatchBytes (one op alone is
// never refused: EnqueueBatch already cut it to size).
func (s *Store) add(g *gathered, o *op) {
	if len(g.ops) > 0 && g.bytes+o.bytes > s.cfg.MaxBatchBytes {
		g.carry = o
		return
	}
	g.ops = append(g.ops, o)
	g.n += o.weight()
	g.bytes += o.bytes
}

// gather adds the ops already queued to g, without waiting, while it has
// room.
func (s *Store) gather(g *gathered) {
	for s.room(g) {
		select {
		case o := <-s.ops:
			s.add(g, o)
		default:
			return
		}
	}
}

// commit applies ops in one transaction.
func (s *Store) commit(ops []*op) {
	if err := s.Err(); err != nil {
		// Ops handed over before the store stopped: none is written.
		s.fail(ops, err)
		return
	}
	b := &batch{nowMs: s.clock.nowMs(), wallMs: s.cfg.Clock.Now().UnixMilli(), q: make(map[string]*qdelta)}
	err := s.db.Update(func(tx *bolt.Tx) error {
		if err := faults.CommitError(s.cfg.Path); err != nil {
			return err // a test's full disk
		}
		for _, o := range ops {
			if err := s.apply(tx, b, o); err != nil {
				return fmt.Errorf("%s: %w", o.kind, err)
			}
		}
		if err := s.housekeep(tx, b); err != nil {
			return err
		}
		if err := s.finishQueues(tx, b); err != nil {
			return err
		}
		if b.edited {
			// Odd from before bbolt writes the meta page (when readers
			// start to see the commit) until after it returns: Edits.
			s.edits.Add(1)
			b.editing = true
		}
		if err := putClock(tx.Bucket(bucketMeta), s.clock); err != nil {
			return err
		}
		// Readers see the commit from when bbolt writes its meta page,
		// before the queues' order in memory has it: say what it adds.
		b.tx = uint64(tx.ID())
		s.publish(b)
		return nil
	})
	if b.editing {
		s.edits.Add(1)
	}
	if err != nil {
		s.commitFails.Add(1)
		cur := s.fileTx()
		if b.tx != 0 && cur >= b.tx {
			// bbolt wrote the meta page and then failed (its fsync):
			// readers of the file see this commit, and the disk may not
			// keep it. Memory follows the file; the store stops.
			s.applyEffects(b)
			s.noteForgotten(b)
			err = fmt.Errorf("%w: %w", ErrFailed, err)
			s.failed.Store(&err)
			s.cfg.Logger.Error("outbox failed: a commit reached the file but the disk failed to sync it; no more writes until the store is reopened", "err", err, "ops", len(ops))
			s.fail(ops, fmt.Errorf("outbox: commit: %w", err))
			return
		}
		s.unpublish(cur)
		err = fmt.Errorf("outbox: commit: %w", err)
		s.cfg.Logger.Error("outbox commit failed", "err", err, "ops", len(ops))
		s.fail(ops, err)
		return
	}
	s.fsyncs.Add(1)
	s.applyEffects(b)
	s.forgetPendingKeys(ops)
	// Before the callers hear of their commit: whoever learns a message
	// is stored can count on the sweeper knowing its deadline.
	if f := s.onExpiry.Load(); f != nil && b.minDeadline != 0 {
		(*f)(b.minDeadline)
	}
	s.finish(ops)
	if f := s.onEnqueue.Load(); f != nil {
		for r, d := range b.q {
			if d.enqueued && !d.empty {
				(*f)(r)
			}
		}
	}
	s.noteForgotten(b)
}

// noteForgotten counts the streams b's commit forgot and tells OnForget.
func (s *Store) noteForgotten(b *batch) {
	s.forgotten.Add(uint64(len(b.forgot)))
	if f := s.cfg.OnForget; f != nil && len(b.forgot) > 0 {
		f(b.forgot)
	}
}

// fail releases the callers of ops with err.
func (s *Store) fail(ops []*op, err error) {
	for _, o := range ops {
		o.err = err
		for i := range o.errs {
			o.errs[i] = err
		}
	}
	s.forgetPendingKeys(ops)
	s.finish(ops)
}

// finishQueues works out each touched queue's new head, and writes the
// stream records the batch changed.
func (s *Store) finishQueues(tx *bolt.Tx, b *batch) error {
	out := tx.Bucket(bucketOut)
	for r, d := range b.q {
		name := []byte(r)
		if head := s.liveSeqs(nil, r, d, 1); len(head) == 0 {
			d.empty = true
		} else {
			d.headSeq, d.oldestMs = head[0], createdMs(b.records(tx).Get(seqKey(head[0])))
		}
		if d.highWater == 0 && !d.persistAt && !d.setEpoch && !d.empty {
			continue
		}
		os, err := decodeOutStream(out.Get(name))
		if err != nil {
			return fmt.Errorf("stream record %s: %w", r, err)
		}
		os.HighWater = max(os.HighWater, d.highWater)
		if d.persistAt {
			os.SendAtElapsedMs = d.sendAt
		}
		if d.setEpoch {
			os.Epoch = d.epoch
		}
		if d.empty {
			// Nothing waits: the high-water and the deferral are only
			// needed while messages do. A non-zero epoch is kept.
			if os.Epoch == 0 {
				if err := out.Delete(name); err != nil {
					return err
				}
				continue
			}
			os.HighWater, os.SendAtElapsedMs = 0, 0
		}
		val, err := proto.Marshal(os)
		if err != nil {
			return err
		}
		if err := out.Put(name, val); err != nil {
			return err
		}
	}
	return nil
}

func decodeOutStream(v []byte) (*pb.OutStream, error) {
	os := &pb.OutStream{}
	if len(v) == 0 {
		return os, nil
	}
	if err := proto.Unmarshal(v, os); err != nil {
		return os, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	return os, nil
}

// finish releases the callers of ops: it closes done, or calls async or
// enqueued.
func (s *Store) finish(ops []*op) {
	for _, o := range ops {
		if o.enqueued != nil {
			err := o.err
			if err == nil {
				err = o.errs[0]
			}
			o.enqueued(o.results[0], err)
			continue
		}
		if o.async != nil {
			o.async(o.err)
			continue
		}
		close(o.done)
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
	defer s.mu.Unlock()
	s.omu.Lock()
	defer s.omu.Unlock()
	p := s.pending
	defer close(p.applied)
	s.pending, s.appliedTx = nil, b.tx
	s.dlqLen += b.dlq
	for r, d := range b.q {
		st := s.queues[r]
		if d.empty {
			if st != nil {
				s.depth -= st.count()
				s.removeQueue(st)
			}
			continue
		}
		if st == nil {
			st = &queue{name: r, node: address.Node(r), headSeq: d.headSeq, oldestMs: d.oldestMs, sendAt: b.nowMs}
			if d.sendAt != 0 {
				st.sendAt = d.sendAt
			}
			st.seqs.apply(d.ev)
			st.noteAdds(b.tx, p.adds)
			s.insertQueue(st)
			continue
		}
		st.seqs.apply(d.ev)
		st.noteAdds(b.tx, p.adds)
		s.depth += d.count
		st.headSeq, st.oldestMs = d.headSeq, d.oldestMs
		// A queue's in-memory send_at is set by Defer and WakeNode when
		// they are called; the committed deferral only persists it. Setting
		// it again here would undo a WakeNode made while the write waited.
	}
}

// apply performs one op inside the transaction. A returned error aborts
// the whole transaction (storage failure); per-record problems are
// reported in the op instead.
func (s *Store) apply(tx *bolt.Tx, b *batch, o *op) error {
	switch o.kind {
	case opEnqueue, opAck, opReserve, opStream, opPurge, opDeadLetter, opDefer, opEpoch, opVersion, opCheckpoint, opForwarding:
		// Appends, acks and what leaves the queues' records alone (an
		// enqueue that replaces a waiting version says so itself).
	default:
		b.edited = true // retries, expiries, replays, drops: and any kind added later
	}
	switch o.kind {
	case opEnqueue:
		for i, sm := range o.msgs {
			if o.errs[i] != nil {
				continue
			}
			var rec []byte
			if o.recs != nil {
				rec = o.recs[i]
			}
			res, err := s.applyEnqueue(tx, b, sm, rec)
			if err != nil {
				o.errs[i] = err
				continue
			}
			o.results[i] = res
		}
	case opDeadLetter:
		sm := o.msgs[0]
		sm.LastError = o.reason
		err := s.putDeadLetter(tx, b, sm, o.reason)
		if errors.Is(err, ErrBadMessage) {
			o.err = err // nothing written: it fails alone
			return nil
		}
		if err != nil {
			return err
		}
		// A version that never was queued (its direct attempt was refused)
		// is noted as the index notes a queued one: Replay then refuses
		// the older versions, and replaying it first does not make it
		// look older than the one replayed before it.
		if env := sm.GetEnvelope(); env.GetConflict() == pb.Envelope_OVERWRITE && env.GetCoalesceKey() != "" {
			return noteVersion(tx, b, env.GetRecipient(), env.GetCoalesceKey(), env.GetSequence())
		}
	case opAck:
		// One cursor seek per message instead of a Get and a Delete (two
		// searches); acks come in sequence order, a drain's thousands per
		// commit.
		c := b.records(tx).Cursor()
		var key [8]byte
		for _, sq := range o.seqs {
			binary.BigEndian.PutUint64(key[:], sq)
			k, v := c.Seek(key[:])
			if k == nil || !bytes.Equal(k, key[:]) || !ofRecipient(v, o.recipient) {
				continue // already acked, replaced or given up
			}
			if err := s.removeRecordAt(tx, b, o.recipient, c, sq, v); err != nil {
				return err
			}
			b.counters.delivered++
		}
	case opFail:
		return s.applyFail(tx, b, o)
	case opExpire:
		return s.applyExpire(tx, b, o)
	case opReserve:
		return tx.Bucket(bucketMeta).Put(keySeqHigh, u64(o.seq))
	case opForwarding:
		return tx.Bucket(bucketMeta).Put(keyForwarded, u64(o.seq))
	case opStream:
		return s.applyStream(tx, b, o.stream)
	case opReplay:
		return s.applyReplay(tx, b, o)
	case opPurge:
		dlq := tx.Bucket(bucketDLQ)
		for _, k := range o.ids {
			if dlq.Get(k) == nil {
				continue
			}
			if err := dlq.Delete(k); err != nil {
				return err
			}
			b.dlq--
			o.n++
		}
	case opDefer:
		if s.queuedAfter(o.recipient, b) == 0 {
			return nil // delivered or dropped meanwhile
		}
		d := b.delta(o.recipient)
		d.sendAt, d.persistAt = o.at, true
	case opEpoch:
		d := b.delta(o.recipient)
		d.epoch, d.setEpoch = o.seq, true
	case opDrop:
		return s.applyDrop(tx, b, o)
	case opVersion:
		return noteVersion(tx, b, o.recipient, o.reason, o.seq)
	case opCheckpoint:
	}
	return nil
}

// noteVersion records seq as the newest version of (r, key) in the
// coalesce index unless a newer one is recorded.
func noteVersion(tx *bolt.Tx, b *batch, r, key string, seq uint64) error {
	co := tx.Bucket(bucketCoalesce)
	ck := coalesceKey(r, key)
	if v := co.Get(ck); len(v) < 8 || seqOf(v) < seq {
		return co.Put(ck, coalesceVal(seq, b.nowMs))
	}
	return nil
}

// applyEnqueue stores sm at its sequence. An OVERWRITE message with a
// coalesce key replaces the waiting older version of the same (recipient,
// key), and is dropped as superseded if a newer version was stored. rec is
// sm already encoded by encodeMessage, or nil.
//
// Every check that can refuse sm (its sequence taken, the record not
// encodable) comes before the first write: a refused message fails alone
// in a transaction that still commits, so it must leave nothing behind.
func (s *Store) applyEnqueue(tx *bolt.Tx, b *batch, sm *pb.StoredMessage, rec []byte) (Result, error) {
	env := sm.GetEnvelope()
	r, seq := env.GetRecipient(), env.GetSequence()
	recs := b.records(tx)
	if v := b.recordAt(tx, seq); v != nil {
		return 0, fmt.Errorf("outbox: enqueue to %s: %w: sequence %d is already queued (for %s)", r, ErrBadMessage, seq, recRecipient(v))
	}
	val := rec
	if val == nil {
		var err error
		if val, err = encodeMessage(sm); err != nil {
			return 0, fmt.Errorf("outbox: enqueue to %s: %w: %w", r, ErrBadMessage, err)
		}
	}
	d := b.delta(r)
	res := Queued
	coalesce := recFlags(val)&flagCoalesce != 0
	deadline := deadlineMs(val)
	if coalesce {
		co := tx.Bucket(bucketCoalesce)
		ck := coalesceKey(r, env.GetCoalesceKey())
		if v := co.Get(ck); len(v) >= 8 {
			old := seqOf(v)
			if old > seq { // old == seq: this message's own version, noted before its direct attempt (NoteVersion)
				b.counters.superseded++
				return Superseded, nil
			}
			if ov := recs.Get(seqKey(old)); ofRecipient(ov, r) {
				if err := s.removeRecord(tx, b, r, recs, old, ov); err != nil {
					return 0, err
				}
				res = Replaced
				b.counters.coalesced++
				b.edited = true
			}
		}
		if err := co.Put(ck, coalesceVal(seq, b.nowMs)); err != nil {
			return 0, err
		}
	}
	if deadline != 0 {
		if b.minDeadline == 0 || deadline < b.minDeadline {
			b.minDeadline = deadline
		}
		if err := tx.Bucket(bucketExpiry).Put(expiryKey(deadline, seq, r), nil); err != nil {
			return 0, err
		}
	}
	if err := recs.Put(seqKey(seq), val); err != nil {
		return 0, err
	}
	d.ev = append(d.ev, seqEvent{seq: seq})
	d.count++
	d.enqueued = true
	d.highWater = max(d.highWater, seq)
	b.counters.enqueued++
	return res, nil
}

// removeRecord deletes the queued record seq (value v) of recipient r and
// its index entries.
func (s *Store) removeRecord(tx *bolt.Tx, b *batch, r string, recs *bolt.Bucket, seq uint64, v []byte) error {
	if err := s.removeIndexes(tx, b, r, seq, v); err != nil {
		return err
	}
	if err := recs.Delete(seqKey(seq)); err != nil {
		return err
	}
	b.removed(r, seq)
	return nil
}

// removeRecordAt is removeRecord for the record under cursor c.
func (s *Store) removeRecordAt(tx *bolt.Tx, b *batch, r string, c *bolt.Cursor, seq uint64, v []byte) error {
	if err := s.removeIndexes(tx, b, r, seq, v); err != nil {
		return err
	}
	if err := c.Delete(); err != nil {
		return err
	}
	b.removed(r, seq)
	return nil
}

func (b *batch) removed(r string, seq uint64) {
	d := b.delta(r)
	d.ev = append(d.ev, seqEvent{seq: seq, gone: true})
	d.count--
}

// removeIndexes deletes the index entries of the queued record seq (value
// v) of recipient r.
func (s *Store) removeIndexes(tx *bolt.Tx, b *batch, r string, seq uint64, v []byte) error {
	if g := deadlineMs(v); g != 0 {
		if err := tx.Bucket(bucketExpiry).Delete(expiryKey(g, seq, r)); err != nil {
			return err
		}
	}
	if recFlags(v)&flagCoalesce != 0 {
		if sm, err := decodeRecord(v); err == nil {
			// The index entry stays, now pointing at nothing: it still
			// says which version is the newest, so an older one arriving
			// or replayed later is refused. Only its age is refreshed.
			co := tx.Bucket(bucketCoalesce)
			ck := coalesceKey(r, sm.GetEnvelope().GetCoalesceKey())
			if cv := co.Get(ck); len(cv) >= 8 && seqOf(cv) == seq {
				if err := co.Put(ck, coalesceVal(seq, b.nowMs)); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func coalesceKey(r, key string) []byte { return []byte(r + "\x00" + key) }

// coalesceVal is a coalesce index value: the newest version's sequence and
// when the entry last changed (elapsed ms), for pruning.
func coalesceVal(seq uint64, nowMs int64) []byte {
	var v [16]byte
	binary.BigEndian.PutUint64(v[:8], seq)
	binary.BigEndian.PutUint64(v[8:], uint64(nowMs))
	return v[:]
}

// expiryKey orders the expiry index by TTL deadline.
func expiryKey(deadline int64, seq uint64, r string) []byte {
	k := make([]byte, 16+len(r))
	binary.BigEndian.PutUint64(k[:8], uint64(deadline))
	binary.BigEndian.PutUint64(k[8:16], seq)
	copy(k[16:], r)
	return k
}

// queueFill is how full bbolt packs the records bucket's pages when a
// commit splits them. Records are keyed by sequence and appended at the
// end (a sequence committed late lands near the end too), so a page left
// behind takes no more records: at bbolt's default of a half every page a
// commit writes would stay half empty, and a commit would write twice the
// pages.
const queueFill = 1.0

// records returns the records bucket of tx, looked up once per
// transaction.
func (b *batch) records(tx *bolt.Tx) *bolt.Bucket {
	if b.recs == nil {
		b.recs = tx.Bucket(bucketRecords)
		b.recs.FillPercent = queueFill
	}
	return b.recs
}

// recordAt returns the record stored at seq, nil when there is none. It is
// recs.Get with one cursor for the whole batch: Get makes a cursor and
// grows its stack each call, three allocations for each message stored.
// Seek searches from the root each time, so what the batch wrote in
// between is found.
func (b *batch) recordAt(tx *bolt.Tx, seq uint64) []byte {
	if b.recCur == nil {
		b.recCur = b.records(tx).Cursor()
	}
	binary.BigEndian.PutUint64(b.key[:], seq)
	k, v := b.recCur.Seek(b.key[:])
	if k == nil || seqOf(k) != seq || len(k) != len(b.key) {
		return nil
	}
	return v
}

// encodeMessage encodes sm as a new queue record: its TTL deadline and
// whether it takes part in coalescing go into the record's header.
func encodeMessage(sm *pb.StoredMessage) ([]byte, error) {
	env := sm.GetEnvelope()
	var flags byte
	if env.GetConflict() == pb.Envelope_OVERWRITE && env.GetCoalesceKey() != "" {
		flags |= flagCoalesce
	}
	var deadline int64
	if t := env.GetTtlMs(); t > 0 {
		deadline = sm.GetCreatedElapsedMs() + t
	}
	return encodeRecord(sm, deadline, flags)
}

func encodeRecord(sm *pb.StoredMessage, deadline int64, flags byte) ([]byte, error) {
	r := sm.GetEnvelope().GetRecipient()
	if len(r) > maxRecipientLen {
		return nil, fmt.Errorf("recipient of %d bytes (at most %d)", len(r), maxRecipientLen)
	}
	if n, env, ok := storedSize(sm); ok {
		head := recordHeader(sm.GetCreatedElapsedMs(), deadline, flags, r, n)
		if out, ok := appendSized(head, sm, env); ok {
			return out, nil
		}
	}
	head := recordHeader(sm.GetCreatedElapsedMs(), deadline, flags, r, 0)
	buf := append(make([]byte, 0, len(head)+proto.Size(sm)), head...)
	// Size just filled the size cache of sm and every message in it.
	out, err := proto.MarshalOptions{UseCachedSize: true}.MarshalAppend(buf, sm)
	if err != nil {
		return nil, fmt.Errorf("marshal: %w", err)
	}
	return out, nil
}

// rewriteRecord returns record v with sm in place of its message, its
// header (and so its queue) unchanged.
func rewriteRecord(v []byte, sm *pb.StoredMessage) ([]byte, error) {
	head := v[:recHeaderLen(v)] // decodeRecord checked the length
	if out, ok := appendStored(append(make([]byte, 0, len(head)+len(v)), head...), sm); ok {
		return out, nil
	}
	out, err := proto.MarshalOptions{}.MarshalAppend(bytes.Clone(head), sm)
	if err != nil {
		return nil, fmt.Errorf("marshal: %w", err)
	}
	return out, nil
}

// recordHeader returns a queue record's header, with room for extra more
// bytes.
func recordHeader(created, deadline int64, flags byte, r string, extra int) []byte {
	head := make([]byte, recFixed, recFixed+len(r)+extra)
	binary.BigEndian.PutUint64(head[:8], uint64(created))
	binary.BigEndian.PutUint64(head[8:16], uint64(deadline))
	head[16] = flags
	binary.BigEndian.PutUint16(head[17:19], uint16(len(r)))
	return append(head, r...)
}

func decodeRecord(v []byte) (*pb.StoredMessage, error) {
	n := recHeaderLen(v)
	if n > len(v) {
		return nil, fmt.Errorf("%w: short queue record", ErrCorrupt)
	}
	sm, ok := decodeStored(v[n:])
	if !ok {
		sm = &pb.StoredMessage{}
		if err := proto.Unmarshal(v[n:], sm); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
	}
	if sm.Envelope == nil {
		sm.Envelope = &pb.Envelope{}
	}
	return sm, nil
}

// deadLetter moves the queued record seq (value v) of recipient r into the
// DLQ with reason.
func (s *Store) deadLetter(tx *bolt.Tx, b *batch, r string, recs *bolt.Bucket, seq uint64, v []byte, reason string, edit func(*pb.StoredMessage)) error {
	sm, err := decodeRecord(v)
	if err != nil {
		sm = &pb.StoredMessage{LastError: err.Error(), Envelope: &pb.Envelope{}}
		reason = "undecodable"
	}
	if sm.Envelope.GetRecipient() == "" {
		sm.Envelope.Recipient, sm.Envelope.Sequence = r, seq
	}
	if edit != nil {
		edit(sm)
	}
	if err := s.removeRecord(tx, b, r, recs, seq, v); err != nil {
		return err
	}
	return s.putDeadLetter(tx, b, sm, reason)
}

// putDeadLetter writes sm into the dead-letter queue with reason.
func (s *Store) putDeadLetter(tx *bolt.Tx, b *batch, sm *pb.StoredMessage, reason string) error {
	sm.DeadLetteredUnixMs = b.wallMs
	sm.DeadLetterReason = reason
	val, err := proto.Marshal(sm)
	if err != nil {
		return fmt.Errorf("%w: marshal dead letter: %w", ErrBadMessage, err)
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
	if isExpiredReason(reason) {
		b.counters.expired++
	}
	return nil
}
