package node_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/outbox"
	"github.com/meshnode/meshnode/partition"
	"github.com/meshnode/meshnode/transport"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// newNode builds (without starting a cluster around it) a node named name
// in dir with edit applied, closed at cleanup.
func newNode(tb testing.TB, name, dir string, edit func(*node.Config), join ...string) *node.Node {
	tb.Helper()
	return startNodeWith(tb, name, dir, edit, join...)
}

// fastRetries makes failures cheap to wait for, and MaxAttempts small so a
// message wrongly charged would reach the dead-letter queue quickly.
func fastRetries(c *node.Config) {
	c.Outbox.MaxAttempts = 3
	c.Relay.Backoff = partition.BackoffConfig{Base: 5 * time.Millisecond, Cap: 50 * time.Millisecond}
}

func deadLetters(tb testing.TB, n *node.Node) []outbox.DeadLetter {
	tb.Helper()
	dl, err := n.Outbox().DeadLetters(outbox.DLQFilter{Limit: 100000})
	if err != nil {
		tb.Fatal(err)
	}
	return dl
}

// With forwarding on, a reliable message must also fit with the origin a
// forwarder carries; one that fits only directly is refused saying so, and
// one that fits neither way is refused with the direct limit.
func TestTooLargeWithForwarding(t *testing.T) {
	n := newNode(t, "n1", t.TempDir(), func(c *node.Config) {
		c.Transport.MaxFrameSize = 4096
		c.Relay.Forward = partition.ForwardConfig{After: 2, Probe: time.Hour}
	})
	to := node.Addr("sink", "n2")
	var above error // the refusal of the smallest refused size
	size := 4096
	for ; size > 0; size -= 8 {
		_, err := n.TellReliable(ctxT(t), to, wrapperspb.String(strings.Repeat("X", size)))
		if err == nil {
			break
		}
		if !errors.Is(err, node.ErrTooLarge) {
			t.Fatalf("TellReliable(%d B) = %v, want ErrTooLarge", size, err)
		}
		above = err
	}
	if size <= 0 || above == nil {
		t.Fatalf("no size between 0 and 4096 B was accepted (last error %v)", above)
	}
	if !strings.Contains(above.Error(), "with its origin") {
		t.Fatalf("a message that fits only directly: %v, want the forwarded limit named", above)
	}
	_, err := n.TellReliable(ctxT(t), to, wrapperspb.String(strings.Repeat("X", 8192)))
	if !errors.Is(err, node.ErrTooLarge) || strings.Contains(err.Error(), "with its origin") {
		t.Fatalf("a message that fits neither way: %v, want ErrTooLarge with the direct limit", err)
	}
}

// A message larger than the wire allows is refused at the call, before
// anything is stored, by TellReliable and Dispatch alike.
func TestTooLargeRefusedBeforeStoring(t *testing.T) {
	n := newNode(t, "n1", t.TempDir(), func(c *node.Config) { c.Transport.MaxFrameSize = 4096 })
	big := wrapperspb.String(strings.Repeat("X", 8192))
	if _, err := n.TellReliable(ctxT(t), node.Addr("sink", "n2"), big); !errors.Is(err, node.ErrTooLarge) {
		t.Fatalf("TellReliable(8 KiB) = %v, want ErrTooLarge", err)
	}
	res, err := n.Dispatch(ctxT(t), []node.Address{node.Addr("a", "n2"), node.Addr("b", "n3")}, big)
	if err != nil || res.Accepted != 0 || res.Rejected != 2 || !errors.Is(res.Errors["a@n2"], node.ErrTooLarge) {
		t.Fatalf("Dispatch(8 KiB) = %+v, %v; want both rejected with ErrTooLarge", res, err)
	}
	if d := n.Outbox().Stats().Depth; d != 0 {
		t.Fatalf("outbox depth %d, want 0", d)
	}
}

