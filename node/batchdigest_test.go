package node_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
)

// A batch runs two messages of one stream (2 and 3). The first one's
// watermark starts a commit at once, and the next commit (watermark 3)
// fails, the disk full from then on: the durable state is watermark 2,
// which must be on disk with 2's digest. A restored sender's new message
// under sequence 2 is then found out (DIVERGED) rather than taken for a
// copy and dropped, with a batch handler as with a plain one.
func TestEveryWatermarkOfABatchIsCommittedWithItsDigest(t *testing.T) {
	for _, batch := range []bool{false, true} {
		name := "handler"
		if batch {
			name = "batch handler"
		}
		t.Run(name, func(t *testing.T) { batchDigest(t, batch) })
	}
}

func batchDigest(t *testing.T, batch bool) {
	dir := filepath.Join(t.TempDir(), "n1")
	gate, started := make(chan struct{}), make(chan struct{})
	first := true
	h := func(ctx context.Context, m *node.Message) (proto.Message, error) {
		if first {
			first = false
			close(started)
			<-gate
		}
		return nil, nil
	}
	spawn := func(n *node.Node, block bool) {
		t.Helper()
		hh := h
		if !block {
			hh = func(context.Context, *node.Message) (proto.Message, error) { return nil, nil }
		}
		var opts []node.SpawnOption
		if batch {
			opts = append(opts, node.WithBatch(func(ctx context.Context, msgs []*node.Message) (int, error) {
				for i, m := range msgs {
					if _, err := hh(ctx, m); err != nil {
						return i, err
					}
				}
				return len(msgs), nil
			}, 16))
		}
		if _, err := n.Spawn("sink", hh, opts...); err != nil {
			t.Fatal(err)
		}
	}
	n := newNode(t, "n1", dir, func(*node.Config) {})
	spawn(n, true)
	var rs receipts
	restore := func() {}
	defer func() { restore() }()
	other := stringEnv(t, 1, 0, "a") // another stream of p's (epoch 7): blocks the actor
	other.StreamEpoch = 7
	n.DeliverIncoming(peerP, other, rs.reply("a-1"))
	<-started
	// 2 and 3 wait in the mailbox behind it: one batch (or two handler runs).
	n.DeliverIncoming(peerP, stringEnv(t, 2, 0, "b"), func(rc *pb.Receipt) {
		// On the committer, after the commit that made watermark 2
		// durable and before the next one: the disk fills up now.
		restore, _ = faults.FailCommits(filepath.Join(dir, "outbox.db"), errors.New("write outbox.db: no space left on device"))
		rs.reply("b-2")(rc)
	})
	n.DeliverIncoming(peerP, stringEnv(t, 3, 2, "c"), rs.reply("c-3"))
	close(gate)
	testutil.WaitFor(t, 10*time.Second, "receipts of 1, 2, 3", func() bool { return rs.len() == 3 })
	t.Logf("receipts: a %v, b %v, c %v", rs.code("a-1"), rs.code("b-2"), rs.code("c-3"))
	if c := rs.code("b-2"); c != pb.Receipt_PROCESSED {
		t.Fatalf("2: %v", c)
	}
	_ = n.Close()
	restore()

	n = newNode(t, "n1", dir, func(*node.Config) {})
	spawn(n, false)
	x := stringEnv(t, 2, 0, "x") // a restored sender's new message under sequence 2
	rc := rs.deliverWait(t, n, x)
	if rc.GetCode() != pb.Receipt_DIVERGED {
		t.Fatalf("another message under the durable watermark's sequence 2: %v (watermark %d), want DIVERGED: it is acked unrun and lost",
			rc.GetCode(), rc.GetWatermark())
	}
}
