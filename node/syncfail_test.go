package node_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/node"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// A node whose disk fails an outbox commit it had already written (the
// meta page's fsync) stops taking reliable messages that would have to
// wait: TellReliable says ErrStoreFailed, Outbox().Err and Stats say why,
// and nothing more is written. Restarted on the same file, it delivers
// what the file holds (a message whose commit failed included, when the
// file has it: its depth says so), in order and once.
func TestOutboxSyncFailureStopsUntilRestart(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "n1")
	syncErr := errors.New("fdatasync outbox.db: input/output error")
	var failing atomic.Bool
	defer faults.FailWrites(filepath.Join(dir, "outbox.db"), syncErr, func(meta bool) bool { return meta && failing.Load() })()

	n1, err := node.New(testConfig(t, "n1", dir))
	if err != nil {
		t.Fatal(err)
	}
	away := node.Addr("box", "away")
	if out, err := n1.TellReliable(ctxT(t), away, wrapperspb.String("m1")); err != nil || out != node.Queued {
		t.Fatalf("m1: %v %v, want Queued", out, err)
	}
	failing.Store(true)
	if _, err := n1.TellReliable(ctxT(t), away, wrapperspb.String("m2")); !errors.Is(err, node.ErrStoreFailed) || !errors.Is(err, syncErr) {
		t.Fatalf("m2, whose commit was written but not synced: %v, want ErrStoreFailed wrapping the disk's error", err)
	}
	failing.Store(false)
	if _, err := n1.TellReliable(ctxT(t), away, wrapperspb.String("m3")); !errors.Is(err, node.ErrStoreFailed) {
		t.Fatalf("m3, after the failure: %v, want ErrStoreFailed", err)
	}
	if err := n1.Outbox().Err(); !errors.Is(err, node.ErrStoreFailed) {
		t.Fatalf("Outbox().Err() = %v, want ErrStoreFailed", err)
	}
	// The commit that failed was m2's, or one of the node's own just
	// before it (m2 then never reached the file): the depth says which.
	st := n1.Outbox().Stats()
	if st.Failure == "" || st.Depth < 1 || st.Depth > 2 {
		t.Fatalf("Stats: failure %q, depth %d; want the failure said and depth 1 or 2", st.Failure, st.Depth)
	}
	want := []string{"m1", "m2"}[:st.Depth]
	t.Logf("depth at the failure %d: %s", st.Depth, st.Failure)
	if err := n1.Close(); err != nil {
		t.Logf("Close of the failed node: %v", err)
	}

	n1 = startNode(t, "n1", dir)
	if err := n1.Outbox().Err(); err != nil {
		t.Fatalf("Outbox().Err() after the restart: %v", err)
	}
	recv := startNode(t, "away", t.TempDir(), n1.GossipAddr())
	var s sink
	if _, err := recv.Spawn("box", s.handler); err != nil {
		t.Fatal(err)
	}
	if got := s.waitLen(t, len(want)); !slices.Equal(got, want) {
		t.Fatalf("delivered after the restart: %v, want %v", got, want)
	}
	testutil.WaitFor(t, 30*time.Second, "outbox empty", func() bool { return n1.Outbox().Stats().Depth == 0 })
	if got := s.values(); !slices.Equal(got, want) {
		t.Fatalf("delivered after the restart: %v, want %v once each", got, want)
	}
}

// A receiver whose store stopped (a failed sync) cannot make a watermark
// durable before it restarts, so it runs no reliable message meanwhile: a
// handler run then would run again after the restart. Its senders wait,
// uncounted, and after the restart every message runs once, in order.
func TestReceiverWithAFailedStoreRunsNothingTwice(t *testing.T) {
	t.Parallel() // mostly waits on real time: runs beside the other such tests
	for _, batched := range []bool{false, true} {
		t.Run(fmt.Sprint("batched=", batched), func(t *testing.T) { receiverWithAFailedStore(t, batched) })
	}
}

