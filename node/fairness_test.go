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
	var wg sync.WaitGroup
	full := floodTells(ctx, &wg, n1, node.Addr("busy", "n2"))
	// The flood fills the mailbox before the reliable messages are sent:
	// n2 refuses tells for a full mailbox, or drops its oldest. (How often
	// n1's own send queue is full depends on which side is faster, which
	// -race changes.)
	testutil.WaitFor(t, 10*time.Second, "tells refused or dropped by the full mailbox", func() bool {
		st := n2.Stats()
		return st.RefusedFull+st.Dropped > 100
	})
	const total = 50
	want := make([]string, total)
	for i := range total {
		want[i] = fmt.Sprint(i)
		if _, err := n1.TellReliable(ctxT(t), node.Addr("busy", "n2"), wrapperspb.String(want[i])); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, 60*time.Second, "reliable messages delivered during the flood", func() bool { return len(s.values()) >= total })
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

// Under DropOldest, a reliable message evicted by a tell and sent again
// stays queued until it is handled, however long the handler takes to
// reach it: the tells of a modest flood (a few hundred a second against a
// handler of 2.5 a second) do not evict it again.
func TestSlowDropOldestActorKeepsReliable(t *testing.T) {
	t.Parallel() // mostly waits on real time: runs beside the other such tests
	dir := t.TempDir()
	n1 := newNode(t, "n1", filepath.Join(dir, "n1"), fastRetries)
	n2 := startNode(t, "n2", filepath.Join(dir, "n2"), n1.GossipAddr())
	waitAlive(t, []*node.Node{n1, n2}, 2)
	var s sink
	var tells atomic.Int64
	h := func(ctx context.Context, m *node.Message) (proto.Message, error) {
		time.Sleep(400 * time.Millisecond) // a slow handler: 4 queued take 1.6 s
		if m.Sequence() == 0 {
			tells.Add(1)
			return nil, nil
		}
		return s.handler(ctx, m)
	}
	if _, err := n2.Spawn("slow", h, node.WithMailbox(4, mailbox.DropOldest)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	payload := wrapperspb.Bytes(make([]byte, 64))
	for range 2 {
		wg.Go(func() {
			tick := time.NewTicker(5 * time.Millisecond) // ~400 tells/s in all
			defer tick.Stop()
			for ctx.Err() == nil {
				_ = n1.Tell(ctx, node.Addr("slow", "n2"), payload)
				select {
				case <-tick.C:
				case <-ctx.Done():
				}
			}
		})
	}
	testutil.WaitFor(t, 10*time.Second, "the flood keeps the mailbox busy", func() bool { return tells.Load() >= 2 })
	if _, err := n1.TellReliable(ctxT(t), node.Addr("slow", "n2"), wrapperspb.String("r0")); err != nil {
		t.Fatal(err)
	}
	defer func() {
		st := n2.Stats()
		t.Logf("tells handled %d, n2 dropped %d, refused full %d, reliable delivered %v", tells.Load(), st.Dropped, st.RefusedFull, s.values())
	}()
	testutil.WaitFor(t, 30*time.Second, "the reliable message delivered during the tell flood", func() bool { return len(s.values()) == 1 })
}

// With a byte bound, the room kept for a refused reliable message is its
// size, not half the bytes: one larger than half (but within the bound)
// finds room while tells flood the actor.
func TestLargeReliableFindsRoomUnderByteBound(t *testing.T) {
	dir := t.TempDir()
	n1 := newNode(t, "n1", filepath.Join(dir, "n1"), fastRetries)
	n2 := startNode(t, "n2", filepath.Join(dir, "n2"), n1.GossipAddr())
	waitAlive(t, []*node.Node{n1, n2}, 2)
	var s sink
	var tells atomic.Int64
	h := func(ctx context.Context, m *node.Message) (proto.Message, error) {
		time.Sleep(time.Millisecond) // the handler's work
		if m.Sequence() == 0 {
			tells.Add(1)
			return nil, nil
		}
		return s.handler(ctx, m)
	}
	const maxBytes = 16 << 10
	if _, err := n2.Spawn("busy", h, node.WithMailbox(64, mailbox.Reject), node.WithMailboxBytes(maxBytes)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	full := floodTells(ctx, &wg, n1, node.Addr("busy", "n2")) // about 700 bytes a tell
	testutil.WaitFor(t, 10*time.Second, "tells refused by the full mailbox", func() bool { return n2.Stats().RefusedFull > 100 })
	// 14 KiB: more than the half the tells leave, within the 16 KiB bound.
	big := wrapperspb.String(strings.Repeat("x", 14<<10))
	if _, err := n1.TellReliable(ctxT(t), node.Addr("busy", "n2"), big); err != nil {
		t.Fatal(err)
	}
	defer func() {
		st := n2.Stats()
		t.Logf("tells handled %d, refused full %d, n2 refused full %d, reliable delivered %d", tells.Load(), full.Load(), st.RefusedFull, len(s.values()))
	}()
	testutil.WaitFor(t, 30*time.Second, "the large reliable message delivered during the tell flood", func() bool { return len(s.values()) == 1 })
}

// Steady reliable traffic to an actor of capacity 1 keeps room for
// reliable messages all the time; an ask that honours its retry hints still
// gets its turn, since tells and asks keep their own share (one item).
func TestCapacityOneAnswersAsksDuringReliableTraffic(t *testing.T) {
	dir := t.TempDir()
	n1 := newNode(t, "n1", filepath.Join(dir, "n1"), fastRetries)
	n2 := startNode(t, "n2", filepath.Join(dir, "n2"), n1.GossipAddr())
	waitAlive(t, []*node.Node{n1, n2}, 2)
	var s sink
	h := func(ctx context.Context, m *node.Message) (proto.Message, error) {
		time.Sleep(time.Millisecond) // the handler's work
		if m.Sequence() == 0 {
			return wrapperspb.String("pong"), nil
		}
		return s.handler(ctx, m)
	}
	if _, err := n2.Spawn("one", h, node.WithMailbox(1, mailbox.Reject)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	var sent atomic.Int64
	for range 4 { // steady reliable traffic: the stream keeps a backlog
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				if _, err := n1.TellReliable(ctx, node.Addr("one", "n2"), wrapperspb.String(fmt.Sprint(i))); err == nil {
					sent.Add(1)
				}
			}
		})
	}
	testutil.WaitFor(t, 10*time.Second, "reliable traffic flowing", func() bool { return len(s.values()) > 50 })
	var refused, ok atomic.Int64
	defer func() {
		t.Logf("reliable sent %d, delivered %d; asks refused full %d, answered %d", sent.Load(), len(s.values()), refused.Load(), ok.Load())
	}()
	testutil.WaitFor(t, 15*time.Second, "an ask answered during the reliable traffic", func() bool {
		actx, acancel := context.WithTimeout(ctx, 2*time.Second)
		defer acancel()
		err := n1.Ask(actx, node.Addr("one", "n2"), wrapperspb.String("ping"), new(wrapperspb.StringValue))
		var ce *node.CapacityError
		if errors.As(err, &ce) {
			refused.Add(1)
			return false
		}
		if err == nil {
			ok.Add(1)
			return true
		}
		t.Logf("ask: %v", err)
		return false
	})
}

// floodTells starts four senders on wg that tell to until ctx ends, each
// waiting out the hint of a refusal as a well-behaved sender does (the
// flood uses no CPU it does not need, and still keeps a small mailbox
// full); it returns the count of refusals.
func floodTells(ctx context.Context, wg *sync.WaitGroup, n *node.Node, to node.Address) *atomic.Int64 {
	full := new(atomic.Int64)
	payload := wrapperspb.Bytes(make([]byte, 64))
	for range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				var ce *node.CapacityError
				if err := n.Tell(ctx, to, payload); errors.As(err, &ce) {
					full.Add(1)
					select {
					case <-time.After(ce.RetryAfter):
					case <-ctx.Done():
					}
				}
			}
		})
	}
	return full
}
