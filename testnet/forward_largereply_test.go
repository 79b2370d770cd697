package testnet

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/node"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The same for the reply of a reliable request: C's reply fits the wire
// (CheckSize) but not with its origin, so while A↔C is cut and B could
// forward, held back it would hold the reply stream from C to A behind
// it, and the request, run and acknowledged, would get no reply while the
// cut lasts. Either the reply or an error reply saying it was too large
// must come (the latter is what a reply too large for the wire gets).
func TestReplyTooLargeToForwardDoesNotHoldItsStream(t *testing.T) {
	const frame = 8192
	const a, b, cc = 0, 1, 2
	var got atomic.Int64 // length of the reply body received at A, -1: an error reply
	c := New(t, 3, fastForward(), WithConfig(func(_ int, cfg *node.Config) {
		cfg.Transport.MaxFrameSize = frame
	}), WithSpawn(func(_ int, n *node.Node) error {
		if _, err := n.Spawn("svc", func(_ context.Context, m *node.Message) (proto.Message, error) {
			var v wrapperspb.StringValue
			if err := m.Decode(&v); err != nil {
				return nil, err
			}
			if v.GetValue() == "big" {
				return wrapperspb.String(strings.Repeat("y", frame-128-400)), nil
			}
			return wrapperspb.String("small"), nil
		}); err != nil {
			return err
		}
		if _, err := n.Spawn("warm", func(context.Context, *node.Message) (proto.Message, error) { return nil, nil }); err != nil {
			return err
		}
		_, err := n.Spawn("replies", func(_ context.Context, m *node.Message) (proto.Message, error) {
			var v wrapperspb.StringValue
			if err := m.Decode(&v); err != nil {
				got.Store(-1)
				return nil, nil
			}
			if len(v.GetValue()) > 100 {
				got.Store(int64(len(v.GetValue())))
			}
			return nil, nil
		})
		return err
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c.Cut(a, cc)
	testutil.WaitFor(t, 30*time.Second, "A's and C's streams to each other go through B", func() bool {
		_, _ = c.Node(a).TellReliable(ctx, c.Addr("warm", cc), wrapperspb.String("w"))
		_, _ = c.Node(cc).TellReliable(ctx, c.Addr("warm", a), wrapperspb.String("w"))
		return c.Node(a).Routes()[c.Name(cc)].Via == c.Name(b) && c.Node(cc).Routes()[c.Name(a)].Via == c.Name(b)
	})
	if _, err := c.Node(a).TellReliable(ctx, c.Addr("svc", cc), wrapperspb.String("big"),
		node.WithReplyTo(c.Addr("replies", a)), node.WithCorrelationID("r1")); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 20*time.Second, "the reply came while C could reach A through B", func() bool { return got.Load() != 0 })
	t.Logf("reply at A: %d (-1: an error reply, as for a reply too large for the wire)", got.Load())
}
