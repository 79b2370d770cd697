package outbox

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/meshnode/meshnode/mailbox/pb"
)

// migrate converts a file of the first format, in the transaction that
// opens it (so a crash leaves it either old or new, never half):
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
			if _, err := s.applyEnqueue(tx, b, rc.sm, nil); err != nil {
				return fmt.Errorf("queue %s: %w", r, err)
			}
		}
	}
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
