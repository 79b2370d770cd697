package outbox

import (
	"context"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// maxPrunePerCommit bounds how many expired dedupe keys one commit deletes,
// so pruning never makes a single transaction large.
const maxPrunePerCommit = 4096

func dedupeKey(sender, key string) string { return sender + "\x00" + key }

// Seen reports whether (sender, key) was recorded within DedupeWindow, or
// is being recorded by RecordAsync (pending its commit). It reads only
// memory (the map is loaded from the file at Open).
func (s *Store) Seen(sender, key string) bool {
	if key == "" {
		return false
	}
	dk := dedupeKey(sender, key)
	s.dmu.RLock()
	ms, ok := s.dedupe[dk]
	_, pending := s.pendingKeys[dk]
	s.dmu.RUnlock()
	if pending || ok && ms >= s.cfg.Now().Add(-s.cfg.DedupeWindow).UnixMilli() {
		s.dedupeHits.Add(1)
		return true
	}
	return false
}

// Record durably remembers (sender, key) for DedupeWindow. Call it only
// after the handler succeeded (rule 6), so a retry after a failure is never
// swallowed as a duplicate. It is group-committed; old keys are pruned.
func (s *Store) Record(ctx context.Context, sender, key string) error {
	if key == "" {
		return nil
	}
	if len(sender)+len(key) > MaxKeyLen {
		return fmt.Errorf("outbox: record: key of %d bytes (max %d): %w", len(sender)+len(key), MaxKeyLen, ErrBadKey)
	}
	o := &op{kind: opRecord, key: dedupeKey(sender, key)}
	if err := s.submit(ctx, o); err != nil {
		return fmt.Errorf("outbox: record: %w", err)
	}
	return o.err
}

// RecordAsync is Record without waiting: the key joins the next group
// commit and Seen reports it at once (pending), so a copy that arrives
// before the commit is a duplicate, not a second run of the handler. done
// is called exactly once, from the committer goroutine after the commit
// (nil: durable; else the key was not stored and Seen forgets it), or
// synchronously with ErrClosed if the store is closed. done must not block:
// it holds up every later commit. An empty key calls done(nil) at once.
// RecordAsync itself blocks only while the committer's queue is full.
func (s *Store) RecordAsync(sender, key string, done func(error)) {
	if done == nil {
		done = func(error) {}
	}
	if key == "" {
		done(nil)
		return
	}
	if len(sender)+len(key) > MaxKeyLen {
		done(fmt.Errorf("outbox: record: key of %d bytes (max %d): %w", len(sender)+len(key), MaxKeyLen, ErrBadKey))
		return
	}
	dk := dedupeKey(sender, key)
	o := &op{kind: opRecord, key: dk, async: done}
	// asyncMu (read) keeps Close from closing s.closing between the check
	// and the send, so an op that made it into s.ops is always committed
	// by the committer's final drain and its done always runs.
	s.asyncMu.RLock()
	defer s.asyncMu.RUnlock()
	if s.closedErr() != nil {
		done(fmt.Errorf("outbox: record: %w", ErrClosed))
		return
	}
	s.dmu.Lock()
	s.pendingKeys[dk]++
	s.dmu.Unlock()
	s.ops <- o // the committer runs until s.closing, which needs asyncMu
}

// pruneDedupe deletes keys older than the window, at most every tenth of the
// window and only in commits the committer runs anyway.
func (s *Store) pruneDedupe(tx *bolt.Tx, b *batch) error {
	s.dmu.RLock()
	due := b.now.Sub(s.lastPrune) >= s.cfg.DedupeWindow/10
	var old []string
	if due {
		cutoff := b.nowMs - s.cfg.DedupeWindow.Milliseconds()
		for k, ms := range s.dedupe {
			if ms < cutoff {
				old = append(old, k)
				if len(old) >= maxPrunePerCommit {
					break
				}
			}
		}
	}
	s.dmu.RUnlock()
	if !due {
		return nil
	}
	bk := tx.Bucket(bucketDedupe)
	for _, k := range old {
		if _, fresh := b.dedupe[k]; fresh {
			continue
		}
		if err := bk.Delete([]byte(k)); err != nil {
			return fmt.Errorf("prune dedupe: %w", err)
		}
	}
	b.pruned = old
	b.pruneRan = true
	return nil
}
