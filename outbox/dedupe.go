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

// Seen reports whether (sender, key) was recorded within DedupeWindow. It
// reads only memory (the map is loaded from the file at Open).
func (s *Store) Seen(sender, key string) bool {
	if key == "" {
		return false
	}
	s.dmu.RLock()
	ms, ok := s.dedupe[dedupeKey(sender, key)]
	s.dmu.RUnlock()
	if ok && ms >= s.cfg.Now().Add(-s.cfg.DedupeWindow).UnixMilli() {
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
	o := &op{kind: opRecord, key: dedupeKey(sender, key)}
	if err := s.submit(ctx, o); err != nil {
		return fmt.Errorf("outbox: record: %w", err)
	}
	return o.err
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
