package node

import (
	"time"

	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/mailbox/pb"
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

// RelayDelivered returns how many messages the relay acked after a
// positive receipt: it counts an emission once its ack is recorded and the
// stream may make a direct attempt again.
func (n *Node) RelayDelivered() uint64 { return n.relay.Stats().Delivered }
