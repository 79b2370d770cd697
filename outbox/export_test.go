package outbox

import (
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// QueuedOps returns how many operations wait for the committer. Tests use
// it to know that callers have queued up behind a stalled committer.
func QueuedOps(s *Store) int { return len(s.ops) }

// BucketStats returns bbolt's statistics of a top-level bucket ("in",
// "keys", "keyage", "m", ...), for tests that count records on disk.
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

// Stall blocks the committer until release is called: it hands it a
// CommitStream whose done callback waits, which the committer calls after
// its commit. Operations submitted meanwhile queue up and are committed
// together after release, which is how the tests build a backlog at a
// known point. Cleanup releases it if the test did not.
func Stall(tb testing.TB, s *Store) (release func()) {
	tb.Helper()
	in, out := make(chan struct{}), make(chan struct{})
	s.CommitStream(&StreamCommit{Stream: []byte("stall"), Watermark: 1}, func(error) {
		close(in)
		<-out
	})
	select {
	case <-in:
	case <-time.After(10 * time.Second):
		tb.Fatal("committer did not reach the stalling callback")
	}
	var once sync.Once
	release = func() { once.Do(func() { close(out) }) }
	tb.Cleanup(release)
	return release
}
