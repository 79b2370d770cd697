package node

import (
	"sync/atomic"
	"time"

	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/mesh"
	"github.com/meshnode/meshnode/transport"
)

// Test hooks for the external test package.

// DeliverIncoming hands an envelope to the node as if it came from the
// verified peer from, and returns at once (reply is called later).
func (n *Node) DeliverIncoming(from transport.PeerInfo, env *pb.Envelope, reply func(*pb.Receipt)) {
	n.deliverIncoming(from, env, reply)
}

// ResponseStats returns the ask response registry's stats.
func (n *Node) ResponseStats() mailbox.RegistryStats { return n.responses.Stats() }

// OutboxID returns the node's outbox id.
func (n *Node) OutboxID() [16]byte { return n.store.OutboxID() }

// EvictIdleStreams runs the receiver's stream-cache eviction now, with the
// given idle time, and returns how many streams it forgot.
func (n *Node) EvictIdleStreams(idle time.Duration) int { return n.in.evictIdle(idle.Milliseconds()) }

// RefusedStreams is how many streams the receiver keeps refused messages
// of (to compare with what later runs under their sequences).
func (n *Node) RefusedStreams() int { _, k := n.in.refused.kept(); return k }

// RefusedKept is how many refused messages the receiver keeps, over all
// streams.
func (n *Node) RefusedKept() int { k, _ := n.in.refused.kept(); return k }

// ExpireRefused forgets the refused messages of streams whose last one was
// noted more than keep ago.
func (n *Node) ExpireRefused(keep time.Duration) {
	n.in.refused.expire(n.store.ElapsedMs() - keep.Milliseconds())
}

// ElapsedMs reads n's elapsed clock, the one its streams' last use and
// deadlines are kept in.
func (n *Node) ElapsedMs() int64 { return n.store.ElapsedMs() }

// SetCarryHook makes n, as a forwarder, hand f a copy of each envelope it
// is about to carry: f may alter it, or answer with a receipt of its own
// instead of carrying it.
func SetCarryHook(n *Node, f func(env *pb.Envelope) (forged *pb.Receipt)) { n.fwd.carryHook.Store(&f) }

// ForceCommitInterleaving drives, one step at a time, the interleaving of
// a stream's owner (the actor) with the follow-up commit that the previous
// commit's callback starts on a goroutine of its own (inbound.commit's
// in.wg.Go): a commit of the stream is under way; the owner ran message 6
// (key kb) and registered it; the owner runs message 7 (key kc), and the
// follow-up commit takes what waits and reads the watermark at the worst
// moment the owner's code allows: before 7's watermark and key are
// registered (advance does both in one step under cmu, where commit reads
// them). It returns once that commit is durable; the caller kills the node
// here, as a crash would.
func (n *Node) ForceCommitInterleaving(id StreamID, kb []byte) error {
	st, err := n.in.acquire(id, nil)
	if err != nil {
		return err
	}
	defer n.in.release(st)
	st.cmu.Lock()
	st.pend = &pending{} // the commit under way
	st.cmu.Unlock()
	done := make(chan error, 1)
	n.in.advance(st, 6, 0, [][]byte{kb}, func(err error, _ uint64) { done <- err })
	n.in.commit(st) // the follow-up commit's goroutine, while the owner handles 7
	return <-done
}

// RelayDelivered returns how many messages the relay acked after a
// positive receipt: it counts an emission once its ack is recorded and the
// stream may make a direct attempt again.
func (n *Node) RelayDelivered() uint64 { return n.relay.Stats().Delivered }

// RelayPipelined returns how many emissions the relay sent before the
// receipts of the one before them.
func (n *Node) RelayPipelined() uint64 { return n.relay.Stats().Pipelined }

// MemberEvent hands ev to the node as if membership had published it.
func (n *Node) MemberEvent(ev mesh.Event) { n.onMemberEvent(ev) }

// PruneDeparted runs the pruning of departed peers now, as at time now.
func (n *Node) PruneDeparted(now time.Time) { n.pruneDeparted(now) }

// PeerState counts the per-peer entries the node and its layers keep in
// memory: relay limiters, transport peers, byte budgets, unknown-peer
// warnings, and departed peers awaiting their prune.
func (n *Node) PeerState() (limiters, transportPeers, charges, warned, departed int) {
	limiters = len(n.relay.Stats().LimitByPeer)
	transportPeers = len(n.transport.PeerStats())
	charges = n.charges.len()
	n.warnedPeers.Range(func(any, any) bool { warned++; return true })
	n.departedMu.Lock()
	departed = len(n.departed)
	n.departedMu.Unlock()
	return limiters, transportPeers, charges, warned, departed
}

// RoomState reports what an actor keeps for reliable messages: how many
// are queued, and until when (the store's elapsed clock, ms; 0: none) one
// refused for room is expected back, beside that clock now.
func (n *Node) RoomState(name string) (streamsQueued, waitUntilMs, nowMs int64) {
	a := n.actor(name)
	if a == nil {
		return 0, 0, 0
	}
	if w := a.waiting.Load(); w != nil {
		waitUntilMs = w.untilMs
	}
	return int64(a.streamsQueued.Load()), waitUntilMs, n.store.ElapsedMs()
}

// AgeHeldReplies makes d pass for the replies n keeps for the disk, as the
// wall clock would: each was last wanted d earlier than it was, and the
// next look drops what is past its TTL.
func AgeHeldReplies(n *Node, d time.Duration) {
	n.held.mu.Lock()
	defer n.held.mu.Unlock()
	for _, r := range n.held.m {
		r.at = r.at.Add(-d)
	}
	n.held.swept = time.Time{}
}

// HeldReplies returns how many replies n keeps for the disk.
func HeldReplies(n *Node) int { return int(n.held.n.Load()) }

// PeerQueuedBytes is what peer's messages queued at n are charged against
// Config.PeerQueuedBytes.
func (n *Node) PeerQueuedBytes(peer string) int64 {
	if v, ok := n.charges.m.Load(peer); ok {
		return v.(*atomic.Int64).Load()
	}
	return 0
}

// DurableWatermark returns the highest durable watermark among the cached
// inbound streams.
func (n *Node) DurableWatermark() uint64 {
	n.in.mu.Lock()
	defer n.in.mu.Unlock()
	var d uint64
	for _, st := range n.in.streams {
		d = max(d, st.durable.Load())
	}
	return d
}

// EnvBytes is what the node charges env against its bounds (envBytes).
func EnvBytes(env *pb.Envelope) int64 { return envBytes(env) }
