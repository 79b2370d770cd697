package node_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/node"
)

// A reliable request to a daemon inbox (spawned as the daemon does, with
// WithApplied(inbox.Applied)): the inbox stored it, then the responder went
// down before its reply was stored (its disk refused the reply, kept only
// in memory, and the node stopped). When it comes back the requester sends
// the request again: the handler runs again, the inbox skips the copy, and
// the reply is made and stored. Had the inbox's record been taken as the
// watermark, the copy would be answered DUPLICATE without running: the
// request acknowledged and its reply never sent.
func TestRequestToAnInboxGetsItsReplyAfterTheResponderRestarts(t *testing.T) {
	dir := t.TempDir()
	var l heldLog
	n0 := startNode(t, "n0", filepath.Join(dir, "n0"))
	if _, err := n0.Spawn("rx", func(_ context.Context, m *node.Message) (proto.Message, error) {
		l.add(&l.replies, m.CorrelationID())
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	st := openBox(t, filepath.Join(dir, "inbox.db"))
	start1 := boxResponder(t, dir, n0, st)
	n1 := start1()
	storedThenRestarted(t, dir, n0, n1, st, start1, "A stored in the inbox and its reply refused", func() {
		if _, err := n0.TellReliable(ctxT(t), node.Addr("box", "n1"), wrapperspb.String("A"),
			node.WithReplyTo(node.Addr("rx", "n0")), node.WithCorrelationID("A")); err != nil {
			t.Fatal(err)
		}
	})
	testutil.WaitFor(t, 10*time.Second, "the reply to A at the requester (the request was acknowledged)", func() bool {
		_, replies := l.snapshot()
		return len(replies) == 1
	})
}
