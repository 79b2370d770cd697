package outbox

import (
	"bytes"
	"encoding/binary"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// The receiver's side of streams: one watermark per stream and the window
// of application idempotency keys. Both live in this file so that a
// watermark and the keys that took effect with it commit in one
// transaction. Memory holds neither: watermarks are read on demand (the
// node caches the streams in use) and keys are looked up on disk.

// StreamKey names a receiver's stream: (sender node, sender outbox id,
// epoch, recipient actor), length-prefixed so no two tuples share a key.
func StreamKey(senderNode string, outboxID [16]byte, epoch uint64, actor string) []byte {
	k := make([]byte, 0, 2+len(senderNode)+16+8+2+len(actor))
	k = binary.AppendUvarint(k, uint64(len(senderNode)))
	k = append(k, senderNode...)
	k = append(k, outboxID[:]...)
	k = binary.BigEndian.AppendUint64(k, epoch)
	k = binary.AppendUvarint(k, uint64(len(actor)))
	return append(k, actor...)
}

// ScopedKey names an application idempotency key in the receiver's window:
// keys are deduped per (sender node, recipient actor), length-prefixed so
// that no two pairs share a scope whatever characters names contain.
func ScopedKey(senderNode, actor, key string) []byte {
	k := make([]byte, 0, 4+len(senderNode)+len(actor)+len(key))
	k = binary.AppendUvarint(k, uint64(len(senderNode)))
	k = append(k, senderNode...)
	k = binary.AppendUvarint(k, uint64(len(actor)))
	k = append(k, actor...)
	return append(k, key...)
}

// senderOf returns the part of a StreamKey that names the sender side
// (sender node, outbox id, epoch), or nil if key is not a StreamKey.
func senderOf(key []byte) []byte {
	n, l := binary.Uvarint(key)
	if l <= 0 || n > uint64(len(key)) {
		return nil
	}
	end := l + int(n) + 16 + 8
	if end > len(key) {
		return nil
	}
	return key[:end]
}

// Watermark returns the persisted watermark of a stream: 0 when the stream
// has no record (a new stream, or one forgotten after StreamRetention).
// Then forgotten is the highest watermark among the forgotten streams of
// the same sender outbox and epoch (0 if none was): a message of the
// stream at or below it is older than what was forgotten, so it may have
// run before its stream was.
func (s *Store) Watermark(streamKey []byte) (w, forgotten uint64, err error) {
	r, err := s.StreamRecord(streamKey)
	return r.Watermark, r.Forgotten, err
}

// StreamRecord is what a receiver's store knows of one stream.
type StreamRecord struct {
	Watermark uint64 // as Watermark returns it
	Forgotten uint64 // as Watermark returns it
	// Digest is the digest of the message at the watermark (StreamCommit's),
	// 0 if none was recorded with it.
	Digest uint64
}

// StreamRecord returns a stream's watermark, with the forgotten horizon
// and the digest of the message at the watermark.
func (s *Store) StreamRecord(streamKey []byte) (StreamRecord, error) {
	var r StreamRecord
	if err := s.closedErr(); err != nil {
		return r, err
	}
	err := s.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketIn).Get(streamKey); len(v) == 16 {
			r.Watermark = binary.BigEndian.Uint64(v[:8])
			// Only the digest recorded with this very watermark: a release
			// before digests moves the watermark without one.
			if d := tx.Bucket(bucketInDigest).Get(streamKey); len(d) == 16 && bytes.Equal(d[:8], v[:8]) {
				r.Digest = binary.BigEndian.Uint64(d[8:])
			}
			return nil
		}
		if sender := senderOf(streamKey); sender != nil {
			if v := tx.Bucket(bucketForgot).Get(sender); len(v) == 8 {
				r.Forgotten = binary.BigEndian.Uint64(v)
			}
		}
		return nil
	})
	if err != nil {
		return StreamRecord{}, fmt.Errorf("outbox: watermark: %w", err)
	}
	return r, nil
}

// StreamCommit is one durable update of a receiver's stream: its new
// watermark and the application keys that took effect with it.
type StreamCommit struct {
	Stream    []byte   // StreamKey
	Watermark uint64   // the new watermark (never lower than the stored one)
	Digest    uint64   // of the message at Watermark (0: unknown); kept only if Watermark is stored
	Keys      [][]byte // ScopedKeys recorded with it
}

