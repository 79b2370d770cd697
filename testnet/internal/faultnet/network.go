// Package faultnet is a fault-injecting network for in-process clusters: it
// wraps each node's QUIC net.PacketConn and memberlist transport so that
// gossip and data see the same cuts, drops and delays.
//
// Addresses are mapped to node names: a wrapper registers the local address
// of what it wraps under its node's name at once, so every packet from or to
// a wrapped socket is attributed to a node. Packets between addresses the
// network does not know pass untouched.
//
// Faults are directed links (from, to). Cut blocks both directions; Drop and
// Delay apply to one direction. Memberlist streams (TCP push-pull) are
// reliable by contract, so Drop does not apply to them: a stream is refused
// at dial, and an open one fails on its next read or write, when either
// direction between its two nodes is blocked.
package faultnet

import (
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

type link struct{ from, to string }

// Network is the shared fault state of one cluster. All methods are safe
// for concurrent use. The zero value is not usable; call New.
type Network struct {
	// mu guards the fields below.
	mu       sync.RWMutex
	names    map[string]string // normalised "ip:port" -> node name
	blocked  map[link]bool     // Cut / Partition
	isolated map[string]bool   // Isolate
	drop     map[link]float64  // Drop probability per directed link
	delay    map[link]time.Duration

	// rngMu guards the field below (apart from mu so the packet path only
	// takes mu for reading).
	rngMu sync.Mutex
	rng   *rand.Rand

	dropped, delivered atomic.Uint64 // packets between known nodes, for tests and reports
}

// New returns a healed network whose random drops are drawn from seed.
func New(seed uint64) *Network {
	return &Network{
		names:    make(map[string]string),
		blocked:  make(map[link]bool),
		isolated: make(map[string]bool),
		drop:     make(map[link]float64),
		delay:    make(map[link]time.Duration),
		rng:      rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
	}
}

// normalise maps an address to the key of the names table; an unspecified
// IP (0.0.0.0, ::) is treated as loopback, where in-process nodes live.
func normalise(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return addr
	}
	if ip.IsUnspecified() {
		ip = net.IPv4(127, 0, 0, 1)
	}
	if v4 := ip.To4(); v4 != nil {
		ip = v4
	}
	return net.JoinHostPort(ip.String(), port)
}

// Register maps addr (host:port, UDP or TCP) to node name. Wrappers do this
// for their own sockets; call it for sockets the network cannot see.
func (n *Network) Register(name, addr string) {
	n.mu.Lock()
	n.names[normalise(addr)] = name
	n.mu.Unlock()
}

// NameOf returns the node name registered for addr.
func (n *Network) NameOf(addr string) (string, bool) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	if name, ok := n.names[addr]; ok { // fast path: already normal (the packet path)
		return name, true
	}
	name, ok := n.names[normalise(addr)]
	return name, ok
}

// Cut blocks both directions between a and b.
func (n *Network) Cut(a, b string) {
	n.mu.Lock()
	n.blocked[link{a, b}] = true
	n.blocked[link{b, a}] = true
	n.mu.Unlock()
}

// Isolate blocks every link of node, in both directions, including to nodes
// that register later.
func (n *Network) Isolate(node string) {
	n.mu.Lock()
	n.isolated[node] = true
	n.mu.Unlock()
}

// Partition blocks every link between nodes of different groups. Nodes not
// named in any group keep talking to everyone. It adds to earlier faults;
// call Heal first to replace them.
func (n *Network) Partition(groups ...[]string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for i, g := range groups {
		for j, h := range groups {
			if i == j {
				continue
			}
			for _, a := range g {
				for _, b := range h {
					n.blocked[link{a, b}] = true
				}
			}
		}
	}
}

// Drop loses packets from -> to with probability p (one direction).
func (n *Network) Drop(from, to string, p float64) error {
	if p < 0 || p > 1 || p != p {
		return ErrBadProbability
	}
	n.mu.Lock()
	n.drop[link{from, to}] = p
	n.mu.Unlock()
	return nil
}

// Delay holds packets from -> to for d before sending them (one direction).
func (n *Network) Delay(from, to string, d time.Duration) error {
	if d < 0 {
		return ErrBadDelay
	}
	n.mu.Lock()
	n.delay[link{from, to}] = d
	n.mu.Unlock()
	return nil
}

// Heal removes every fault.
func (n *Network) Heal() {
	n.mu.Lock()
	clear(n.blocked)
	clear(n.isolated)
	clear(n.drop)
	clear(n.delay)
	n.mu.Unlock()
}

// Blocked reports whether from -> to is cut (by Cut, Isolate or Partition).
func (n *Network) Blocked(from, to string) bool {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.blockedLocked(from, to)
}

func (n *Network) blockedLocked(from, to string) bool {
	if from == to {
		return false
	}
	return n.isolated[from] || n.isolated[to] || n.blocked[link{from, to}]
}

// Stats returns how many packets between known nodes were dropped
// (cut or random) and passed.
func (n *Network) Stats() (dropped, delivered uint64) {
	return n.dropped.Load(), n.delivered.Load()
}

// verdict decides the fate of one packet from -> to: drop it, or send it
// after delay (0 = now). Unknown endpoints ("") always pass.
func (n *Network) verdict(from, to string) (drop bool, delay time.Duration) {
	if from == "" || to == "" {
		return false, 0
	}
	n.mu.RLock()
	blocked := n.blockedLocked(from, to)
	p := n.drop[link{from, to}]
	delay = n.delay[link{from, to}]
	n.mu.RUnlock()
	if !blocked && p > 0 {
		n.rngMu.Lock()
		blocked = n.rng.Float64() < p
		n.rngMu.Unlock()
	}
	if blocked {
		n.dropped.Add(1)
	} else {
		n.delivered.Add(1)
	}
	return blocked, delay
}

// streamBlocked reports whether a stream between a and b must fail: a TCP
// stream needs both directions.
func (n *Network) streamBlocked(a, b string) bool {
	if a == "" || b == "" {
		return false
	}
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.blockedLocked(a, b) || n.blockedLocked(b, a)
}
