package node_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/node"
)

// A flood of tells that keeps an actor's small mailbox full does not
// starve the reliable messages sent to the same actor: they arrive, in
// order, while the flood goes on. The flood's senders retry as soon as
// their hint allows, so every slot the handler frees would go to a tell.
func TestTellFloodDoesNotStarveReliable(t *testing.T) {
	for _, o := range []mailbox.Overflow{mailbox.Reject, mailbox.DropOldest} {
		t.Run(o.String(), func(t *testing.T) { tellFloodWithReliable(t, o) })
	}
}

func tellFloodWithReliable(t *testing.T, overflow mailbox.Overflow) {
	dir := t.TempDir()
	n1 := newNode(t, "n1", filepath.Join(dir, "n1"), fastRetries)
	n2 := startNode(t, "n2", filepath.Join(dir, "n2"), n1.GossipAddr())
	waitAlive(t, []*node.Node{n1, n2}, 2)
	var s sink
	var tells atomic.Int64
	h := func(ctx context.Context, m *node.Message) (proto.Message, error) {
		time.Sleep(100 * time.Microsecond) // the handler's work
		if m.Sequence() == 0 {
			tells.Add(1)
			return nil, nil
		}
		return s.handler(ctx, m)
	}
	if _, err := n2.Spawn("busy", h, node.WithMailbox(8, overflow)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var full atomic.Int64
	var wg sync.WaitGroup
	payload := wrapperspb.Bytes(make([]byte, 64))
	for range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				var ce *node.CapacityError
				if err := n1.Tell(ctx, node.Addr("busy", "n2"), payload); errors.As(err, &ce) {
					full.Add(1)
					// A sender that honours the hint: the flood needs no
					// CPU it does not use, and still keeps the mailbox full.
					select {
					case <-time.After(ce.RetryAfter):
					case <-ctx.Done():
					}
				}
			}
		})
	}
	// The flood fills the mailbox before the reliable messages are sent.
	testutil.WaitFor(t, 10*time.Second, "tells refused full", func() bool { return full.Load() > 100 })
	const total = 50
	want := make([]string, total)
	for i := range total {
		want[i] = fmt.Sprint(i)
		if _, err := n1.TellReliable(ctxT(t), node.Addr("busy", "n2"), wrapperspb.String(want[i])); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, 30*time.Second, "reliable messages delivered during the flood", func() bool { return len(s.values()) >= total })
	cancel()
	wg.Wait()
	t.Logf("tells handled %d, refused full %d", tells.Load(), full.Load())
	if got := s.values(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("delivered %v", got)
	}
	if tells.Load() == 0 {
		t.Fatal("no tell was handled: the flood was starved instead")
	}
}
