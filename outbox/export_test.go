package outbox

import bolt "go.etcd.io/bbolt"

// QueuedOps returns how many operations wait for the committer. Tests use
// it to know that callers have queued up behind a stalled committer.
func QueuedOps(s *Store) int { return len(s.ops) }

// BucketStats returns bbolt's statistics of a top-level bucket ("in",
// "keys", "keyage", "q", ...), for tests that count records on disk.
func BucketStats(s *Store, name string) (st bolt.BucketStats, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket([]byte(name)); b != nil {
			st = b.Stats()
		}
		return nil
	})
	return st, err
}