// A stored message that no longer fits the wire (the frame limit was
// lowered across a restart) is dead-lettered alone; the healthy messages
// around it in the same emission are delivered, none charged for it.
func TestUnsendableMessageDeadLettersOnlyItself(t *testing.T) {
	dir := t.TempDir()
	n1 := newNode(t, "n1", filepath.Join(dir, "n1"), fastRetries)
	ctx := ctxT(t)
	to := node.Addr("sink", "n2")
	for _, v := range []string{"a", "b", strings.Repeat("X", 8192), "c"} {
		if out, err := n1.TellReliable(ctx, to, wrapperspb.String(v)); err != nil || out != node.Queued {
			t.Fatalf("TellReliable = %v, %v", out, err)
		}
	}
	if err := n1.Close(); err != nil {
		t.Fatal(err)
	}
	n1 = newNode(t, "n1", filepath.Join(dir, "n1"), func(c *node.Config) {
		fastRetries(c)
		c.Transport.MaxFrameSize = 4096
	})
	var s sink
	n2 := startNode(t, "n2", filepath.Join(dir, "n2"), n1.GossipAddr())
	if _, err := n2.Spawn("sink", s.handler); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, "outbox empty", func() bool { return n1.Outbox().Stats().Depth == 0 })
	if got := s.values(); strings.Join(got, ",") != "a,b,c" {
		t.Fatalf("delivered %v, want a,b,c", got)
	}
	dl := deadLetters(t, n1)
	if len(dl) != 1 || !strings.HasPrefix(dl[0].Reason, "rejected: cannot be sent") {
		t.Fatalf("dead letters %v, want only the big one, rejected as unsendable", dl)
	}
}

// A full local send queue is the sender's own congestion: it is deferred
// and the AIMD limit halves; nothing is charged. Here the count bound is
// smaller than an emission, and MaxAttempts is 3.
func TestFullSendQueueNeverCharged(t *testing.T) {
	dir := t.TempDir()
	n1 := newNode(t, "n1", filepath.Join(dir, "n1"), func(c *node.Config) {
		fastRetries(c)
		c.Transport.SendQueueSize = 4
	})
	ctx := ctxT(t)
	to := node.Addr("sink", "n2")
	for i := range 20 {
		if out, err := n1.TellReliable(ctx, to, wrapperspb.String(fmt.Sprint(i))); err != nil || out != node.Queued {
			t.Fatalf("TellReliable = %v, %v", out, err)
		}
	}
	var s sink
	n2 := startNode(t, "n2", filepath.Join(dir, "n2"), n1.GossipAddr())
	if _, err := n2.Spawn("sink", s.handler); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, "outbox empty", func() bool { return n1.Outbox().Stats().Depth == 0 })
	if got := s.values(); len(got) != 20 {
		t.Fatalf("delivered %d, want all 20 (dead letters: %v)", len(got), deadLetters(t, n1))
	}
}

// A Tell flood filling the send queue to a healthy peer never costs a
// reliable message an attempt.
func TestTellFloodNeverDeadLettersReliable(t *testing.T) {
	dir := t.TempDir()
	n1 := newNode(t, "n1", filepath.Join(dir, "n1"), func(c *node.Config) {
		fastRetries(c)
		c.Transport.SendQueueSize = 64
	})
	n2 := startNode(t, "n2", filepath.Join(dir, "n2"), n1.GossipAddr())
	waitAlive(t, []*node.Node{n1, n2}, 2)
	var s sink
	if _, err := n2.Spawn("sink", s.handler); err != nil {
		t.Fatal(err)
	}
	if _, err := n2.Spawn("flood", func(context.Context, *node.Message) (proto.Message, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	var full atomic.Int64
	var wg sync.WaitGroup
	payload := wrapperspb.Bytes(make([]byte, 128))
	for range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				var ce *node.CapacityError
				if err := n1.Tell(ctx, node.Addr("flood", "n2"), payload); errors.As(err, &ce) {
					full.Add(1)
				}
			}
		})
	}
	sent := 0
	for ; ctx.Err() == nil && sent < 300; sent++ {
		if _, err := n1.TellReliable(context.Background(), node.Addr("sink", "n2"), wrapperspb.String(fmt.Sprint(sent))); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	wg.Wait()
	testutil.WaitFor(t, 30*time.Second, "outbox empty", func() bool { return n1.Outbox().Stats().Depth == 0 })
	t.Logf("tells refused by the full queue: %d; reliable sent %d", full.Load(), sent)
	if dl := deadLetters(t, n1); len(dl) > 0 || len(s.values()) != sent {
		t.Fatalf("delivered %d of %d, %d dead-lettered: %v", len(s.values()), sent, len(dl), dl)
	}
}

