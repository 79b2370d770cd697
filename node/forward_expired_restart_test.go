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

// A copy sent through a forwarder and held there survives the sender's
// restart, and the restarted sender's relay has no record of it. Its next
// copy is answered EXPIRED: a message stored by an earlier run of a relay
// that forwards may have such a copy, so it is dead-lettered "outcome
// unknown", not "expired" (never ran), and the held copy may then run.
func TestExpiredAfterARestartWithACopyHeldAtAForwarderIsOutcomeUnknown(t *testing.T) {
	const a, b, cc = 0, 1, 2
	const ttl = 8 * time.Second
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
			cfg.Relay.DeliverTimeout = 30 * time.Second // the direct copy waits in C's mailbox past the TTL: its receipt must still be read
		}),
		testnet.WithSpawn(func(_ int, nd *node.Node) error {
			if _, err := nd.Spawn("sink", func(_ context.Context, m *node.Message) (proto.Message, error) {
				var v wrapperspb.UInt64Value
				if err := m.Decode(&v); err != nil {
					return nil, err
				}
				if v.GetValue() == 0 {
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
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
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

	if err := c.Node(cc).Tell(ctx, sink, wrapperspb.UInt64(0)); err != nil {
		t.Fatal(err)
	}
	<-blocked

	// The message goes through B, which holds it.
	if _, err := c.Node(a).TellReliable(ctx, sink, wrapperspb.UInt64(7), node.WithTTL(ttl)); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "B holds the forwarded copy", func() bool { return held.Load() > 0 })
	start := c.Node(a).ElapsedMs()

	// The sender restarts; the direct path is back.
	if err := c.Stop(a); err != nil {
		t.Fatal(err)
	}
	c.Heal()
	if err := c.Restart(a); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "the restarted A's copy waits in C's mailbox", func() bool {
		for _, as := range c.Node(cc).ActorStats() {
			if as.Name == "sink" && as.Depth > 0 {
				return true
			}
		}
		return false
	})
	testutil.WaitFor(t, 15*time.Second, "the TTL passed", func() bool {
		return c.Node(a).ElapsedMs() > start+ttl.Milliseconds()+300
	})
	open()
	var dl []outbox.DeadLetter
	testutil.WaitFor(t, 15*time.Second, "A dead-lettered the message", func() bool {
		dl, _ = c.Node(a).Outbox().DeadLetters(outbox.DLQFilter{Recipient: sink.String()})
		return len(dl) > 0
	})
	reason := dl[0].Reason
	free()
	answered := func() uint64 { s := c.Node(cc).Stats(); return s.Expired + s.DedupeHits + s.OutOfOrder }
	before := answered()
	testutil.WaitFor(t, 10*time.Second, "C answered what B held", func() bool {
		return len(snapshot()) > 0 || answered() > before
	})
	if reason != outbox.ReasonExpiredUnknown {
		t.Fatalf("A dead-lettered the message %q while B held a copy sent before A's restart, want %q; sink@C ran %v", reason, outbox.ReasonExpiredUnknown, snapshot())
	}
	if got := snapshot(); len(got) > 1 {
		t.Fatalf("sink@C ran %v, want 7 at most once", got)
	}
}
