package node

import (
	"sort"
	"sync/atomic"
	"time"

	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/mesh"
	"github.com/meshnode/meshnode/transport"
)

// counters are the node's own event counts (lock-free); Stats copies them.
// Each has the name of the Stats field it fills, so a count is found by
// one name from the metric to the increment.
type counters struct {
	tellSent, tellFailed                              atomic.Uint64
	askOK, askFailed                                  atomic.Uint64
	askNanos                                          atomic.Uint64 // sum of successful asks' latency: AskMeanLatency
	reliableDelivered, reliableQueued, reliableFailed atomic.Uint64
	reliableDeadLettered, unknownPeer                 atomic.Uint64
	dropped, panics, noSuchActor, expired             atomic.Uint64
	refusedFull, dedupeHits, outOfOrder, forgotten    atomic.Uint64
	stopping, diverged, storeFailed                   atomic.Uint64
	memberEventsMissed                                atomic.Uint64
	senderMismatch, refusedPeerBytes                  atomic.Uint64
}

func (c *counters) observeAsk(d time.Duration, err error) {
	if err != nil {
		c.askFailed.Add(1)
		return
	}
	c.askOK.Add(1)
	c.askNanos.Add(uint64(d.Nanoseconds()))
}

// Stats are counts since the node started.
type Stats struct {
	TellSent, TellFailed                              uint64 // tells handed to a mailbox or connection; refused
	AskOK, AskFailed                                  uint64
	AskMeanLatency                                    time.Duration
	ReliableDelivered, ReliableQueued, ReliableFailed uint64 // TellReliable outcomes (Dispatch counts as queued)
	ReliableDeadLettered                              uint64 // TellReliable calls answered DeadLettered
	UnknownPeer                                       uint64 // reliable sends to a node no member has seen
	Dropped                                           uint64 // mailbox drops (DropOldest/DropNewest/closed)
	Panics                                            uint64 // handler panics recovered
	NoSuchActor                                       uint64 // messages for an actor that does not exist here
	Expired                                           uint64 // messages that arrived expired, or whose caller's deadline passed in the mailbox
	RefusedFull                                       uint64 // messages refused because a mailbox was full
	DedupeHits                                        uint64 // reliable messages answered DUPLICATE (watermark or idempotency key)
	OutOfOrder                                        uint64 // reliable messages answered OUT_OF_ORDER (predecessor not run here)
	Forgotten                                         uint64 // reliable messages answered FORGOTTEN (older than a stream this node forgot; may have run)
	Diverged                                          uint64 // reliable messages answered DIVERGED (their sender's outbox went back: it starts a new epoch)
	StoreFailed                                       uint64 // reliable messages not run because this node's store stopped (a failed sync; restart the node)
	Stopping                                          uint64 // messages from peers refused because an actor or the node was stopping (reliable ones are sent again)
	MemberEventsMissed                                uint64 // membership events a slow subscriber or callback did not get
	Streams                                           int    // reliable streams whose watermark is cached in memory
	Actors                                            int

	// What was refused from other nodes (docs/threat-model.md).
	SenderMismatch   uint64             // envelopes naming another node than the verified peer as sender or reply-to
	ResponsesRefused uint64             // ask responses from another node than the one asked
	RefusedPeerBytes uint64             // messages refused because their sender's queued bytes were at PeerQueuedBytes
	Refused          transport.Refusals // connections refused for who was at the other end (certificate, identity)

	Forward ForwardStats // forwarded reliable messages: sent, carried, accepted, refused (forward.go)
	Gossip  mesh.Traffic // gossip bytes sent and received since Start (membership's whole cost on the wire)
}

// Stats returns a snapshot of the node's counters.
func (n *Node) Stats() Stats {
	c := &n.stats
	s := Stats{
		TellSent: c.tellSent.Load(), TellFailed: c.tellFailed.Load(),
		AskOK: c.askOK.Load(), AskFailed: c.askFailed.Load(),
		ReliableDelivered: c.reliableDelivered.Load(), ReliableQueued: c.reliableQueued.Load(), ReliableFailed: c.reliableFailed.Load(),
		ReliableDeadLettered: c.reliableDeadLettered.Load(), UnknownPeer: c.unknownPeer.Load(),
		Dropped: c.dropped.Load(), Panics: c.panics.Load(), NoSuchActor: c.noSuchActor.Load(), Expired: c.expired.Load(),
		RefusedFull: c.refusedFull.Load(), DedupeHits: c.dedupeHits.Load(), OutOfOrder: c.outOfOrder.Load(), Forgotten: c.forgotten.Load(), Diverged: c.diverged.Load(),
		StoreFailed: c.storeFailed.Load(), Stopping: c.stopping.Load(), MemberEventsMissed: c.memberEventsMissed.Load(),
		SenderMismatch: c.senderMismatch.Load(), ResponsesRefused: n.responses.Stats().Refused,
		RefusedPeerBytes: c.refusedPeerBytes.Load(), Refused: n.transport.Refusals(),
		Streams: n.in.len(),
	}
	s.Forward = n.fwd.stats()
	if m := n.membership(); m != nil {
		s.Gossip = m.Traffic()
	}
	if s.AskOK > 0 {
		s.AskMeanLatency = time.Duration(c.askNanos.Load() / s.AskOK)
	}
	n.actorsMu.RLock()
	s.Actors = len(n.actors)
	n.actorsMu.RUnlock()
	return s
}

// ActorStats is one actor's mailbox.
type ActorStats struct {
	Name string
	mailbox.Stats
}

// ActorStats returns the mailbox of every actor, sorted by name.
func (n *Node) ActorStats() []ActorStats {
	n.actorsMu.RLock()
	out := make([]ActorStats, 0, len(n.actors))
	for name, a := range n.actors {
		out = append(out, ActorStats{Name: name, Stats: a.mb.Stats()})
	}
	n.actorsMu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// PeerStats returns frames and bytes exchanged with each peer.
func (n *Node) PeerStats() map[string]transport.PeerStats { return n.transport.PeerStats() }