// An application that spawns its actor late loses nothing within the
// receiver's SpawnGrace; past it, NO_SUCH_ACTOR counts.
func TestLateSpawn(t *testing.T) {
	t.Parallel() // mostly waits on real time: runs beside the other such tests
	t.Run("within grace", func(t *testing.T) {
		dir := t.TempDir()
		n1 := newNode(t, "n1", filepath.Join(dir, "n1"), fastRetries)
		n2 := startNode(t, "n2", filepath.Join(dir, "n2"), n1.GossipAddr())
		waitAlive(t, []*node.Node{n1, n2}, 2)
		for i := range 5 {
			if _, err := n1.TellReliable(ctxT(t), node.Addr("late", "n2"), wrapperspb.String(fmt.Sprint(i))); err != nil {
				t.Fatal(err)
			}
		}
		// Enough refusals to exhaust MaxAttempts many times over if counted.
		testutil.WaitFor(t, 10*time.Second, "refused a few times", func() bool { return n2.Stats().NoSuchActor >= 6 })
		var s sink
		if _, err := n2.Spawn("late", s.handler); err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, 30*time.Second, "outbox empty", func() bool { return n1.Outbox().Stats().Depth == 0 })
		if got := s.values(); strings.Join(got, ",") != "0,1,2,3,4" {
			t.Fatalf("delivered %v; dead letters %v", got, deadLetters(t, n1))
		}
	})
	t.Run("past grace", func(t *testing.T) {
		dir := t.TempDir()
		n1 := newNode(t, "n1", filepath.Join(dir, "n1"), fastRetries)
		n2 := newNode(t, "n2", filepath.Join(dir, "n2"), func(c *node.Config) { c.SpawnGrace = 0 }, n1.GossipAddr())
		waitAlive(t, []*node.Node{n1, n2}, 2)
		if _, err := n1.TellReliable(ctxT(t), node.Addr("nobody", "n2"), wrapperspb.String("x")); err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, 30*time.Second, "dead-lettered", func() bool { return len(deadLetters(t, n1)) == 1 })
		if r := deadLetters(t, n1)[0].Reason; !strings.HasPrefix(r, "max attempts: no such actor") {
			t.Fatalf("reason %q", r)
		}
	})
}

// The daemon's way: Open, spawn, then Start. Peers never see the node
// without its actors, so even with no grace nothing is refused.
func TestOpenSpawnStart(t *testing.T) {
	dir := t.TempDir()
	n1 := newNode(t, "n1", filepath.Join(dir, "n1"), fastRetries)
	if _, err := n1.TellReliable(ctxT(t), node.Addr("inbox", "n2"), wrapperspb.String("x")); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, "n2", filepath.Join(dir, "n2"))
	cfg.Join, cfg.SpawnGrace = []string{n1.GossipAddr()}, 0
	n2, err := node.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n2.Close() })
	if len(n2.Members()) != 0 || n2.GossipAddr() != "" {
		t.Fatal("an opened node is already in the cluster")
	}
	var s sink
	if _, err := n2.Spawn("inbox", s.handler); err != nil {
		t.Fatal(err)
	}
	if err := n2.Start(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	s.waitLen(t, 1)
	if n2.Stats().NoSuchActor != 0 {
		t.Fatal("a message was refused although the actor existed before the node was visible")
	}
}

