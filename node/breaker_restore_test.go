package node_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/node"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// A sender restored from a backup whose first new message reuses exactly
// the sequence the receiver's watermark stands at. The receiver answers
// DUPLICATE with watermark == that sequence; judge's restore test
// (watermark > max(seen, top)) counts the message itself as "emitted", so
// the answer is taken as a positive receipt: TellReliable returns
// Delivered for "x", whose handler never ran. An acknowledged message is
// lost. (Here the restored stream's watermark is one message past the
// backup: the sender sent one message after the backup was taken.)
func TestBreakerRestoredSenderFirstSequenceCollidesWithWatermark(t *testing.T) {
	dir := t.TempDir()
	edit := func(c *node.Config) { fastRetries(c); c.Outbox.SequenceBlock = 4 }
	n2 := startNode(t, "n2", filepath.Join(dir, "n2"))
	var s sink
	if _, err := n2.Spawn("sink", s.handler); err != nil {
		t.Fatal(err)
	}
	n1 := newNode(t, "n1", filepath.Join(dir, "n1"), edit, n2.GossipAddr())
	waitAlive(t, []*node.Node{n1, n2}, 2)
	send := func(n *node.Node, v string) node.Outcome {
		t.Helper()
		out, err := n.TellReliable(ctxT(t), node.Addr("sink", "n2"), wrapperspb.String(v))
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	send(n1, "a")
	s.waitLen(t, 1)
	if err := n1.Close(); err != nil {
		t.Fatal(err)
	}
	copyDir(t, filepath.Join(dir, "n1"), filepath.Join(dir, "backup"))
	n1 = newNode(t, "n1", filepath.Join(dir, "n1"), edit, n2.GossipAddr())
	waitAlive(t, []*node.Node{n1, n2}, 2)
	send(n1, "b") // the one message after the backup
	s.waitLen(t, 2)
	if err := n1.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, "n1")); err != nil {
		t.Fatal(err)
	}
	copyDir(t, filepath.Join(dir, "backup"), filepath.Join(dir, "n1"))
	n1 = newNode(t, "n1", filepath.Join(dir, "n1"), edit, n2.GossipAddr())
	waitAlive(t, []*node.Node{n1, n2}, 2)
	out := send(n1, "x")
	if out == node.Delivered {
		// Delivered means x's handler returned nil: it must be there now.
		if got := s.values(); len(got) < 3 || got[2] != "x" {
			t.Fatalf("TellReliable(x) = Delivered after a restore, but the receiver ran only %v: x was acknowledged and lost", got)
		}
	}
	got := s.waitLen(t, 3)
	if strings.Join(got[2:], "") != "x" {
		t.Fatalf("after the restore delivered %v, want x", got[2:])
	}
	testutil.WaitFor(t, 10*time.Second, "outbox empty", func() bool { return n1.Outbox().Stats().Depth == 0 })
}

// The same blind spot for an emission of several messages: a restored
// sender whose queued messages reuse sequences the receiver ran (b, c, d
// were sent after the backup) and that emits them together with one more.
// Every DUPLICATE carries watermark = d's sequence, which is below the
// emission's top, so judge takes them as positive: x, y and z are acked
// and never run; only u (chained after the watermark) runs, before its
// predecessors x, y, z (which never run). Three acknowledged messages
// lost, none dead-lettered, and the stream's order broken.
//
// Note for a fix: calling a DUPLICATE on a message never on the wire
// before (sequence above seen, no idempotency key) a restore catches x,
// but process() then stops acking, and u, which ran (PROCESSED) in the
// old epoch, is sent again in the new one and runs twice; later PROCESSED
// receipts of a restored emission need acking too.
func TestBreakerRestoredSenderEmissionHidesRestore(t *testing.T) {
	dir := t.TempDir()
	edit := func(c *node.Config) { fastRetries(c); c.Outbox.SequenceBlock = 4 }
	var s sink
	startN2 := func(join ...string) *node.Node {
		n2 := newNode(t, "n2", filepath.Join(dir, "n2"), func(*node.Config) {}, join...)
		if _, err := n2.Spawn("sink", s.handler); err != nil {
			t.Fatal(err)
		}
		return n2
	}
	n2 := startN2()
	n1 := newNode(t, "n1", filepath.Join(dir, "n1"), edit, n2.GossipAddr())
	waitAlive(t, []*node.Node{n1, n2}, 2)
	send := func(n *node.Node, v string) {
		t.Helper()
		if _, err := n.TellReliable(ctxT(t), node.Addr("sink", "n2"), wrapperspb.String(v)); err != nil {
			t.Fatal(err)
		}
	}
	send(n1, "a")
	s.waitLen(t, 1)
	if err := n1.Close(); err != nil {
		t.Fatal(err)
	}
	copyDir(t, filepath.Join(dir, "n1"), filepath.Join(dir, "backup"))
	n1 = newNode(t, "n1", filepath.Join(dir, "n1"), edit, n2.GossipAddr())
	waitAlive(t, []*node.Node{n1, n2}, 2)
	for _, v := range []string{"b", "c", "d"} {
		send(n1, v)
	}
	s.waitLen(t, 4)
	if err := n1.Close(); err != nil {
		t.Fatal(err)
	}
	if err := n2.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, "n1")); err != nil {
		t.Fatal(err)
	}
	copyDir(t, filepath.Join(dir, "backup"), filepath.Join(dir, "n1"))
	// The restored sender queues four messages while its receiver is down.
	n1 = newNode(t, "n1", filepath.Join(dir, "n1"), edit)
	for _, v := range []string{"x", "y", "z", "u"} {
		send(n1, v)
	}
	n2 = startN2(n1.GossipAddr())
	waitAlive(t, []*node.Node{n1, n2}, 2)
	testutil.WaitFor(t, 15*time.Second, "outbox empty", func() bool { return n1.Outbox().Stats().Depth == 0 })
	if dl := deadLetters(t, n1); len(dl) != 0 {
		t.Fatalf("dead letters: %+v", dl)
	}
	// Everything left the outbox acknowledged: all four must have run.
	if got := s.values(); strings.Join(got[4:], "") != "xyzu" {
		t.Fatalf("the restored sender's x y z u were all acknowledged, but the receiver ran %v after a b c d", got[4:])
	}
}
