package testnet

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/outbox"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// A (8 KiB frames) sends a reliable message to C (4 MiB frames) while
// A↔C is cut, so it goes through B. C's handler refuses it as poison with
// a reason longer than 8 KiB. C cuts the reason before it signs the
// REJECTED receipt, so the receipt fits A's frames as it is, its signature
// verifies at A, and the message is dead-lettered at once, as it is when
// sent directly.
func TestForwardedLongRefusalReachesASenderWithSmallFrames(t *testing.T) {
	const a, b, cc = 0, 1, 2
	long := strings.Repeat("the order refers to an unknown customer; ", 400) // ~16 KiB
	var runs atomic.Int64
	c := New(t, 3, fastForward(), WithConfig(func(i int, cfg *node.Config) {
		if i == a {
			cfg.Transport.MaxFrameSize = 8 << 10
		}
	}), WithSpawn(func(_ int, n *node.Node) error {
		if _, err := n.Spawn("strict", func(context.Context, *node.Message) (proto.Message, error) {
			runs.Add(1)
			return nil, node.Permanent(errors.New(long))
		}); err != nil {
			return err
		}
		_, err := n.Spawn("warm", func(context.Context, *node.Message) (proto.Message, error) { return nil, nil })
		return err
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c.Cut(a, cc)
	testutil.WaitFor(t, 30*time.Second, "A's stream to C goes through B", func() bool {
		_, _ = c.Node(a).TellReliable(ctx, c.Addr("warm", cc), wrapperspb.String("w"))
		return c.Node(a).Routes()[c.Name(cc)].Via == c.Name(b)
	})
	sctx, scancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, _ = c.Node(a).TellReliable(sctx, c.Addr("strict", cc), wrapperspb.String("order"))
	scancel()
	dead := func() int {
		dl, err := c.Node(a).Outbox().DeadLetters(outbox.DLQFilter{})
		if err != nil {
			t.Fatal(err)
		}
		return len(dl)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("C ran the poison handler %d times; A's forward stats %+v", runs.Load(), c.Node(a).Stats().Forward)
		}
	})
	testutil.WaitFor(t, 15*time.Second, "the refused message dead-lettered at A", func() bool { return dead() == 1 })
}