func receiverWithAFailedStore(t *testing.T, batched bool) {
	n1 := startNode(t, "n1", filepath.Join(t.TempDir(), "n1"))
	rxDir := filepath.Join(t.TempDir(), "rx")
	syncErr := errors.New("fdatasync outbox.db: input/output error")
	var failing atomic.Bool
	defer faults.FailWrites(filepath.Join(rxDir, "outbox.db"), syncErr, func(meta bool) bool { return meta && failing.Load() })()

	rx := startNode(t, "rx", rxDir, n1.GossipAddr())
	waitAlive(t, []*node.Node{n1, rx}, 2)
	var s sink
	spawn := func(rx *node.Node) {
		var opts []node.SpawnOption
		if batched {
			opts = append(opts, node.WithBatch(s.batch, 0))
		}
		if _, err := rx.Spawn("box", s.handler, opts...); err != nil {
			t.Fatal(err)
		}
	}
	spawn(rx)
	to := node.Addr("box", "rx")
	if _, err := n1.TellReliable(ctxT(t), to, wrapperspb.String("m1")); err != nil {
		t.Fatal(err)
	}
	s.waitLen(t, 1)
	testutil.WaitFor(t, 20*time.Second, "m1 acknowledged", func() bool { return n1.Outbox().Stats().Depth == 0 })

	failing.Store(true)
	if _, err := n1.TellReliable(ctxT(t), to, wrapperspb.String("m2")); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 20*time.Second, "rx's store to fail", func() bool { return rx.Outbox().Err() != nil })
	failing.Store(false)
	// m2 ran if its watermark's commit is the one that failed (the usual
	// case), not if another commit of rx failed first.
	out, err := n1.TellReliable(ctxT(t), to, wrapperspb.String("m3"))
	if err != nil || out != node.Queued {
		t.Fatalf("m3 to the receiver whose store failed: %v %v, want Queued (refused, not run)", out, err)
	}
	testutil.WaitFor(t, 20*time.Second, "rx to refuse a delivery while its store is failed", func() bool { return rx.Stats().StoreFailed > 0 })
	// Nor does it send reliably, even to a peer that could take it at once.
	if _, err := n1.Spawn("back", s.handler); err != nil {
		t.Fatal(err)
	}
	if _, err := rx.TellReliable(ctxT(t), node.Addr("back", "n1"), wrapperspb.String("back")); !errors.Is(err, node.ErrStoreFailed) {
		t.Fatalf("a reliable send from the node whose store failed: %v, want ErrStoreFailed", err)
	}
	if got := s.values(); !slices.Equal(got, []string{"m1", "m2"}) && !slices.Equal(got, []string{"m1"}) {
		t.Fatalf("ran before the restart: %v, want [m1 m2] or [m1]: nothing after the failure", got)
	}
	if err := rx.Close(); err != nil {
		t.Logf("close rx: %v", err)
	}

	rx = startNode(t, "rx", rxDir, n1.GossipAddr())
	spawn(rx)
	testutil.WaitFor(t, 30*time.Second, "the sender's outbox to empty", func() bool { return n1.Outbox().Stats().Depth == 0 })
	if got := s.values(); !slices.Equal(got, []string{"m1", "m2", "m3"}) {
		t.Fatalf("handler runs = %v, want [m1 m2 m3] once each", got)
	}
	if st := n1.Outbox().Stats(); st.DLQDepth != 0 {
		t.Fatalf("%d dead letters: the receiver's failed store dead-lettered a healthy message", st.DLQDepth)
	}
}

// batch is sink's handler for messages taken together (node.WithBatch).
func (s *sink) batch(ctx context.Context, msgs []*node.Message) (int, error) {
	for i, m := range msgs {
		if _, err := s.handler(ctx, m); err != nil {
			return i, err
		}
	}
	return len(msgs), nil
}