// Item: a TTL runs out while the peer is down: the message is dead-lettered
// as expired (not kept until the peer returns); Replay with a new TTL sends
// it again, and a queue for a node that never existed can be dropped.
func TestTTLWhilePeerDownReplayAndDrop(t *testing.T) {
	dir := t.TempDir()
	n1 := newNode(t, "n1", filepath.Join(dir, "n1"), func(c *node.Config) {
		fastRetries(c)
		c.Outbox.MaxClockSkew = 100 * time.Millisecond
	})
	ctx := ctxT(t)
	if out, err := n1.TellReliable(ctx, node.Addr("orders", "edge9"), wrapperspb.String("99"), node.WithTTL(200*time.Millisecond)); err != nil || out != node.Queued {
		t.Fatalf("TellReliable = %v, %v", out, err)
	}
	if n1.Stats().UnknownPeer != 1 {
		t.Fatal("a send to a node nobody has seen was not counted")
	}
	testutil.WaitFor(t, 10*time.Second, "expired into the DLQ", func() bool { return len(deadLetters(t, n1)) == 1 })
	if dl := deadLetters(t, n1); dl[0].Reason != outbox.ReasonExpired {
		t.Fatalf("reason %q, want %q (never sent)", dl[0].Reason, outbox.ReasonExpired)
	}
	if _, err := n1.TellReliable(ctx, node.Addr("orders", "edge9"), wrapperspb.String("100")); err != nil {
		t.Fatal(err)
	}
	if n, err := n1.Outbox().DropQueue("edge9", "node edge9 does not exist"); err != nil || n != 1 {
		t.Fatalf("DropQueue = %d, %v", n, err)
	}
	if dl := deadLetters(t, n1); len(dl) != 2 || dl[1].Reason != "dropped: node edge9 does not exist"+outbox.OutcomeUnknownDropped {
		t.Fatalf("dead letters %v", dl)
	}
	if _, err := n1.TellReliable(ctx, node.Addr("x", "edge9"), wrapperspb.String("x"), node.WithTTL(-time.Second)); !errors.Is(err, node.ErrBadOption) {
		t.Fatalf("negative TTL: %v, want ErrBadOption", err)
	}
	if _, err := n1.TellReliable(ctx, node.Addr("x", "edge9"), wrapperspb.String("x"), node.WithTTL(365*24*time.Hour)); !errors.Is(err, node.ErrBadOption) {
		t.Fatalf("TTL of a year: %v, want ErrBadOption", err)
	}
	// The expired one comes back with a fresh TTL and reaches edge9 when it joins.
	if n, err := n1.Outbox().Replay(outbox.DLQFilter{Reason: "expired"}, outbox.ReplayTTL(time.Minute)); err != nil || n != 1 {
		t.Fatalf("Replay = %d, %v", n, err)
	}
	var s sink
	edge := startNode(t, "edge9", filepath.Join(dir, "edge9"), n1.GossipAddr())
	if _, err := edge.Spawn("orders", s.handler); err != nil {
		t.Fatal(err)
	}
	if got := s.waitLen(t, 1); got[0] != "99" {
		t.Fatalf("delivered %v", got)
	}
}

