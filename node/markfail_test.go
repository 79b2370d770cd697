package node_test

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
)

// As TestDivergedMarkOutlivesTheStreamsEviction, but the disk refuses the
// commit of the diverged mark for a moment. The mark does not move the
// watermark, so its retry must be a commit of its own, and the stream must
// stay cached until it is on disk: x, of the emission answered DIVERGED,
// must not run in the old epoch once the stream is evicted and reloaded.
func TestDivergedMarkOutlivesAFailedCommit(t *testing.T) {
	dir := t.TempDir()
	n := newNode(t, "n1", dir, func(*node.Config) {})
	var mu sync.Mutex
	var ran []string
	gate, started := make(chan struct{}), make(chan struct{})
	if _, err := n.Spawn("sink", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		var v wrapperspb.StringValue
		if err := m.Envelope().GetBody().UnmarshalTo(&v); err != nil {
			return nil, err
		}
		if v.GetValue() == "slow" {
			close(started)
			<-gate
			return nil, nil
		}
		mu.Lock()
		ran = append(ran, v.GetValue())
		mu.Unlock()
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	msg := func(id string, epoch, seq, prev uint64, v string) *pb.Envelope {
		env := streamEnv("sink", "n1", seq, prev)
		env.MsgId, env.StreamEpoch, env.CreatedAtUnixMs = id, epoch, 1000
		body, err := anypb.New(wrapperspb.String(v))
		if err != nil {
			t.Fatal(err)
		}
		env.Body = body
		return env
	}
	var rs receipts
	if rc := rs.deliverWait(t, n, msg("a", 0, 1, 0, "a")); rc.GetCode() != pb.Receipt_PROCESSED {
		t.Fatalf("a: %v", rc.GetCode())
	}
	restore, hits := faults.FailCommits(filepath.Join(dir, "outbox.db"), errors.New("write outbox.db: no space left on device"))
	defer restore()
	n.DeliverIncoming(peerP, msg("w", 0, 1, 0, "w"), rs.reply("w"))
	n.DeliverIncoming(peerP, msg("slow", 99, 1, 0, "slow"), rs.reply("slow"))
	n.DeliverIncoming(peerP, msg("x", 0, 2, 1, "x"), rs.reply("x"))
	<-started
	if c := rs.code("w"); c != pb.Receipt_DIVERGED {
		t.Fatalf("w: %v, want DIVERGED", c)
	}
	testutil.WaitFor(t, 5*time.Second, "the mark's commit refused", func() bool { return hits() > 0 })
	restore() // the disk has room again
	testutil.WaitFor(t, 5*time.Second, "the diverged stream evicted", func() bool {
		return n.EvictIdleStreams(0) > 0
	})
	close(gate)
	testutil.WaitFor(t, 5*time.Second, "x's receipt", func() bool { return rs.len() == 4 })
	mu.Lock()
	defer mu.Unlock()
	if c := rs.code("x"); c != pb.Receipt_DIVERGED || slices.Contains(ran, "x") {
		t.Fatalf("x, sent after w in the emission answered DIVERGED: %v, sink ran %v (commits refused: %d); want DIVERGED and x not run (its sender sends it again in a new epoch)", c, ran, hits())
	}
}
