package outbox

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/meshnode/meshnode/mailbox/pb"
)

// migrate converts a file of the first format to the current one, in the
// transaction that opens it (so a crash leaves it either old or new, never
// half):
//
//   - queue records get the new header, an absolute expiry becomes a TTL
//     counted from when the message was first stored, an OVERWRITE
//     message's key becomes its coalesce key, and the expiry, coalesce and
//     stream indexes are rebuilt (the coalesce index keeps the newest
//     versions already delivered);
//   - dead letters get the same envelope conversion;
//   - the receiver's dedupe keys become the new key window (those whose
//     scope names one sender and one actor unambiguously), so messages the
//     old version processed are still recognised when redelivered; keys
//     made for messages without an application key ("auto:…") are kept
//     too, for the same reason, and age out of the window;
//   - sequences keep their values: the next ones are reserved above them.
//
// The file gets a new outbox id, so receivers see new streams.
func (s *Store) migrate(tx *bolt.Tx) error {
	nowWall := s.cfg.Clock.Now().UnixMilli()
	nowMs := s.clock.nowMs()
	maxAge := s.cfg.MaxAge().Milliseconds()
	// elapsedAt maps an old wall-clock time to the elapsed clock, never
	// into the future and never further back than limit.
	elapsedAt := func(wallMs, limit int64) int64 {
		return nowMs - min(max(nowWall-wallMs, 0), limit)
	}
	q := tx.Bucket(bucketQueues)
	var names [][]byte
	if err := q.ForEachBucket(func(name []byte) error {
		names = append(names, bytes.Clone(name))
		return nil
	}); err != nil {
		return err
	}
	b := &batch{nowMs: nowMs, wallMs: nowWall, q: make(map[string]*qdelta)}
	// The old coalesce index (same keys, an 8-byte sequence) also names
	// the newest versions already delivered: kept, so an older version
	// (a dead letter, say) is still refused after the upgrade.
	type version struct {
		key []byte
		seq uint64
	}
	var versions []version
	if err := tx.Bucket(bucketCoalesce).ForEach(func(k, v []byte) error {
		if len(v) >= 8 {
			versions = append(versions, version{bytes.Clone(k), seqOf(v)})
		}
		return nil
	}); err != nil {
		return err
	}
	if err := tx.DeleteBucket(bucketCoalesce); err != nil {
		return err
	}
	if _, err := tx.CreateBucket(bucketCoalesce); err != nil {
		return err
	}
	for _, name := range names {
		r := string(name)
		old := q.Bucket(name)
		type rec struct {
			seq uint64
			sm  *pb.StoredMessage
		}
		var recs []rec
		if err := old.ForEach(func(k, v []byte) error {
			if len(k) != 8 || len(v) < 8 {
				return fmt.Errorf("%w: queue %s: short record", ErrCorrupt, r)
			}
			sm := &pb.StoredMessage{}
			if err := proto.Unmarshal(v[8:], sm); err != nil {
				return fmt.Errorf("%w: queue %s: %w", ErrCorrupt, r, err)
			}
			first := int64(binary.BigEndian.Uint64(v[:8]))
			if sm.FirstEnqueuedUnixMs == 0 {
				sm.FirstEnqueuedUnixMs = first
			}
			sm.CreatedElapsedMs = elapsedAt(first, maxAge)
			migrateEnvelope(sm)
			recs = append(recs, rec{seqOf(k), sm})
			return nil
		}); err != nil {
			return err
		}
		if err := q.DeleteBucket(name); err != nil {
			return err
		}
		for _, rc := range recs {
			rc.sm.Envelope.Recipient, rc.sm.Envelope.Sequence = r, rc.seq
			_, err := s.applyEnqueue(tx, b, rc.sm, nil)
			if errors.Is(err, ErrBadMessage) {
				// Its sequence taken by another queue's message (all
				// queues share one bucket now), or not storable: kept
				// where an operator sees it rather than failing Open.
				reason := "undecodable: " + err.Error()
				rc.sm.LastError = reason
				err = s.putDeadLetter(tx, b, rc.sm, reason)
			}
			if err != nil {
				return fmt.Errorf("queue %s: %w", r, err)
			}
		}
	}
	if err := tx.DeleteBucket(bucketQueues); err != nil {
		return err
	}
	s.dlqLen += b.dlq
	if err := s.finishQueues(tx, b); err != nil {
		return err
	}
	co := tx.Bucket(bucketCoalesce)
	for _, v := range versions {
		if cur := co.Get(v.key); len(cur) < 8 || seqOf(cur) < v.seq {
			if err := co.Put(v.key, coalesceVal(v.seq, nowMs)); err != nil {
				return err
			}
		}
	}
	dlq := tx.Bucket(bucketDLQ)
	if err := dlq.ForEach(func(k, v []byte) error {
		sm := &pb.StoredMessage{}
		if proto.Unmarshal(v, sm) != nil {
			return nil // left as it is: Purge can remove it by id
		}
		sm.CreatedElapsedMs = elapsedAt(sm.GetFirstEnqueuedUnixMs(), maxAge)
		migrateEnvelope(sm)
		val, err := proto.Marshal(sm)
		if err != nil {
			return err
		}
		return dlq.Put(k, val)
	}); err != nil {
		return err
	}
	return s.migrateDedupe(tx, elapsedAt)
}

