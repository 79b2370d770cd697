package node_test

import (
	"context"
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/outbox"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// A receiver whose disk refuses writes cannot make its watermark durable,
// so it cannot say PROCESSED. That is the receiver's trouble, not the
// message's: the sender must wait (uncounted) rather than count it toward
// MaxAttempts and dead-letter a healthy message whose handler succeeded.
// Once the disk takes writes again, the message is delivered and nothing
// is in the dead-letter queue.
func TestReceiverDiskFullDoesNotDeadLetterHealthyMessages(t *testing.T) {
	dirs := [2]string{filepath.Join(t.TempDir(), "n0"), filepath.Join(t.TempDir(), "n1")}
	n0 := startNodeWith(t, "n0", dirs[0], func(cfg *node.Config) {
		cfg.Outbox.MaxAttempts = 2 // two counted failures and the message is poison
	})
	n1 := startNode(t, "n1", dirs[1], n0.GossipAddr())
	waitAlive(t, []*node.Node{n0, n1}, 2)
	var ran atomic.Int64
	to, err := n1.Spawn("w", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		ran.Add(1)
		return nil, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	restore, hits := faults.FailCommits(filepath.Join(dirs[1], "outbox.db"), errors.New("write outbox.db: no space left on device"))
	defer restore()

	out, err := n0.TellReliable(context.Background(), to, wrapperspb.String("healthy"))
	if err != nil {
		t.Fatal(err)
	}
	if out == node.DeadLettered {
		t.Fatal("dead-lettered on the first attempt")
	}
	// Several attempts meet the full disk (the handler runs once; later
	// copies are recognised from the watermark in memory).
	testutil.WaitFor(t, 30*time.Second, "three refused watermark commits at the receiver (or a dead letter)", func() bool {
		return hits() >= 3 || n0.Outbox().Stats().DLQDepth > 0
	})
	if st := n0.Outbox().Stats(); st.DLQDepth != 0 {
		reason := ""
		if dl, err := n0.Outbox().DeadLetters(outbox.DLQFilter{}); err == nil && len(dl) > 0 {
			reason = dl[0].Reason
		}
		t.Fatalf("the receiver's full disk dead-lettered a healthy message: %d dead letters (%q)", st.DLQDepth, reason)
	}
	restore()
	testutil.WaitFor(t, 60*time.Second, "the message to be delivered once the disk takes writes", func() bool {
		return n0.Outbox().Stats().Depth == 0
	})
	if st := n0.Outbox().Stats(); st.DLQDepth != 0 || st.Delivered != 1 {
		t.Fatalf("after the disk recovered: %d dead letters, %d delivered; want 0 and 1", st.DLQDepth, st.Delivered)
	}
	if ran.Load() < 1 {
		t.Fatal("the handler never ran")
	}
}
