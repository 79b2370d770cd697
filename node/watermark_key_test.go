package node_test

import (
	"path/filepath"
	"testing"

	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/outbox"
)

// The outbox promises that a receiver's watermark "is durable together
// with the keys that took effect with it (one transaction)". The owner
// stores the watermark (st.w.Store) before it registers the message's keys
// (afterDurable), and a stream's follow-up commit runs on its own
// goroutine and reads st.w when it starts: such a commit must not make
// watermark 7 durable without message 7's idempotency key. A crash then
// (before the next commit) would leave 7 covered by the watermark (its
// redelivery answered DUPLICATE, never run again) and its key unrecorded:
// the application's own retry under the same key, which the key window
// exists to catch, would run a second time.
// The interleaving is forced step by step (ForceCommitInterleaving); the
// scheduler produces it when the follow-up commit's goroutine runs in the
// owner's window between the two calls.
func TestWatermarkIsNeverDurableWithoutItsKey(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "r")
	n := newNode(t, "r", dir, func(*node.Config) {})
	id := node.StreamID{Node: "p", Outbox: [16]byte{'p', 1}, Actor: "a"}
	kb, kc := outbox.ScopedKey("p", "a", "key-6"), outbox.ScopedKey("p", "a", "key-7")
	if err := n.ForceCommitInterleaving(id, kb); err != nil {
		t.Fatal(err)
	}
	if err := n.Kill(); err != nil {
		t.Fatal(err)
	}
	s, err := outbox.Open(outbox.DefaultConfig(filepath.Join(dir, "outbox.db")))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	w, _, err := s.Watermark(outbox.StreamKey(id.Node, id.Outbox, id.Epoch, id.Actor))
	if err != nil {
		t.Fatal(err)
	}
	seen, err := s.KeySeen(kc)
	if err != nil {
		t.Fatal(err)
	}
	if w >= 7 && !seen {
		t.Fatalf("after the crash the watermark is %d (message 7 never runs again) but 7's key is not recorded: a retry under it runs twice", w)
	}
}
