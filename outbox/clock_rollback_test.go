package outbox_test

import (
	"encoding/binary"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/meshnode/meshnode/outbox"
)

// olderMeshnodeRuns does to the file what a meshnode that does not know the
// boot record does when it runs the store for d within the same boot:
// it resumes the elapsed clock on the wall rule and checkpoints it as
// [elapsed ms, wall ms] under "clock", ignoring (so keeping) "boot".
func olderMeshnodeRuns(tb testing.TB, path string, clk *outbox.ManualClock, d time.Duration) {
	tb.Helper()
	updateFile(tb, path, func(tx *bolt.Tx) error {
		meta := tx.Bucket([]byte("meta"))
		cp := meta.Get([]byte("clock"))
		last := int64(binary.BigEndian.Uint64(cp[:8]))
		lastWall := int64(binary.BigEndian.Uint64(cp[8:]))
		base := last + min(max(clk.Now().UnixMilli()-lastWall, 0), (24*time.Hour).Milliseconds()) // its open
		clk.Advance(d)                                                                            // it runs for d
		out := binary.BigEndian.AppendUint64(nil, uint64(base+d.Milliseconds()))
		out = binary.BigEndian.AppendUint64(out, uint64(clk.Now().UnixMilli()))
		return meta.Put([]byte("clock"), out) // its last checkpoint
	})
}

// updateFile runs fn in one bbolt write transaction on the store file at
// path (closed), as another program writing the file would.
func updateFile(tb testing.TB, path string, fn func(*bolt.Tx) error) {
	tb.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		tb.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(fn); err != nil {
		tb.Fatal(err)
	}
}

// Upgrade, roll back for 13 h, upgrade again, all within one boot: the
// older version leaves the boot record as it was and checkpoints the clock
// without it. Believed, the stale record would count the 13 h the older
// version already counted a second time, and an idempotency key recorded
// 13 h ago (KeyWindow 24 h) would be forgotten: a retry under it would run
// twice. A boot record names the checkpoint it goes with.
func TestRollbackWithinABootIsNotCountedTwice(t *testing.T) {
	e := open(t, nil)
	e.clk.Advance(time.Hour)
	key := outbox.ScopedKey("n1", "pay", "order-42")
	done := make(chan error, 1)
	e.CommitStream(&outbox.StreamCommit{Stream: []byte("s"), Watermark: 1, Keys: [][]byte{key}}, func(err error) { done <- err })
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	at := e.ElapsedMs()
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	olderMeshnodeRuns(t, e.path, e.clk, 13*time.Hour) // rolled back, same boot
	e.Store = mustOpen(t, config(e.path, e.clk, nil)) // upgraded again, moments later
	if got, want := time.Duration(e.ElapsedMs()-at)*time.Millisecond, 13*time.Hour; got != want {
		seen, _ := e.KeySeen(key)
		t.Errorf("13 h passed since the key was recorded, the elapsed clock counts %v (key still seen: %v)", got, seen)
	}
}
