package testnet

import "github.com/meshnode/meshnode/testnet/internal/faultnet"

// Network is the fault-injecting network shared by a cluster's nodes: it
// wraps every node's QUIC socket and memberlist transport, so gossip and
// data see the same faults. Its verbs take node names: Cut(a, b),
// Isolate(n), Partition(groups ...[]string), Drop(from, to, p),
// Delay(from, to, d), Heal(). Use it alone (NewNetwork, WrapPacketConn,
// WrapTransport) or through a Cluster's by-index verbs.
type Network = faultnet.Network

// NewNetwork returns a healed network; random drops are drawn from seed.
func NewNetwork(seed uint64) *Network { return faultnet.New(seed) }

// ErrCut is what a memberlist stream across a cut link fails with.
var ErrCut = faultnet.ErrCut
