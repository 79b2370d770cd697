package node_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/node"
)

// The restored sender's burst starts at the receiver's watermark: x y z
// under 3 4 5, where c ran at 3. The sink (busy, mailbox of two,
// DropOldest) queues x and y, and z evicts x. The drop hook compares x
// with c's digest once it gets there (refuseForRoom, after the mailbox
// let go of x), held here until z ran and a commit ended after it (at
// most dropGateBound). Were the actor, freed meanwhile, to take y then,
// it would find it in order (prev 3 = w) and run it, then z: the
// watermark would be 5 when the hook looks, x no longer at it, and the
// hook would answer a plain refusal with z's watermark. No receipt of the
// emission would show another message at a watermark; y and z would be
// acked, and x, sent again below the watermark, answered DUPLICATE:
// never run. x must run, and before y.
func TestDroppedMessageAtTheWatermarkIsNotLostWhileItsSuccessorsRun(t *testing.T) {
	dir := t.TempDir()
	d1, d2 := filepath.Join(dir, "n1"), filepath.Join(dir, "n2")
	clk := clockNotSet()
	cfg := func(c *node.Config) { fastRetries(c); c.Outbox.SequenceBlock = 1; c.Outbox.Clock = clk }
	s := newHoldSink("hold")
	zRan := make(chan struct{})
	var zOnce sync.Once
	handler := func(ctx context.Context, m *node.Message) (proto.Message, error) {
		r, err := s.handler(ctx, m)
		var v wrapperspb.StringValue
		if m.Decode(&v) == nil && v.GetValue() == "z" {
			zOnce.Do(func() { close(zRan) })
		}
		return r, err
	}
	n2 := newNode(t, "n2", d2, func(*node.Config) {})
	if _, err := n2.Spawn("sink", handler); err != nil {
		t.Fatal(err)
	}
	n1 := newNode(t, "n1", d1, cfg, n2.GossipAddr())
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
	copyDir(t, filepath.Join(dir, "backup"), d1)
	n1 = newNode(t, "n1", d1, cfg)
	burst := []string{"x", "y", "z"}
	for _, v := range burst {
		if out := send(v); out != node.Queued {
			t.Fatalf("%s with its receiver down: %v, want Queued", v, out)
		}
	}

	// The hook goes on once z ran (its handler, still running then, has
	// not yet moved the watermark) and a commit ended after it: y's
	// watermark is durable by then.
	hookGo := make(chan struct{})
	gate := &dropGate{dropped: make(chan struct{}), wait: hookGo}
	waiterDone := make(chan struct{})
	go func() {
		defer close(waiterDone)
		defer close(hookGo)
		select {
		case <-zRan:
		case <-time.After(dropGateBound): // z cannot run while the hook is held
			return
		}
		base := n2.Outbox().Stats().Fsyncs
		testutil.Poll(5*time.Second, func() bool { return n2.Outbox().Stats().Fsyncs > base })
	}()
	t.Cleanup(func() { <-waiterDone })
	c2 := testConfig(t, "n2", d2)
	c2.Join = []string{n1.GossipAddr()}
	c2.Logger = slog.New(gate)
	n2, err := node.Open(c2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n2.Close() })
	released := false
	release := func() {
		if !released {
			released = true
			s.free("hold")
		}
	}
	t.Cleanup(release)
	if _, err := n2.Spawn("sink", handler, node.WithMailbox(2, mailbox.DropOldest)); err != nil {
		t.Fatal(err)
	}
	if err := n2.Tell(ctxT(t), node.Addr("sink", "n2"), wrapperspb.String("hold")); err != nil {
		t.Fatal(err)
	}
	<-s.started["hold"]
	if err := n2.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-gate.dropped:
	case <-time.After(15 * time.Second):
		t.Fatal("no message dropped")
	}
	release()
	testutil.WaitFor(t, 20*time.Second, "burst delivered", func() bool { return n1.Outbox().Stats().Depth == 0 })
	got := slices.DeleteFunc(s.values(), func(v string) bool { return v == "hold" })
	if want := append([]string{"a", "b", "c"}, burst...); !slices.Equal(got, want) {
		t.Fatalf("sink ran %v, want %v (n2 stats: diverged %d, dedupe hits %d, dropped %d, out of order %d; n1 restores %d, dead letters %d)",
			got, want, n2.Stats().Diverged, n2.Stats().DedupeHits, n2.Stats().Dropped, n2.Stats().OutOfOrder, n1.Outbox().Stats().Restores, len(deadLetters(t, n1)))
	}
}