// CommitStream hands c to the next group commit and returns at once. The
// keys count as seen (KeySeen) from now on; done is called exactly once
// from the committer after the commit (nil: durable; else nothing of c was
// stored and its keys are forgotten), or at once with ErrClosed. done must
// not block: it holds up every later commit. CommitStream blocks only while
// the committer's queue is full.
func (s *Store) CommitStream(c *StreamCommit, done func(error)) {
	for _, k := range c.Keys {
		if len(k) > MaxKeyLen+600 {
			done(fmt.Errorf("outbox: commit stream: %w: key of %d bytes", ErrBadMessage, len(k)))
			return
		}
	}
	if len(c.Keys) > 0 {
		s.HoldKeys(c.Keys)
	}
	s.submitAsync(&op{kind: opStream, stream: c, async: done})
}

// KeySeen reports whether an application key was recorded within
// KeyWindow, or is being recorded (handed to CommitStream, not committed).
func (s *Store) KeySeen(scoped []byte) (bool, error) {
	s.kmu.Lock()
	_, pending := s.pendingKeys[string(scoped)]
	s.kmu.Unlock()
	if pending {
		return true, nil
	}
	if err := s.closedErr(); err != nil {
		return false, err
	}
	seen := false
	cutoff := s.clock.nowMs() - s.cfg.KeyWindow.Milliseconds()
	err := s.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketKeys).Get(scoped); len(v) == 8 {
			seen = int64(binary.BigEndian.Uint64(v)) > cutoff
		}
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("outbox: key seen: %w", err)
	}
	return seen, nil
}

// HoldKeys makes keys count as seen by KeySeen until ReleaseKeys, for a
// caller that gathers keys for a CommitStream it starts later (after the
// stream's commit under way): a key repeated in between is not missed.
func (s *Store) HoldKeys(keys [][]byte) {
	s.kmu.Lock()
	for _, k := range keys {
		s.pendingKeys[string(k)]++
	}
	s.kmu.Unlock()
}

// ReleaseKeys ends a HoldKeys of the same keys, once their CommitStream
// has ended (committed, the keys are on disk; failed, they are not
// recorded).
func (s *Store) ReleaseKeys(keys [][]byte) {
	s.kmu.Lock()
	s.releaseKeysLocked(keys)
	s.kmu.Unlock()
}

func (s *Store) releaseKeysLocked(keys [][]byte) {
	for _, k := range keys {
		if s.pendingKeys[string(k)]--; s.pendingKeys[string(k)] <= 0 {
			delete(s.pendingKeys, string(k))
		}
	}
}

// forgetPendingKeys drops the keys of committed (or failed) stream commits
// from the pending set: after a commit they are on disk, after a failure
// they are not recorded.
func (s *Store) forgetPendingKeys(ops []*op) {
	locked := false
	for _, o := range ops {
		if o.kind != opStream || len(o.stream.Keys) == 0 {
			continue
		}
		if !locked {
			s.kmu.Lock()
			locked = true
		}
		s.releaseKeysLocked(o.stream.Keys)
	}
	if locked {
		s.kmu.Unlock()
	}
}

func (s *Store) applyStream(tx *bolt.Tx, b *batch, c *StreamCommit) error {
	in := tx.Bucket(bucketIn)
	w := c.Watermark
	if v := in.Get(c.Stream); len(v) == 16 {
		w = max(w, binary.BigEndian.Uint64(v[:8])) // a watermark never goes back
	}
	var v [16]byte
	binary.BigEndian.PutUint64(v[:8], w)
	binary.BigEndian.PutUint64(v[8:], uint64(b.nowMs))
	if err := in.Put(c.Stream, v[:]); err != nil {
		return err
	}
	if w == c.Watermark {
		if err := putDigest(tx.Bucket(bucketInDigest), c.Stream, w, c.Digest); err != nil {
			return err
		}
	}
	keys, age := tx.Bucket(bucketKeys), tx.Bucket(bucketKeyAge)
	for _, k := range c.Keys {
		if old := keys.Get(k); len(old) == 8 {
			if err := age.Delete(append(bytes.Clone(old), k...)); err != nil {
				return err
			}
		}
		t := u64(uint64(b.nowMs))
		if err := keys.Put(k, t); err != nil {
			return err
		}
		if err := age.Put(append(t, k...), nil); err != nil {
			return err
		}
	}
	return nil
}

// putDigest records d as the digest of the message at stream's watermark
// w, or removes the record of an older one when d is unknown (0). The
// record names its watermark, so that one left behind by a release that
// moves watermarks without digests is not taken for the current one's.
func putDigest(bk *bolt.Bucket, stream []byte, w, d uint64) error {
	if d == 0 {
		return bk.Delete(stream)
	}
	var v [16]byte
	binary.BigEndian.PutUint64(v[:8], w)
	binary.BigEndian.PutUint64(v[8:], d)
	return bk.Put(stream, v[:])
}