// migrateEnvelope converts a stored envelope of protocol version 1.
func migrateEnvelope(sm *pb.StoredMessage) {
	env := sm.GetEnvelope()
	if env == nil {
		sm.Envelope = &pb.Envelope{}
		return
	}
	if expires := oldExpiry(env); expires > 0 {
		ttl := expires - sm.GetFirstEnqueuedUnixMs()
		env.TtlMs = max(ttl, 1) // an expired message stays expired
	}
	env.ProtoReflect().SetUnknown(nil)
	if env.GetConflict() == pb.Envelope_OVERWRITE && env.GetCoalesceKey() == "" {
		env.CoalesceKey, env.IdempotencyKey = env.GetIdempotencyKey(), ""
	}
	env.PrevSequence, env.Attempt, env.ProtocolVersion = 0, 0, pb.ProtocolVersion
}

// oldExpiry reads field 7 (expires_at_unix_ms of version 1), now an
// unknown field of Envelope.
func oldExpiry(env *pb.Envelope) int64 {
	b := env.ProtoReflect().GetUnknown()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0
		}
		b = b[n:]
		if num == 7 && typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return 0
			}
			return int64(v)
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return 0
		}
		b = b[n:]
	}
	return 0
}

// migrateDedupe moves the old dedupe window ("sender>actor" NUL key ->
// wall ms) into the key window and drops the old bucket. A scope with more
// than one '>' cannot be split with certainty and is dropped.
func (s *Store) migrateDedupe(tx *bolt.Tx, elapsedAt func(wallMs, limit int64) int64) error {
	old := tx.Bucket([]byte("dedupe"))
	if old == nil {
		return nil
	}
	keys, age := tx.Bucket(bucketKeys), tx.Bucket(bucketKeyAge)
	window := s.cfg.KeyWindow.Milliseconds()
	cutoff := s.clock.nowMs() - window
	if err := old.ForEach(func(k, v []byte) error {
		scope, key, ok := strings.Cut(string(k), "\x00")
		if !ok || len(v) != 8 || strings.Count(scope, ">") != 1 {
			return nil
		}
		node, actor, _ := strings.Cut(scope, ">")
		at := elapsedAt(int64(binary.BigEndian.Uint64(v)), window+1)
		if at <= cutoff {
			return nil
		}
		sk := ScopedKey(node, actor, key)
		if err := keys.Put(sk, u64(uint64(at))); err != nil {
			return err
		}
		return age.Put(append(u64(uint64(at)), sk...), nil)
	}); err != nil {
		return err
	}
	return tx.DeleteBucket([]byte("dedupe"))
}

