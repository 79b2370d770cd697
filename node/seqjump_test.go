package node_test

import (
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/node"
)

// A sender whose outbox first ran with small sequences
// (a clock before 1970, as an older release's counter) has messages
// queued for a receiver that holds a small watermark; it restarts with a
// set clock (sequences ~2^51), then its clock jumps ten years ahead and
// back (sequences jump past the 4-byte offsets of the outbox's in-memory
// queue order), with restarts between. Every message runs once, in order.
func TestSequencesJumpingMidStreamLoseNothing(t *testing.T) {
	dir := t.TempDir()
	d1, d2 := filepath.Join(dir, "n1"), filepath.Join(dir, "n2")
	clk := clockNotSet()
	edit := func(cfg *node.Config) {
		fastRetries(cfg)
		cfg.Outbox.SequenceBlock, cfg.Outbox.Clock = 4, clk
	}
	var s sink
	n2 := newNode(t, "n2", d2, func(*node.Config) {})
	if _, err := n2.Spawn("sink", s.handler); err != nil {
		t.Fatal(err)
	}
	n1 := newNode(t, "n1", d1, edit, n2.GossipAddr())
	waitAlive(t, []*node.Node{n1, n2}, 2)
	var want []string
	k := 0
	send := func(n int) {
		t.Helper()
		for range n {
			v := fmt.Sprintf("m%03d", k)
			k++
			if _, err := n1.TellReliable(ctxT(t), node.Addr("sink", "n2"), wrapperspb.String(v)); err != nil {
				t.Fatal(err)
			}
			want = append(want, v)
		}
	}
	restart := func() {
		t.Helper()
		if err := n1.Close(); err != nil {
			t.Fatal(err)
		}
		n1 = newNode(t, "n1", d1, edit)
	}
	send(3)
	s.waitLen(t, 3) // the sink's watermark: 3
	if err := n2.Close(); err != nil {
		t.Fatal(err)
	}
	send(5)                                             // queued with small sequences
	clk.Step(time.Since(time.Unix(0, 0)) + 2*time.Hour) // the clock set
	restart()
	send(5)
	clk.Step(10 * 365 * 24 * time.Hour) // ten years ahead
	restart()
	send(5)
	clk.Step(-10 * 365 * 24 * time.Hour) // and back
	restart()
	send(5)
	n2 = newNode(t, "n2", d2, func(*node.Config) {}, n1.GossipAddr())
	if _, err := n2.Spawn("sink", s.handler); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 20*time.Second, "everything delivered", func() bool { return n1.Outbox().Stats().Depth == 0 })
	if got := s.values(); !slices.Equal(got, want) {
		t.Fatalf("sink ran %v, want %v", got, want)
	}
}
