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
	t.Parallel() // mostly waits on real time: runs beside the other such tests

	const ttl = 5 * time.Second // > 2 DeliverTimeouts: the third emission (direct) still has TTL left
	h := newForwardHold(t, 2*time.Second)
	// The direct path is back, but A's stream to C is still forwarded: its
	// next emission goes through B (and starts the probe that brings the
	// stream back direct for the one after).
	h.c.Heal()
	start := h.c.Node(fhA).ElapsedMs()
	h.send(t, ttl)
	h.waitDirectCopy(t)
	t.Logf("a direct copy reached C %d ms after the send", h.c.Node(fhA).ElapsedMs()-start)
	h.expireAndCheck(t, start, ttl)
}

// A copy sent through a forwarder and held there survives the sender's
// restart, and the restarted sender's relay has no record of it. Its next
// copy is answered EXPIRED: a message stored by an earlier run of a relay
// that forwards may have such a copy, so it is dead-lettered "outcome
// unknown", not "expired" (never ran), and the held copy may then run.
func TestExpiredAfterARestartWithACopyHeldAtAForwarderIsOutcomeUnknown(t *testing.T) {
	t.Parallel() // mostly waits on real time: runs beside the other such tests

	const ttl = 8 * time.Second
	// The direct copy waits in C's mailbox past the TTL: its receipt must
	// still be read.
	h := newForwardHold(t, 30*time.Second)
	start := h.c.Node(fhA).ElapsedMs()
	h.send(t, ttl) // through B, which holds it
	// The sender restarts; the direct path is back.
	if err := h.c.Stop(fhA); err != nil {
		t.Fatal(err)
	}
	h.c.Heal()
	if err := h.c.Restart(fhA); err != nil {
		t.Fatal(err)
	}
	h.waitDirectCopy(t)
	h.expireAndCheck(t, start, ttl)
}

// Nodes of a forwardHold cluster.
const fhA, fhB, fhC = 0, 1, 2

// forwardHold is three nodes where A reaches C only through B, B holds
// what it carries to sink@C until free, and sink@C is busy (a local
// message in its handler) until open, so that a copy coming direct waits
// in its mailbox.
type forwardHold struct {
	c          *testnet.Cluster
	sink       node.Address
	held       atomic.Int32
	free, open func()

	mu  sync.Mutex
	ran []uint64
}

func newForwardHold(t *testing.T, deliverTimeout time.Duration) *forwardHold {
	t.Helper()
	h := &forwardHold{}
	blocked, gate := make(chan struct{}, 1), make(chan struct{})
	h.c = testnet.New(t, 3,
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
				if v.GetValue() == 0 { // keeps the actor busy until open
					blocked <- struct{}{}
					<-gate
					return nil, nil
				}
				h.mu.Lock()
				h.ran = append(h.ran, v.GetValue())
				h.mu.Unlock()
				return nil, nil
			}); err != nil {
				return err
			}
			_, err := nd.Spawn("warm", func(context.Context, *node.Message) (proto.Message, error) { return nil, nil })
			return err
		}))
	h.sink = h.c.Addr("sink", fhC)
	ctx := ctxT(t)
	warm(t, h.c, fhC, fhB)
	h.c.Cut(fhA, fhC)
	testutil.WaitFor(t, 30*time.Second, "A's stream to C goes through B", func() bool {
		_, _ = h.c.Node(fhA).TellReliable(ctx, h.c.Addr("warm", fhC), wrapperspb.String("w"))
		return h.c.Node(fhA).Routes()[h.c.Name(fhC)].Via == h.c.Name(fhB)
	})
	if err := h.c.WaitDrained(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	node.SetCarryHook(h.c.Node(fhB), func(env *pb.Envelope) *pb.Receipt {
		if env.GetRecipient() == h.sink.String() {
			h.held.Add(1)
			<-release
		}
		return nil
	})
	var freeOnce, openOnce sync.Once
	h.free = func() { freeOnce.Do(func() { close(release) }) }
	h.open = func() { openOnce.Do(func() { close(gate) }) }
	t.Cleanup(h.free)
	t.Cleanup(h.open)
	if err := h.c.Node(fhC).Tell(ctx, h.sink, wrapperspb.UInt64(0)); err != nil {
		t.Fatal(err)
	}
	<-blocked
	return h
}

// send sends message 7 from A to sink@C with ttl and waits until B holds
// a copy.
func (h *forwardHold) send(t *testing.T, ttl time.Duration) {
	t.Helper()
	if _, err := h.c.Node(fhA).TellReliable(ctxT(t), h.sink, wrapperspb.UInt64(7), node.WithTTL(ttl)); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "B holds the forwarded copy", func() bool { return h.held.Load() > 0 })
}

// waitDirectCopy waits until a copy that came direct waits in sink@C's
// mailbox.
func (h *forwardHold) waitDirectCopy(t *testing.T) {
	t.Helper()
	testutil.WaitFor(t, 15*time.Second, "a direct copy waits in C's mailbox", func() bool {
		for _, as := range h.c.Node(fhC).ActorStats() {
			if as.Name == "sink" && as.Depth > 0 {
				return true
			}
		}
		return false
	})
}

// expireAndCheck lets the sink take the direct copy once the TTL (sent at
// start on A's elapsed clock) has passed, with margin for C's clock, and
// checks that A dead-letters the message "outcome unknown" while B still
// holds its copy, which then runs at most once.
func (h *forwardHold) expireAndCheck(t *testing.T, start int64, ttl time.Duration) {
	t.Helper()
	a := h.c.Node(fhA)
	testutil.WaitFor(t, 15*time.Second, "the TTL passed", func() bool { return a.ElapsedMs() > start+ttl.Milliseconds()+300 })
	h.open()
	var dl []outbox.DeadLetter
	testutil.WaitFor(t, 15*time.Second, "A dead-lettered the message", func() bool {
		dl, _ = a.Outbox().DeadLetters(outbox.DLQFilter{Recipient: h.sink.String()})
		return len(dl) > 0
	})
	if dl[0].Reason != outbox.ReasonExpiredUnknown {
		t.Fatalf("dead-lettered with reason %q while B still held a copy, want %q", dl[0].Reason, outbox.ReasonExpiredUnknown)
	}
	// The forwarder's queue moves on: the held copy may run, once.
	answered := func() uint64 { s := h.c.Node(fhC).Stats(); return s.Expired + s.DedupeHits + s.OutOfOrder }
	before := answered()
	h.free()
	testutil.WaitFor(t, 10*time.Second, "C answered what B held", func() bool {
		return len(h.snapshot()) > 0 || answered() > before
	})
	if got := h.snapshot(); len(got) > 1 {
		t.Fatalf("sink@C ran %v, want 7 at most once", got)
	}
}

func (h *forwardHold) snapshot() []uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.ran)
}
