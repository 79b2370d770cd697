package node_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/node"
)

// The restored sender's burst [w x y z] (under the sequences 2..5; the
// sink's watermark is 3, c's) meets, at its first emission, an actor busy
// with another message whose mailbox holds two and drops its oldest when
// full (WithMailbox(2, DropOldest)). w, below the durable watermark, is
// answered DUPLICATE at once; x (at the watermark, another message than
// c) and y are queued; z evicts x. The drop must compare x with the
// digest at the watermark, as a refusal for room does: answered with a
// plain CAPACITY, y, chained to x's sequence (3, the watermark), would
// run in the old epoch, and z behind it, before w and x in the new one.
// Every new message must run once, in order: a b c w x y z.
func TestRestoredBurstWhoseWatermarkMessageIsDroppedFromATwoPlaceMailboxRunsInOrder(t *testing.T) {
	restoredBurstMeetingATwoPlaceDropOldestMailbox(t, func(*node.Config) {}, func(*testing.T, *node.Node, *node.Node) {})
}

// The same, with the sender's DeliverTimeout shorter than the actor stays
// busy: the emission is judged (w's digest gives the restore away, a new
// epoch) while y and z, chained to the watermark's sequence, still wait in
// the old epoch's mailbox; they run there once the actor is free, and
// again in the new epoch. Every new message must run once.
func TestRestoredBurstWhoseWatermarkMessageIsDroppedRunsOnceWhenJudgedBeforeItRan(t *testing.T) {
	restoredBurstMeetingATwoPlaceDropOldestMailbox(t, func(c *node.Config) { c.Relay.DeliverTimeout = 300 * time.Millisecond },
		func(t *testing.T, n1, n2 *node.Node) {
			testutil.WaitFor(t, 15*time.Second, "the emission judged: a new epoch", func() bool { return n1.Outbox().Stats().Restores > 0 })
		})
}

// restoredBurstMeetingATwoPlaceDropOldestMailbox runs restoredBurst's
// burst [w x y z] into a sink busy with a local "hold" and spawned
// WithMailbox(2, DropOldest) before its node starts; edit changes the
// sender's configuration, whileHeld runs once a message was dropped,
// before the actor is released.
func restoredBurstMeetingATwoPlaceDropOldestMailbox(t *testing.T, edit func(*node.Config), whileHeld func(t *testing.T, n1, n2 *node.Node)) {
	s := newHoldSink("hold")
	burst := []string{"w", "x", "y", "z"}
	n1, d2 := restoredBurst(t, edit, func(n *node.Node) error { _, err := n.Spawn("sink", s.handler); return err }, &s.sink, burst, nil)

	n2, release := busyDropOldestReceiver(t, n1, d2, s, s.handler, nil)
	testutil.WaitFor(t, 15*time.Second, "the burst met the busy actor", func() bool {
		st := n2.Stats()
		return st.Dropped >= 1 || st.Diverged > 0 || st.OutOfOrder > 0
	})
	whileHeld(t, n1, n2)
	release()
	checkBurstRan(t, n1, n2, s, burst)
}

// busyDropOldestReceiver opens n2 on d2, joining n1, with its sink (run by
// handler, which records into s) spawned WithMailbox(2, DropOldest) and
// busy with a local "hold" before the node starts, so that a burst's first
// emission meets it (not the "no such actor" path); logger, when not nil,
// is the node's, and opts are added to the spawn's. release frees the
// hold; it also runs at cleanup, before n2's Close, which waits for the
// handler.
func busyDropOldestReceiver(t *testing.T, n1 *node.Node, d2 string, s *holdSink, handler node.Handler, logger *slog.Logger, opts ...node.SpawnOption) (n2 *node.Node, release func()) {
	t.Helper()
	cfg := testConfig(t, "n2", d2)
	cfg.Join = []string{n1.GossipAddr()}
	if logger != nil {
		cfg.Logger = logger
	}
	n2, err := node.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n2.Close() })
	release = func() { s.free("hold") }
	t.Cleanup(release)
	if _, err := n2.Spawn("sink", handler, append([]node.SpawnOption{node.WithMailbox(2, mailbox.DropOldest)}, opts...)...); err != nil {
		t.Fatal(err)
	}
	if err := n2.Tell(ctxT(t), node.Addr("sink", "n2"), wrapperspb.String("hold")); err != nil {
		t.Fatal(err)
	}
	<-s.started["hold"]
	if err := n2.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return n2, release
}