// Housekeeping bounds: how many records one commit may prune or look at.
const (
	maxPrunePerCommit = 1024
	maxScanPerCommit  = 256
)

// housekeep prunes, a little in every commit, what has aged out: keys past
// KeyWindow, streams idle past StreamRetention, and coalesce entries that
// point at no queued message and are older than MaxAge. The scan positions
// (hkIn, hkCoalesce) are owned by the committer.
func (s *Store) housekeep(tx *bolt.Tx, b *batch) error {
	keys, age := tx.Bucket(bucketKeys), tx.Bucket(bucketKeyAge)
	cutoff := b.nowMs - s.cfg.KeyWindow.Milliseconds()
	c := age.Cursor()
	var old [][]byte
	for k, _ := c.First(); k != nil && len(old) < maxPrunePerCommit; k, _ = c.Next() {
		if len(k) < 8 || int64(seqOf(k)) > cutoff {
			break
		}
		old = append(old, bytes.Clone(k))
	}
	for _, k := range old {
		if err := age.Delete(k); err != nil {
			return err
		}
		if v := keys.Get(k[8:]); bytes.Equal(v, k[:8]) {
			if err := keys.Delete(k[8:]); err != nil {
				return err
			}
		}
	}
	var err error
	retain := b.nowMs - s.cfg.StreamRetention.Milliseconds()
	horizon := make(map[string]uint64) // sender part of a StreamKey -> highest watermark forgotten
	var forgot []ForgottenStream
	s.hkIn, err = pruneScan(tx.Bucket(bucketIn), s.hkIn, func(k, v []byte) bool {
		if len(v) != 16 || int64(binary.BigEndian.Uint64(v[8:])) >= retain {
			return false
		}
		w := binary.BigEndian.Uint64(v[:8])
		if sender := senderOf(k); sender != nil {
			horizon[string(sender)] = max(horizon[string(sender)], w)
		}
		forgot = append(forgot, ForgottenStream{Stream: bytes.Clone(k), Watermark: w})
		return true
	})
	if err != nil {
		return err
	}
	for _, f := range forgot {
		if err := tx.Bucket(bucketInDigest).Delete(f.Stream); err != nil {
			return err
		}
	}
	b.forgot = forgot
	if err := raiseHorizons(tx.Bucket(bucketForgot), horizon); err != nil {
		return err
	}
	maxAge := b.nowMs - s.cfg.MaxAge().Milliseconds()
	recs := b.records(tx)
	s.hkCoalesce, err = pruneScan(tx.Bucket(bucketCoalesce), s.hkCoalesce, func(k, v []byte) bool {
		if len(v) < 16 || int64(binary.BigEndian.Uint64(v[8:16])) >= maxAge {
			return false
		}
		r, _, _ := bytes.Cut(k, []byte{0})
		rec := recs.Get(v[:8])
		return rec == nil || !bytes.Equal(recRecipient(rec), r)
	})
	return err
}

// raiseHorizons records, per sender outbox and epoch, the highest
// watermark of the streams just forgotten. Sequences of one outbox grow
// with time across all its streams, so a message at or below the horizon
// was made before a message that ran at least StreamRetention ago: a
// receiver that no longer knows its stream cannot tell whether it ran, and
// refuses it rather than run it again. One record per sender outbox and
// epoch, never pruned: a few dozen bytes per peer ever seen.
func raiseHorizons(bk *bolt.Bucket, horizon map[string]uint64) error {
	for sender, w := range horizon {
		if v := bk.Get([]byte(sender)); len(v) == 8 && binary.BigEndian.Uint64(v) >= w {
			continue
		}
		if err := bk.Put([]byte(sender), u64(w)); err != nil {
			return err
		}
	}
	return nil
}

// pruneScan looks at up to maxScanPerCommit records of bk after pos,
// deletes those old reports true for, and returns where the next call
// resumes (nil: from the start).
func pruneScan(bk *bolt.Bucket, pos []byte, old func(k, v []byte) bool) ([]byte, error) {
	c := bk.Cursor()
	k, v := c.First()
	if pos != nil {
		k, v = c.Seek(pos)
	}
	var del [][]byte
	for i := 0; k != nil && i < maxScanPerCommit; i++ {
		if old(k, v) {
			del = append(del, bytes.Clone(k))
		}
		k, v = c.Next()
	}
	next := bytes.Clone(k)
	for _, d := range del {
		if err := bk.Delete(d); err != nil {
			return pos, err
		}
	}
	return next, nil
}
