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
)

// The largest reliable message TellReliable accepts (its check keeps room
// for the fields each send adds) is delivered to a node with the same
// MaxFrameSize: the send checks the complete envelope without that room
// again.
func TestLargestAcceptedReliableMessageIsDelivered(t *testing.T) {
	dir := t.TempDir()
	const limit = 64 << 10
	n1 := newNode(t, "n1", filepath.Join(dir, "n1"), func(c *node.Config) {
		fastRetries(c)
		c.Transport.MaxFrameSize = limit
		c.Relay.Forward.After = 0 // no origin room taken at TellReliable
	})
	n2 := newNode(t, "n2", filepath.Join(dir, "n2"), func(c *node.Config) {
		c.Transport.MaxFrameSize = limit
		c.Relay.Forward.After = 0
	}, n1.GossipAddr())
	waitAlive(t, []*node.Node{n1, n2}, 2)
	var s sink
	if _, err := n2.Spawn("sink", s.handler); err != nil {
		t.Fatal(err)
	}
	to := node.Addr("sink", "n2")
	for size := limit; size > 0; size-- {
		out, err := n1.TellReliable(ctxT(t), to, wrapperspb.String(strings.Repeat("x", size)))
		if errors.Is(err, node.ErrTooLarge) {
			continue
		}
		if err != nil || out != node.Delivered {
			t.Fatalf("TellReliable of the largest accepted body (%d B) = %v, %v; want Delivered (dead letters: %v)", size, out, err, deadLetterReasons(t, n1))
		}
		break
	}
}

// Between nodes configured apart: a message whose frame fits the 64 KiB
// the recipient announced is delivered by a sender with larger frames.
func TestMessageFittingTheRecipientsFramesIsDelivered(t *testing.T) {
	dir := t.TempDir()
	const limit = 64 << 10
	n1 := newNode(t, "n1", filepath.Join(dir, "n1"), fastRetries) // 4 MiB frames
	n2 := newNode(t, "n2", filepath.Join(dir, "n2"), func(c *node.Config) {
		c.Transport.MaxFrameSize = limit
	}, n1.GossipAddr())
	waitAlive(t, []*node.Node{n1, n2}, 2)
	var s sink
	if _, err := n2.Spawn("sink", s.handler); err != nil {
		t.Fatal(err)
	}
	// A body whose wire frame is well within 64 KiB: 200 bytes under it.
	size := limit - 200
	out, err := n1.TellReliable(ctxT(t), node.Addr("sink", "n2"), wrapperspb.String(strings.Repeat("x", size)))
	if err != nil || out != node.Delivered {
		t.Fatalf("TellReliable (%d B body) = %v, %v; want Delivered (dead letters: %v)", size, out, err, deadLetterReasons(t, n1))
	}
}

func deadLetterReasons(tb testing.TB, n *node.Node) []string {
	var out []string
	for _, d := range deadLetters(tb, n) {
		out = append(out, d.Reason)
	}
	return out
}

// A node with 8 KiB frames sends a reliable message to a node with 4 MiB
// frames whose handler refuses it as poison with a reason longer than 8
// KiB: the REJECTED receipt arrives with its reason cut, and the message
// is dead-lettered at once.
func TestLongRefusalReachesASenderWithSmallFrames(t *testing.T) {
	dir := t.TempDir()
	n1 := newNode(t, "n1", filepath.Join(dir, "n1"), func(c *node.Config) {
		fastRetries(c)
		c.Transport.MaxFrameSize = 8 << 10
	})
	n2 := startNode(t, "n2", filepath.Join(dir, "n2"), n1.GossipAddr())
	waitAlive(t, []*node.Node{n1, n2}, 2)
	long := strings.Repeat("the order refers to an unknown customer; ", 400) // ~16 KiB
	if _, err := n2.Spawn("strict", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		return nil, node.Permanent(errors.New(long))
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := n1.TellReliable(ctxT(t), node.Addr("strict", "n2"), wrapperspb.String("order")); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "the refused message dead-lettered", func() bool { return len(deadLetters(t, n1)) == 1 })
}