// checkBurstRan waits until n1's outbox is empty and fails unless the sink
// ran a, b, c and then burst, each once, and n1 dead-lettered nothing.
func checkBurstRan(t *testing.T, n1, n2 *node.Node, s *holdSink, burst []string) {
	t.Helper()
	testutil.WaitFor(t, 20*time.Second, "burst delivered", func() bool { return n1.Outbox().Stats().Depth == 0 })
	got := slices.DeleteFunc(s.values(), func(v string) bool { return v == "hold" })
	if want := append([]string{"a", "b", "c"}, burst...); !slices.Equal(got, want) {
		t.Fatalf("sink ran %v, want %v (n2 stats: diverged %d, dedupe hits %d, dropped %d, out of order %d; n1 restores %d, dead letters %d)",
			got, want, n2.Stats().Diverged, n2.Stats().DedupeHits, n2.Stats().Dropped, n2.Stats().OutOfOrder, n1.Outbox().Stats().Restores, len(deadLetters(t, n1)))
	}
	if dl := deadLetters(t, n1); len(dl) != 0 {
		t.Fatalf("dead letters %+v", dl)
	}
}

// A restored sender's burst starts at the receiver's watermark: a and b
// ran, the backup was taken (the whole data directory, on a clock that
// tells nothing), c ran (3, the watermark), and the restored outbox
// queues x y z under 3, 4, 5 while the receiver is down. The receiver
// comes back with its actor busy and a mailbox of two that drops its
// oldest: x and y are queued, z evicts x. Had the drop answered a plain
// CAPACITY, comparing nothing with c's digest, y, chained to 3, would run
// in the old epoch, and z; no receipt of the emission would speak of
// another message at a watermark, so the sender would ack y and z, and x,
// sent again alone below the watermark (now 5), would be a copy,
// DUPLICATE, acked, never run. x must run, in order.
func TestRestoredBurstStartingAtTheWatermarkWhoseFirstIsDroppedOldestRuns(t *testing.T) {
	s := newHoldSink("hold")
	burst := []string{"x", "y", "z"} // under c's sequence (the watermark) and two more
	n1, d2 := restoredAtTheWatermark(t, s, s.handler, burst)
	n2, release := busyDropOldestReceiver(t, n1, d2, s, s.handler, nil)
	testutil.WaitFor(t, 15*time.Second, "the burst met the busy actor", func() bool {
		st := n2.Stats()
		return st.Dropped >= 1 || st.Diverged > 0 || st.OutOfOrder > 0
	})
	release()
	checkBurstRan(t, n1, n2, s, burst)
}

// restoredAtTheWatermark runs a and b on n2's sink (run by handler, which
// records into s), backs up n1's whole data directory, runs c (the
// sink's watermark, 3), closes both nodes, restores the directory (on a
// clock that tells nothing, one sequence a block, so the restored outbox
// reuses c's sequence) and queues burst on n1 while n2 is down. It
// returns n1 and n2's data directory.
func restoredAtTheWatermark(t *testing.T, s *holdSink, handler node.Handler, burst []string) (n1 *node.Node, d2 string) {
	t.Helper()
	dir := t.TempDir()
	d1 := filepath.Join(dir, "n1")
	d2 = filepath.Join(dir, "n2")
	clk := clockNotSet()
	cfg := func(c *node.Config) { fastRetries(c); c.Outbox.SequenceBlock = 1; c.Outbox.Clock = clk }
	n2 := newNode(t, "n2", d2, func(*node.Config) {})
	if _, err := n2.Spawn("sink", handler); err != nil {
		t.Fatal(err)
	}
	n1 = newNode(t, "n1", d1, cfg, n2.GossipAddr())
	waitAlive(t, []*node.Node{n1, n2}, 2)
	send := func(v string) node.Outcome {
		t.Helper()
		out, err := n1.TellReliable(ctxT(t), node.Addr("sink", "n2"), wrapperspb.String(v))
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	send("a")
	send("b")
	s.waitLen(t, 2)
	testutil.WaitFor(t, 10*time.Second, "a, b acked", func() bool { return n1.Outbox().Stats().Depth == 0 })
	if err := n1.Close(); err != nil {
		t.Fatal(err)
	}
	copyDir(t, d1, filepath.Join(dir, "backup"))
	n1 = newNode(t, "n1", d1, cfg, n2.GossipAddr())
	waitAlive(t, []*node.Node{n1, n2}, 2)
	send("c")
	s.waitLen(t, 3)
	testutil.WaitFor(t, 10*time.Second, "c acked", func() bool { return n1.Outbox().Stats().Depth == 0 })
	for _, n := range []*node.Node{n1, n2} {
		if err := n.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.RemoveAll(d1); err != nil {
		t.Fatal(err)
	}
	copyDir(t, filepath.Join(dir, "backup"), d1) // the whole directory goes back to before c
	n1 = newNode(t, "n1", d1, cfg)
	for _, v := range burst {
		if out := send(v); out != node.Queued {
			t.Fatalf("%s with its receiver down: %v, want Queued", v, out)
		}
	}
	return n1, d2
}
