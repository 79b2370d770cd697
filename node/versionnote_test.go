package node_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/outbox"
	"github.com/meshnode/meshnode/testnet"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// A version delivered by a direct attempt is never stored, so the outbox's
// coalesce index, which makes Replay refuse an older version, must know it
// before the recipient can run it: it is noted durably first. When the
// disk refuses the note there is no attempt (and nothing is stored: the
// send fails, and nothing ran); when the note is taken, a crash right
// after the delivery loses nothing of it, and replaying the older version
// is refused. Before, the version was noted after the delivery, without
// waiting: with the disk full at that moment and a crash before it was
// free again, the older version was replayed and ran after the newer.
func TestDirectVersionIsNotedBeforeItsAttempt(t *testing.T) {
	const a, cc = 0, 1
	var (
		mu       sync.Mutex
		ran      []string
		rejected bool
	)
	c := testnet.New(t, 2, testnet.WithSpawn(func(_ int, nd *node.Node) error {
		_, err := nd.Spawn("cfg", func(_ context.Context, m *node.Message) (proto.Message, error) {
			var v wrapperspb.StringValue
			if err := m.Decode(&v); err != nil {
				return nil, err
			}
			mu.Lock()
			defer mu.Unlock()
			if v.GetValue() == "v1" && !rejected {
				// v1's first run fails for good: it goes to A's
				// dead-letter queue, which an operator replays later.
				rejected = true
				return nil, node.Permanent(errors.New("config service not ready"))
			}
			ran = append(ran, v.GetValue())
			return nil, nil
		})
		return err
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	to := c.Addr("cfg", cc)
	runs := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(ran)
	}

	if out, err := c.Node(a).TellReliable(ctx, to, wrapperspb.String("v1"), node.WithOverwrite("config")); err != nil || out != node.DeadLettered {
		t.Fatalf("v1: %v %v, want DeadLettered", out, err)
	}
	c.DiskFull(a)
	if out, err := c.Node(a).TellReliable(ctx, to, wrapperspb.String("v2"), node.WithOverwrite("config")); err == nil {
		t.Fatalf("v2 with A's disk full: %v, want an error (its version cannot be noted, so it is neither sent nor stored)", out)
	}
	if got := runs(); len(got) != 0 {
		t.Fatalf("cfg ran %v while A's disk was full, want nothing", got)
	}
	c.FreeDisks()
	if out, err := c.Node(a).TellReliable(ctx, to, wrapperspb.String("v2"), node.WithOverwrite("config")); err != nil || out != node.Delivered {
		t.Fatalf("v2: %v %v, want Delivered", out, err)
	}
	if err := c.Kill(a); err != nil {
		t.Logf("kill: %v", err)
	}
	if err := c.Restart(a); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitConverged(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Node(a).Outbox().Replay(outbox.DLQFilter{Recipient: to.String()}); n != 0 || !errors.Is(err, outbox.ErrSuperseded) {
		t.Fatalf("replaying v1 after v2 was delivered: %d, %v; want 0 and ErrSuperseded", n, err)
	}
	if got := runs(); !slices.Equal(got, []string{"v2"}) {
		t.Fatalf("cfg ran %v, want [v2]", got)
	}
}
