package node_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/partition"
)

// A message within this node's frame limit but over the recipient's
// (nodes configured apart) is dead-lettered at once with a reason that says
// so, and the messages behind it on its stream go on; a tell or an ask of
// it fails with ErrTooLarge. Before, it was sent, the recipient closed the
// connection, and the stream stopped behind it for good.
func TestMessageTooLargeForTheRecipientsNode(t *testing.T) {
	dir := t.TempDir()
	n1 := newNode(t, "n1", filepath.Join(dir, "n1"), func(c *node.Config) {
		fastRetries(c)
		c.Transport.MaxFrameSize = 8 << 20
		c.Transport.MaxReadBytes = 64 << 20
	})
	n2 := startNode(t, "n2", filepath.Join(dir, "n2"), n1.GossipAddr()) // 4 MiB frames
	waitAlive(t, []*node.Node{n1, n2}, 2)
	var s sink
	if _, err := n2.Spawn("sink", s.handler); err != nil {
		t.Fatal(err)
	}
	to := node.Addr("sink", "n2")
	big := wrapperspb.String(strings.Repeat("x", 5<<20))
	out, err := n1.TellReliable(ctxT(t), to, big)
	if err != nil || out != node.DeadLettered {
		t.Fatalf("TellReliable of 5 MiB to a node of 4 MiB frames = %v, %v; want DeadLettered", out, err)
	}
	for i, v := range []string{"a", "b", "c"} {
		if out, err := n1.TellReliable(ctxT(t), to, wrapperspb.String(v)); err != nil || out != node.Delivered {
			t.Fatalf("message %d behind it = %v, %v; want Delivered", i, out, err)
		}
	}
	if got := strings.Join(s.values(), ","); got != "a,b,c" {
		t.Fatalf("delivered %q", got)
	}
	dl := deadLetters(t, n1)
	if len(dl) != 1 || !strings.Contains(dl[0].Reason, "frame limit the recipient's node announced") {
		t.Fatalf("dead letters %+v, want the large message, said too large for the recipient's node", dl)
	}
	if err := n1.Tell(ctxT(t), to, big); !errors.Is(err, node.ErrTooLarge) {
		t.Fatalf("Tell = %v, want ErrTooLarge", err)
	}
	if err := n1.Ask(ctxT(t), to, big, nil); !errors.Is(err, node.ErrTooLarge) {
		t.Fatalf("Ask = %v, want ErrTooLarge", err)
	}
	if err := n1.Tell(ctxT(t), to, wrapperspb.String("d")); err != nil {
		t.Fatal(err)
	}
	s.waitLen(t, 4)
}

// On a connection made before the call, nothing shows that the limit it
// announced is still the peer's (it may have restarted in place with
// another): a lone message over it waits, uncounted, until the connection
// has outlived MaxIdleTimeout since (keep-alives would have replaced it),
// and is then dead-lettered; the messages behind it go on.
func TestMessageTooLargeOnAnOlderConnectionIsConfirmedFirst(t *testing.T) {
	dir := t.TempDir()
	n1 := newNode(t, "n1", filepath.Join(dir, "n1"), func(c *node.Config) {
		c.Outbox.MaxAttempts = 1 // an attempt counted would dead-letter it at once
		c.Relay.Backoff = partition.BackoffConfig{Base: 5 * time.Millisecond, Cap: 50 * time.Millisecond}
		c.Transport.MaxFrameSize = 8 << 20
		c.Transport.MaxReadBytes = 64 << 20
		c.Transport.KeepAlivePeriod, c.Transport.MaxIdleTimeout = 300*time.Millisecond, 2*time.Second
	})
	n2 := startNode(t, "n2", filepath.Join(dir, "n2"), n1.GossipAddr())
	waitAlive(t, []*node.Node{n1, n2}, 2)
	var s sink
	if _, err := n2.Spawn("sink", s.handler); err != nil {
		t.Fatal(err)
	}
	to := node.Addr("sink", "n2")
	if err := n1.Tell(ctxT(t), to, wrapperspb.String("first")); err != nil { // the connection
		t.Fatal(err)
	}
	s.waitLen(t, 1)
	start := time.Now()
	out, err := n1.TellReliable(ctxT(t), to, wrapperspb.String(strings.Repeat("x", 5<<20)))
	if err != nil || out != node.Queued {
		t.Fatalf("TellReliable = %v, %v; want Queued (not yet confirmed too large)", out, err)
	}
	if _, err := n1.TellReliable(ctxT(t), to, wrapperspb.String("behind")); err != nil {
		t.Fatal(err)
	}
	got := s.waitLen(t, 2)
	if got[1] != "behind" {
		t.Fatalf("delivered %v", got)
	}
	testutil.WaitFor(t, 15*time.Second, "the large message dead-lettered", func() bool { return len(deadLetters(t, n1)) == 1 })
	if r := deadLetters(t, n1)[0].Reason; !strings.HasPrefix(r, "rejected: cannot be sent") {
		t.Fatalf("dead-letter reason %q", r)
	}
	t.Logf("dead-lettered after %v", time.Since(start))
}

// A reply too large for the requester's frames (but not for ours) comes
// back as an error reply saying so, as one too large for ours does,
// instead of being dead-lettered here with the requester hearing nothing.
func TestReplyTooLargeForTheRequestersFrames(t *testing.T) {
	dir := t.TempDir()
	n1 := newNode(t, "n1", filepath.Join(dir, "n1"), func(c *node.Config) {
		fastRetries(c)
		c.Transport.MaxFrameSize = 8 << 10
	})
	n2 := startNode(t, "n2", filepath.Join(dir, "n2"), n1.GossipAddr())
	waitAlive(t, []*node.Node{n1, n2}, 2)
	if _, err := n2.Spawn("big", func(context.Context, *node.Message) (proto.Message, error) {
		return wrapperspb.String(strings.Repeat("r", 16<<10)), nil
	}); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	if _, err := n1.Spawn("replies", func(_ context.Context, m *node.Message) (proto.Message, error) {
		got <- m.ReplyError()
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := n1.TellReliable(ctxT(t), node.Addr("big", "n2"), wrapperspb.String("q"), node.WithReplyTo(node.Addr("replies", "n1"))); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err == nil || !strings.Contains(err.Error(), "reply too large") {
			t.Fatalf("reply error %v, want one saying the reply is too large", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("no reply at the requester; n2 dead letters: %v", deadLetterReasons(t, n2))
	}
}

// An ask whose reply is too large for the asker's frames ends at once
// with an error saying so, not at its deadline.
func TestAskReplyTooLargeForTheAskersFrames(t *testing.T) {
	dir := t.TempDir()
	n1 := newNode(t, "n1", filepath.Join(dir, "n1"), func(c *node.Config) { c.Transport.MaxFrameSize = 8 << 10 })
	n2 := startNode(t, "n2", filepath.Join(dir, "n2"), n1.GossipAddr())
	waitAlive(t, []*node.Node{n1, n2}, 2)
	if _, err := n2.Spawn("big", func(context.Context, *node.Message) (proto.Message, error) {
		return wrapperspb.String(strings.Repeat("r", 16<<10)), nil
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := n1.Ask(ctx, node.Addr("big", "n2"), wrapperspb.String("q"), new(wrapperspb.StringValue))
	var re *node.RemoteError
	if !errors.As(err, &re) || !strings.Contains(err.Error(), "reply too large") || ctx.Err() != nil {
		t.Fatalf("Ask = %v, want a RemoteError saying the reply is too large, before the deadline", err)
	}
}
