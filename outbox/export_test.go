package outbox

import (
	"time"

	bolt "go.etcd.io/bbolt"
)

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

// TxWrites returns what bbolt's write transactions wrote so far: pages, and
// the time spent writing them and the meta page (with their fsyncs).
func (s *Store) TxWrites() (pages int64, writeTime time.Duration) {
	st := s.db.Stats()
	return st.TxStats.GetPageCount(), st.TxStats.GetWriteTime()
}
