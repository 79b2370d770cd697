package node_test

import (
	"errors"
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
