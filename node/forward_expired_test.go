package node_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/outbox"
	"github.com/meshnode/meshnode/partition"
	"github.com/meshnode/meshnode/testnet"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// A message whose copy is answered EXPIRED while a copy sent earlier
// through a forwarder is still held there (in its queue to the recipient)
// may yet run: the held copy carries the TTL it had when it was emitted,
// which the recipient counts from the copy's own arrival. So the sender
// dead-letters it with the reason that says its outcome is unknown, not
// "expired" (never ran), which an operator replays: a replay of a message
// that ran runs it twice.
func TestExpiredWithACopyHeldAtAForwarderIsOutcomeUnknown(t *testing.T) {
	const a, b, cc = 0, 1, 2
	const (
		deliverTimeout = 2 * time.Second
		ttl            = 5 * time.Second // > 2 deliverTimeout: the third emission (direct) still has TTL left
	)
	var (
		mu      sync.Mutex
		ran     []uint64
		blocked = make(chan struct{}, 1)
		gate    = make(chan struct{})
	)
	c := testnet.New(t, 3,
		testnet.WithConfig(func(_ int, cfg *node.Config) {
			cfg.Transport.HandshakeTimeout = 500 * time.Millisecond
			cfg.Transport.KeepAlivePeriod = 200 * time.Millisecond
			cfg.Transport.MaxIdleTimeout = time.Second
			cfg.Relay.Backoff = partition.BackoffConfig{Base: 20 * time.Millisecond, Cap: 200 * time.Millisecond}
			cfg.Relay.Forward = partition.ForwardConfig{After: 2, Probe: 100 * time.Millisecond}
			cfg.Relay.DeliverTimeout = deliverTimeout
		}),
		testnet.WithSpawn(func(_ int, nd *node.Node) error {
			if _, err := nd.Spawn("sink", func(_ context.Context, m *node.Message) (proto.Message, error) {
				var v wrapperspb.UInt64Value
				if err := m.Decode(&v); err != nil {
					return nil, err
				}
				if v.GetValue() == 0 { // keeps the actor busy until the test opens gate
					blocked <- struct{}{}
					<-gate
					return nil, nil
				}
				mu.Lock()
				ran = append(ran, v.GetValue())
				mu.Unlock()
				return nil, nil
			}); err != nil {
				return err
			}
			_, err := nd.Spawn("warm", func(context.Context, *node.Message) (proto.Message, error) { return nil, nil })
			return err
		}))
	snapshot := func() []uint64 {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(ran)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sink := c.Addr("sink", cc)

	warm(t, c, cc, b)
	c.Cut(a, cc)
	testutil.WaitFor(t, 30*time.Second, "A's stream to C goes through B", func() bool {
		_, _ = c.Node(a).TellReliable(ctx, c.Addr("warm", cc), wrapperspb.String("w"))
		return c.Node(a).Routes()[c.Name(cc)].Via == c.Name(b)
	})
	if err := c.WaitDrained(20 * time.Second); err != nil {
		t.Fatal(err)
	}

	// B holds what it carries to sink@C until release is closed: a slow
	// forwarder (its queue to C, a slow link).
	release := make(chan struct{})
	var held atomic.Int32
	node.SetCarryHook(c.Node(b), func(env *pb.Envelope) *pb.Receipt {
		if env.GetRecipient() == sink.String() {
			held.Add(1)
			<-release
		}
		return nil
	})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	defer free()
	var gateOnce sync.Once
	open := func() { gateOnce.Do(func() { close(gate) }) }
	defer open()

	// C's sink is busy (a local message holds it), so a copy that comes
	// direct waits in its mailbox.
	if err := c.Node(cc).Tell(ctx, sink, wrapperspb.UInt64(0)); err != nil {
		t.Fatal(err)
	}
	<-blocked

	// The direct path is back, but A's stream to C is still forwarded: its
	// next emission goes through B (and starts the probe that brings the
	// stream back direct for the one after).
	c.Heal()
	start := c.Node(a).ElapsedMs()
	if _, err := c.Node(a).TellReliable(ctx, sink, wrapperspb.UInt64(7), node.WithTTL(ttl)); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "B holds the forwarded copy", func() bool { return held.Load() > 0 })
	testutil.WaitFor(t, 10*time.Second, "a direct copy waits in C's mailbox", func() bool {
		for _, as := range c.Node(cc).ActorStats() {
			if as.Name == "sink" && as.Depth > 0 {
				return true
			}
		}
		return false
	})
	t.Logf("a direct copy reached C %d ms after the send", c.Node(a).ElapsedMs()-start)
	// Past the TTL on A's clock (with margin for C's): the copy in C's
	// mailbox has expired when the actor takes it.
	testutil.WaitFor(t, 10*time.Second, "the TTL passed", func() bool {
		return c.Node(a).ElapsedMs() > start+ttl.Milliseconds()+300
	})
	open()
	var dl []outbox.DeadLetter
	testutil.WaitFor(t, 15*time.Second, "A dead-lettered the message", func() bool {
		dl, _ = c.Node(a).Outbox().DeadLetters(outbox.DLQFilter{Recipient: sink.String()})
		return len(dl) > 0
	})
	if dl[0].Reason != outbox.ReasonExpiredUnknown {
		t.Fatalf("dead-lettered with reason %q while B still held a copy, want %q", dl[0].Reason, outbox.ReasonExpiredUnknown)
	}

	// The forwarder's queue moves on: the held copy may run, once.
	answered := func() uint64 { s := c.Node(cc).Stats(); return s.Expired + s.DedupeHits + s.OutOfOrder }
	before := answered()
	free()
	testutil.WaitFor(t, 10*time.Second, "C answered what B held", func() bool {
		return len(snapshot()) > 0 || answered() > before
	})
	if got := snapshot(); len(got) > 1 {
		t.Fatalf("sink@C ran %v, want 7 at most once", got)
	}
}