// A simulated crash (Kill) during delivery charges nothing: the relay stops
// before the connections, as in a real crash where nothing is recorded.
func TestKillChargesNoAttempts(t *testing.T) {
	t.Parallel() // mostly waits on real time: runs beside the other such tests
	dir := t.TempDir()
	// One attempt: anything charged would go straight to the DLQ.
	oneAttempt := func(c *node.Config) { fastRetries(c); c.Outbox.MaxAttempts = 1 }
	n1 := newNode(t, "n1", filepath.Join(dir, "n1"), oneAttempt)
	n2 := startNode(t, "n2", filepath.Join(dir, "n2"), n1.GossipAddr())
	waitAlive(t, []*node.Node{n1, n2}, 2)
	release := make(chan struct{})
	started := make(chan struct{}, 100)
	if _, err := n2.Spawn("slow", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		started <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil, errors.New("stopped")
	}); err != nil {
		t.Fatal(err)
	}
	defer close(release)
	for i := range 3 {
		if _, err := n1.TellReliable(context.Background(), node.Addr("slow", "n2"), wrapperspb.String(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	<-started
	if err := n1.Kill(); err != nil {
		t.Fatal(err)
	}
	n1 = newNode(t, "n1", filepath.Join(dir, "n1"), oneAttempt)
	if st := n1.Outbox().Stats(); st.Depth != 3 || st.DLQDepth != 0 {
		t.Fatalf("after the crash: depth %d, DLQ %d; want 3 queued, none dead", st.Depth, st.DLQDepth)
	}
}

// Sequences never go back, whatever the wall clock does: a sender restarted
// with its clock stepped back by years still has its new messages run (not
// answered DUPLICATE by a watermark from before), and a receiver restarted
// with its clock stepped forward by years keeps its watermarks.
func TestWallClockStepsOfYears(t *testing.T) {
	dir := t.TempDir()
	clk1 := outbox.NewManualClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	clk2 := outbox.NewManualClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	edit := func(clk *outbox.ManualClock) func(*node.Config) {
		return func(c *node.Config) { fastRetries(c); c.Outbox.Clock = clk }
	}
	n1 := newNode(t, "n1", filepath.Join(dir, "n1"), edit(clk1))
	n2 := newNode(t, "n2", filepath.Join(dir, "n2"), edit(clk2), n1.GossipAddr())
	waitAlive(t, []*node.Node{n1, n2}, 2)
	var s sink
	spawn := func(n *node.Node) {
		if _, err := n.Spawn("sink", s.handler); err != nil {
			t.Fatal(err)
		}
	}
	spawn(n2)
	send := func(v string, ttl time.Duration) {
		t.Helper()
		var opts []node.SendOption
		if ttl > 0 {
			opts = append(opts, node.WithTTL(ttl))
		}
		if _, err := n1.TellReliable(ctxT(t), node.Addr("sink", "n2"), wrapperspb.String(v), opts...); err != nil {
			t.Fatal(err)
		}
	}
	send("before", 0)
	s.waitLen(t, 1)
	for _, step := range []time.Duration{-10 * 365 * 24 * time.Hour, 10 * 365 * 24 * time.Hour} {
		if err := n1.Close(); err != nil {
			t.Fatal(err)
		}
		clk1.Step(step)
		n1 = newNode(t, "n1", filepath.Join(dir, "n1"), edit(clk1), n2.GossipAddr())
		waitAlive(t, []*node.Node{n1, n2}, 2)
		send(fmt.Sprintf("after %v", step), 48*time.Hour)
	}
	if err := n2.Close(); err != nil {
		t.Fatal(err)
	}
	clk2.Step(10 * 365 * 24 * time.Hour)
	n2 = newNode(t, "n2", filepath.Join(dir, "n2"), edit(clk2), n1.GossipAddr())
	spawn(n2)
	waitAlive(t, []*node.Node{n1, n2}, 2)
	send("after receiver step", 48*time.Hour)
	got := s.waitLen(t, 4)
	want := []string{"before", fmt.Sprintf("after %v", -10*365*24*time.Hour), fmt.Sprintf("after %v", 10*365*24*time.Hour), "after receiver step"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("delivered %q, want %q", got, want)
	}
	if dl := deadLetters(t, n1); len(dl) != 0 {
		t.Fatalf("dead letters %v: a clock step expired a message with a 48 h TTL", dl)
	}
}

// copyDir copies a data directory (a backup taken while the node is stopped).
func copyDir(tb testing.TB, from, to string) {
	tb.Helper()
	if err := os.MkdirAll(to, 0o700); err != nil {
		tb.Fatal(err)
	}
	entries, err := os.ReadDir(from)
	if err != nil {
		tb.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		src, err := os.Open(filepath.Join(from, e.Name()))
		if err != nil {
			tb.Fatal(err)
		}
		dst, err := os.OpenFile(filepath.Join(to, e.Name()), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
		if err != nil {
			tb.Fatal(err)
		}
		if _, err := io.Copy(dst, src); err != nil {
			tb.Fatal(err)
		}
		_ = src.Close()
		if err := dst.Close(); err != nil {
			tb.Fatal(err)
		}
	}
}

// A sender restored from a backup reuses sequences the receiver has seen
// for other messages. The receiver's watermark gives it away; the sender
// starts a new epoch of the stream and its messages run, none lost.
func TestRestoredSenderStartsANewEpoch(t *testing.T) {
	dir := t.TempDir()
	clk := clockNotSet() // with a clock, no sequence would go back
	edit := func(c *node.Config) { fastRetries(c); c.Outbox.SequenceBlock = 4; c.Outbox.Clock = clk }
	n2 := startNode(t, "n2", filepath.Join(dir, "n2"))
	var s sink
	if _, err := n2.Spawn("sink", s.handler); err != nil {
		t.Fatal(err)
	}
	n1 := newNode(t, "n1", filepath.Join(dir, "n1"), edit, n2.GossipAddr())
	waitAlive(t, []*node.Node{n1, n2}, 2)
	send := func(v string) {
		t.Helper()
		if _, err := n1.TellReliable(ctxT(t), node.Addr("sink", "n2"), wrapperspb.String(v)); err != nil {
			t.Fatal(err)
		}
	}
	send("a")
	s.waitLen(t, 1)
	if err := n1.Close(); err != nil {
		t.Fatal(err)
	}
	copyDir(t, filepath.Join(dir, "n1"), filepath.Join(dir, "backup"))
	n1 = newNode(t, "n1", filepath.Join(dir, "n1"), edit, n2.GossipAddr())
	waitAlive(t, []*node.Node{n1, n2}, 2)
	for _, v := range []string{"b", "c", "d", "e", "f", "g", "h", "i", "j"} {
		send(v)
	}
	s.waitLen(t, 10)
	if err := n1.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, "n1")); err != nil {
		t.Fatal(err)
	}
	copyDir(t, filepath.Join(dir, "backup"), filepath.Join(dir, "n1"))
	n1 = newNode(t, "n1", filepath.Join(dir, "n1"), edit, n2.GossipAddr())
	waitAlive(t, []*node.Node{n1, n2}, 2)
	for _, v := range []string{"x", "y", "z"} {
		send(v)
	}
	got := s.waitLen(t, 13)
	if strings.Join(got[10:], "") != "xyz" {
		t.Fatalf("after the restore delivered %v, want x y z", got[10:])
	}
	testutil.WaitFor(t, 10*time.Second, "outbox empty", func() bool { return n1.Outbox().Stats().Depth == 0 })
}

// A sender can hold a message that already ran and looks young to it: its
// receipt was lost and its clock undercounted a long downtime, or, as
// here, a backup from before the delivery was restored. If the receiver
// has meanwhile forgotten the stream (idle past its retention), the
// message is not run a second time: the receiver answers FORGOTTEN and
// the sender dead-letters it, outcome unknown. The stream carries on.
func TestForgottenStreamNeverRunsTwice(t *testing.T) {
	dir := t.TempDir()
	clk2 := outbox.NewAdjustableClock()
	n1 := newNode(t, "n1", filepath.Join(dir, "n1"), fastRetries)
	if out, err := n1.TellReliable(ctxT(t), node.Addr("sink", "n2"), wrapperspb.String("a")); err != nil || out != node.Queued {
		t.Fatalf("TellReliable to a node not up yet: %v, %v", out, err)
	}
	if err := n1.Close(); err != nil {
		t.Fatal(err)
	}
	copyDir(t, filepath.Join(dir, "n1"), filepath.Join(dir, "backup")) // "a" waits in it
	n2 := newNode(t, "n2", filepath.Join(dir, "n2"), func(c *node.Config) { c.Outbox.Clock = clk2 })
	var s sink
	if _, err := n2.Spawn("sink", s.handler); err != nil {
		t.Fatal(err)
	}
	n1 = newNode(t, "n1", filepath.Join(dir, "n1"), fastRetries, n2.GossipAddr())
	s.waitLen(t, 1)
	testutil.WaitFor(t, 10*time.Second, "a acked", func() bool { return n1.Outbox().Stats().Depth == 0 })
	if err := n1.Close(); err != nil {
		t.Fatal(err)
	}
	// A month passes on n2; a commit of its own prunes n1's idle stream.
	clk2.Advance(31 * 24 * time.Hour)
	if out, err := n2.TellReliable(ctxT(t), node.Addr("sink", "n2"), wrapperspb.String("local")); err != nil || out != node.Delivered {
		t.Fatalf("local TellReliable: %v, %v", out, err)
	}
	if n2.EvictIdleStreams(time.Hour) == 0 {
		t.Fatal("n1's stream stayed cached on n2")
	}
	if err := os.RemoveAll(filepath.Join(dir, "n1")); err != nil {
		t.Fatal(err)
	}
	copyDir(t, filepath.Join(dir, "backup"), filepath.Join(dir, "n1"))
	n1 = newNode(t, "n1", filepath.Join(dir, "n1"), fastRetries, n2.GossipAddr())
	testutil.WaitFor(t, 15*time.Second, "a given up", func() bool { return n1.Outbox().Stats().Depth == 0 })
	dl := deadLetters(t, n1)
	if len(dl) != 1 || dl[0].Reason != outbox.ReasonForgotten {
		t.Fatalf("dead letters %+v, want a with reason %q", dl, outbox.ReasonForgotten)
	}
	if _, err := n1.TellReliable(ctxT(t), node.Addr("sink", "n2"), wrapperspb.String("b")); err != nil {
		t.Fatal(err)
	}
	got := s.waitLen(t, 3)
	if strings.Join(got, ",") != "a,local,b" {
		t.Fatalf("sink ran %v, want a once, then local and b", got)
	}
	if st := n2.Stats(); st.Forgotten != 1 {
		t.Fatalf("n2 answered FORGOTTEN %d times, want 1", st.Forgotten)
	}
}

// fixtureTime is when testdata/v1-datadir was written by the first release
// (its dedupe window entries are measured from it).
var fixtureTime = time.Date(2026, 12, 1, 0, 40, 30, 0, time.UTC)

// A data directory written by the first release opens: its queued messages
// are delivered in order (the OVERWRITE pair already coalesced to the
// newer one), its dead letter stays, and the dedupe keys it had recorded
// still answer DUPLICATE.
func TestDataDirOfFirstReleaseIsMigrated(t *testing.T) {
	dir := t.TempDir()
	copyDir(t, "testdata/v1-datadir", filepath.Join(dir, "n1"))
	clk := outbox.NewManualClock(fixtureTime.Add(time.Minute))
	n1 := newNode(t, "n1", filepath.Join(dir, "n1"), func(c *node.Config) { fastRetries(c); c.Outbox.Clock = clk })
	if st := n1.Outbox().Stats(); st.Depth != 5 || st.DLQDepth != 1 {
		t.Fatalf("migrated outbox: depth %d, DLQ %d; want 5 and 1", st.Depth, st.DLQDepth)
	}
	var s sink
	n2 := startNode(t, "n2", filepath.Join(dir, "n2"), n1.GossipAddr())
	if _, err := n2.Spawn("sink", s.handler); err != nil {
		t.Fatal(err)
	}
	// n1 may have sent before the sink was spawned: answered "no such actor
	// yet, retry in a second", it waits that second on its outbox's clock,
	// which only the test moves.
	testutil.WaitFor(t, 15*time.Second, "sink has all messages", func() bool {
		if len(s.values()) >= 5 {
			return true
		}
		clk.Advance(100 * time.Millisecond)
		return false
	})
	if got := s.values(); strings.Join(got, ",") != "v1,v2,hb-new,v3,v4" {
		t.Fatalf("delivered %v", got)
	}
	dl := deadLetters(t, n1)
	if len(dl) != 1 || dl[0].Reason != "rejected: bad" {
		t.Fatalf("dead letters %v", dl)
	}
	// The old window recorded key paid-7 from n3 for actor sink on n1.
	var runs atomic.Int32
	if _, err := n1.Spawn("sink", func(context.Context, *node.Message) (proto.Message, error) { runs.Add(1); return nil, nil }); err != nil {
		t.Fatal(err)
	}
	var rs receipts
	env := streamEnv("sink", "n1", 1, 0)
	env.IdempotencyKey, env.Sender = "paid-7", "@n3"
	n1.DeliverIncoming(transport.PeerInfo{Name: "n3", OutboxID: [16]byte{3}}, env, rs.reply(env.GetMsgId()))
	testutil.WaitFor(t, 5*time.Second, "receipt", func() bool { return rs.len() == 1 })
	if c := rs.code(env.GetMsgId()); c != pb.Receipt_DUPLICATE || runs.Load() != 0 {
		t.Fatalf("key recorded by the first release: receipt %v, runs %d; want DUPLICATE, 0", c, runs.Load())
	}
}

// WithOverwrite and WithIdempotencyKey are two fields; an OVERWRITE message
// whose direct attempt timed out keeps its sequence, so a receiver never
// runs an older version after a newer one, nor one version twice.
func TestOverwriteVersionsNeverRunOutOfOrder(t *testing.T) {
	dir := t.TempDir()
	n1 := newNode(t, "n1", filepath.Join(dir, "n1"), func(c *node.Config) {
		fastRetries(c)
		c.Relay.DirectTimeout = 100 * time.Millisecond
	})
	n2 := startNode(t, "n2", filepath.Join(dir, "n2"), n1.GossipAddr())
	waitAlive(t, []*node.Node{n1, n2}, 2)
	var mu sync.Mutex
	var ran []string
	keys := map[string]string{}
	gate := make(chan struct{})
	if _, err := n2.Spawn("cfg", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		var v wrapperspb.StringValue
		if err := m.Decode(&v); err != nil {
			return nil, err
		}
		if v.GetValue() == "v1" {
			<-gate // slower than the direct attempt's timeout
		}
		mu.Lock()
		ran = append(ran, v.GetValue())
		keys[v.GetValue()] = m.IdempotencyKey()
		mu.Unlock()
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	to := node.Addr("cfg", "n2")
	if out, err := n1.TellReliable(ctxT(t), to, wrapperspb.String("v1"), node.WithOverwrite("config"), node.WithIdempotencyKey("k1")); err != nil || out != node.Queued {
		t.Fatalf("v1: %v, %v; want Queued after the direct attempt timed out", out, err)
	}
	if _, err := n1.TellReliable(ctxT(t), to, wrapperspb.String("v2"), node.WithOverwrite("config"), node.WithIdempotencyKey("k2")); err != nil {
		t.Fatal(err)
	}
	close(gate)
	testutil.WaitFor(t, 10*time.Second, "outbox empty", func() bool { return n1.Outbox().Stats().Depth == 0 })
	mu.Lock()
	defer mu.Unlock()
	for i, v := range ran {
		if v == "v1" && i > 0 || strings.Count(strings.Join(ran, ","), v) > 1 {
			t.Fatalf("ran %v: an older version after a newer one, or one twice", ran)
		}
	}
	if keys["v2"] != "k2" {
		t.Fatalf("idempotency key of v2 = %q: WithOverwrite overwrote it", keys["v2"])
	}
}

// Message.Attempt counts handler runs the sender knows of: 1 on the first
// (the direct attempt), 2 on the first retry after it failed.
func TestAttemptCountsHandlerRuns(t *testing.T) {
	dir := t.TempDir()
	n1 := newNode(t, "n1", filepath.Join(dir, "n1"), fastRetries)
	n2 := startNode(t, "n2", filepath.Join(dir, "n2"), n1.GossipAddr())
	waitAlive(t, []*node.Node{n1, n2}, 2)
	var mu sync.Mutex
	var attempts []int
	if _, err := n2.Spawn("twice", func(_ context.Context, m *node.Message) (proto.Message, error) {
		mu.Lock()
		defer mu.Unlock()
		attempts = append(attempts, m.Attempt())
		if len(attempts) < 3 {
			return nil, errors.New("not yet")
		}
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	if out, err := n1.TellReliable(ctxT(t), node.Addr("twice", "n2"), wrapperspb.String("x")); err != nil || out != node.Queued {
		t.Fatalf("TellReliable = %v, %v", out, err)
	}
	testutil.WaitFor(t, 10*time.Second, "delivered", func() bool { return n1.Outbox().Stats().Depth == 0 })
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(attempts) != "[1 2 3]" {
		t.Fatalf("attempts %v, want [1 2 3]", attempts)
	}
}
