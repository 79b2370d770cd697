package node_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/node"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// A reliable send with idempotency key k reaches a daemon inbox (spawned
// as the daemon does): the inbox stores it, but the commit of its
// watermark and key does not reach the disk (refused here, as a crash
// would lose it) and the node stops. Back up, it gets the copy, which must
// run (the inbox skips it) so that k is recorded with its watermark; the
// application's retry under k is then a duplicate. Had the inbox's record
// been taken as the watermark, the copy would be answered DUPLICATE, k
// never recorded, and the retry stored a second time.
func TestKeyOfAMessageStoredBeforeACrashStillDedupes(t *testing.T) {
	dir := t.TempDir()
	n0 := startNode(t, "n0", filepath.Join(dir, "n0"))
	st := openBox(t, filepath.Join(dir, "inbox.db"))
	start1 := boxResponder(t, dir, n0, st)
	n1 := start1()
	storedThenRestarted(t, dir, n0, n1, st, start1, "the message stored and its watermark commit refused", func() {
		if _, err := n0.TellReliable(ctxT(t), node.Addr("box", "n1"), wrapperspb.String("order 7"), node.WithIdempotencyKey("k")); err != nil {
			t.Fatal(err)
		}
	})
	// The application's own retry, under the same key.
	if _, err := n0.TellReliable(ctxT(t), node.Addr("box", "n1"), wrapperspb.String("order 7"), node.WithIdempotencyKey("k")); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 20*time.Second, "the retry acknowledged", func() bool {
		return n0.Outbox().Stats().Depth == 0
	})
	if d := st.Stats()["box"].Depth; d != 1 {
		t.Fatalf("inbox holds %d messages for one key sent twice; want 1 (the key took effect with the first)", d)
	}
}