// upgradeQueues moves the queues of a format 2 file (a bucket per
// recipient, records with a 17-byte header) into the records bucket (keyed
// by sequence, the recipient in each record's header), at most MaxBatch
// records per transaction: a large backlog needs no huge transaction, and
// the records it moves never need to be in memory at once. The first
// transaction sets format 3, so from then on an older meshnode refuses the
// file instead of missing the records already moved. Each record is
// deleted from its old queue in the transaction that writes it to the new
// bucket: a crash between two leaves every record in exactly one place,
// and the next Open goes on. A first-format file is left to load, which
// migrates it straight to format 3.
func (s *Store) upgradeQueues() error {
	todo := false
	_ = s.db.View(func(tx *bolt.Tx) error {
		todo = tx.Bucket(bucketMeta) != nil && tx.Bucket(bucketQueues) != nil
		return nil
	})
	if !todo {
		return nil // a new file, or one of format 3: no write, no fsync
	}
	moved, started := 0, time.Now()
	for {
		more := false
		err := s.db.Update(func(tx *bolt.Tx) error {
			meta, q := tx.Bucket(bucketMeta), tx.Bucket(bucketQueues)
			if meta == nil || q == nil {
				return nil // a new file, or nothing (left) to move
			}
			v := meta.Get(keyFormat)
			if len(v) != 8 {
				return nil // format 1: load migrates it
			}
			switch f := binary.BigEndian.Uint64(v); {
			case f > formatVersion:
				return nil // load refuses it
			case f < formatVersion:
				if err := meta.Put(keyFormat, u64(formatVersion)); err != nil {
					return err
				}
			}
			recs, err := tx.CreateBucketIfNotExists(bucketRecords)
			if err != nil {
				return err
			}
			recs.FillPercent = queueFill
			// Only dead letters use the batch, and only its wall clock: the
			// elapsed clock is not resumed before load.
			b := &batch{wallMs: s.cfg.Clock.Now().UnixMilli(), q: make(map[string]*qdelta)}
			n := 0
			var emptied [][]byte
			err = q.ForEachBucket(func(name []byte) error {
				if n >= s.cfg.MaxBatch {
					more = true
					return nil
				}
				old := q.Bucket(name)
				c := old.Cursor()
				k, v := c.First()
				for ; k != nil && n < s.cfg.MaxBatch; k, v = c.First() {
					if err := s.moveRecord(tx, b, recs, string(name), k, v); err != nil {
						return err
					}
					if err := c.Delete(); err != nil {
						return err
					}
					n++
				}
				if k == nil {
					emptied = append(emptied, bytes.Clone(name))
				} else {
					more = true
				}
				return nil
			})
			if err != nil {
				return err
			}
			for _, name := range emptied {
				if err := q.DeleteBucket(name); err != nil {
					return err
				}
			}
			if !more {
				if err := tx.DeleteBucket(bucketQueues); err != nil {
					return err
				}
			}
			moved += n
			return nil
		})
		if err != nil {
			return err
		}
		if !more {
			if moved > 0 {
				s.cfg.Logger.Info("outbox: moved the queued messages into the layout of format 3",
					"messages", moved, "took", time.Since(started).Round(time.Millisecond).String())
			}
			return nil
		}
		if moved%(100*s.cfg.MaxBatch) == 0 {
			s.cfg.Logger.Info("outbox: moving the queued messages into the layout of format 3", "moved", moved)
		}
	}
}

// moveRecord writes format 2's record v (key k) of recipient r into recs
// with the new header. A record too short to have a header, or whose
// sequence another queue's record already holds, goes to the dead-letter
// queue instead, where an operator sees it.
func (s *Store) moveRecord(tx *bolt.Tx, b *batch, recs *bolt.Bucket, r string, k, v []byte) error {
	const oldHeader = 17
	bad := ""
	switch {
	case len(k) != 8 || len(v) < oldHeader:
		bad = "undecodable: a record of format 2 too short for its header"
	case len(r) > maxRecipientLen:
		bad = fmt.Sprintf("undecodable: a queue of format 2 named by %d bytes (at most %d)", len(r), maxRecipientLen)
	case seqOf(k) > MaxSequence:
		bad = fmt.Sprintf("undecodable: sequence %d is above MaxSequence", seqOf(k))
	case recs.Get(k) != nil:
		bad = fmt.Sprintf("undecodable: sequence %d is also queued for %s", seqOf(k), recRecipient(recs.Get(k)))
	}
	if bad != "" {
		sm := &pb.StoredMessage{Envelope: &pb.Envelope{}}
		if len(v) >= oldHeader && proto.Unmarshal(v[oldHeader:], sm) != nil {
			sm = &pb.StoredMessage{Envelope: &pb.Envelope{}}
		}
		if sm.Envelope == nil {
			sm.Envelope = &pb.Envelope{}
		}
		if sm.Envelope.GetRecipient() == "" {
			sm.Envelope.Recipient, sm.Envelope.Sequence = r, seqOf(k)
		}
		sm.LastError = bad
		return s.putDeadLetter(tx, b, sm, bad)
	}
	val := recordHeader(createdMs(v), deadlineMs(v), v[16], r, len(v)-oldHeader)
	return recs.Put(k, append(val, v[oldHeader:]...))
}
