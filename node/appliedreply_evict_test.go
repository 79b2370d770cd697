package node_test

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
)

// A reliable request to a daemon inbox (spawned as the daemon does,
// WithApplied) is stored; its reply meets a full disk and is kept for the
// request's next copy (the watermark does not move). The next copy comes
// after the stream left the node's cache (10 idle minutes; evicted here at
// once). Reloaded, the stream must still run the copy, so that the kept
// reply is stored: what the inbox applied is reported to the sender, not
// taken as the watermark (taken, the copy was answered DUPLICATE and the
// reply never sent).
func TestKeptReplyOfAnInboxRequestSurvivesEviction(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "n1")
	n := startNode(t, "n1", dir)
	st := openBox(t, filepath.Join(t.TempDir(), "inbox.db"))
	spawnBox(t, n, st)
	restore, _ := faults.FailCommits(filepath.Join(dir, "outbox.db"), errors.New("write outbox.db: no space left on device"))
	defer restore()
	var rs receipts
	copyOf := func(id string) pb.Receipt_Code {
		t.Helper()
		env := streamEnv("box", "n1", 1, 0)
		env.MsgId = id
		env.Rpc = &pb.RpcMeta{Kind: pb.RpcMeta_REQUEST, ReplyTo: "rx@p", CorrelationId: "c1"}
		return rs.deliverWait(t, n, env).GetCode()
	}
	if c := copyOf("copy-0"); c != pb.Receipt_CAPACITY || node.HeldReplies(n) != 1 || st.Stats()["box"].Depth != 1 {
		t.Fatalf("first copy: %v, %d replies kept, inbox depth %d; want CAPACITY, 1, 1", c, node.HeldReplies(n), st.Stats()["box"].Depth)
	}
	restore()
	testutil.WaitFor(t, 5*time.Second, "the idle stream evicted", func() bool { return n.EvictIdleStreams(0) > 0 })
	c := copyOf("copy-1")
	if c != pb.Receipt_PROCESSED || node.HeldReplies(n) != 0 || n.Outbox().Stats().Depth != 1 {
		t.Fatalf("copy after eviction: %v, %d replies still kept, %d replies stored; want PROCESSED, 0, 1 (the kept reply stored for the requester)",
			c, node.HeldReplies(n), n.Outbox().Stats().Depth)
	}
}
