package node

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshnode/meshnode/mailbox/pb"
)

// Memory held for a peer is bounded in bytes and charged to that peer. A
// message from another node costs its size (envBytes) from the moment it is
// posted to a mailbox until its handler returned or it was dropped:
//
//   - each mailbox holds at most Config.MailboxBytes (or WithMailboxBytes)
//     of queued messages besides its count bound;
//   - all mailboxes together hold at most Config.PeerQueuedBytes of one
//     peer's messages; past it, that peer's messages are refused as if the
//     mailbox were full (CAPACITY, uncounted by reliable senders), while
//     other peers' messages still get in.
//
// Local messages are not charged to a peer: they are the application's
// own values, passed by pointer, and a mailbox counts only their envelope.

// peerCharges holds the bytes each peer has queued in mailboxes now.
type peerCharges struct {
	m sync.Map // node name -> *atomic.Int64
}

// take charges size to peer within limit and returns the counter to give
// it back to, or nil when the peer is at its bound. One message always
// fits a peer that holds nothing, so any message can get through.
func (c *peerCharges) take(peer string, size, limit int64) *atomic.Int64 {
	v, ok := c.m.Load(peer)
	if !ok {
		v, _ = c.m.LoadOrStore(peer, new(atomic.Int64))
	}
	ctr := v.(*atomic.Int64)
	for {
		cur := ctr.Load()
		if cur > 0 && cur+size > limit {
			return nil
		}
		if ctr.CompareAndSwap(cur, cur+size) {
			return ctr
		}
	}
}

// forget drops peer's counter when it holds nothing. A take that loaded
// the counter before it went charges a counter nobody else sees: at most
// one message's bytes escape the bound, for a peer that had left.
func (c *peerCharges) forget(peer string) {
	if v, ok := c.m.Load(peer); ok && v.(*atomic.Int64).Load() == 0 {
		c.m.CompareAndDelete(peer, v)
	}
}

// len returns how many peers have a counter (for tests).
func (c *peerCharges) len() int {
	n := 0
	c.m.Range(func(any, any) bool { n++; return true })
	return n
}

// charge charges d to the peer it came from; false means the peer is at
// its bound and d must be refused.
func (n *Node) charge(d *delivery, peer string) bool {
	size := envBytes(d.env)
	ctr := n.charges.take(peer, size, n.cfg.PeerQueuedBytes)
	if ctr == nil {
		n.stats.refusedPeerBytes.Add(1)
		return false
	}
	d.charged, d.size = ctr, size
	return true
}

// peerRoom is how many more messages of size bytes peer may queue at this
// node within PeerQueuedBytes (this node's own: no bound).
func (n *Node) peerRoom(peer string, size int64) int {
	if peer == n.name || size <= 0 {
		return math.MaxInt
	}
	var used int64
	if v, ok := n.charges.m.Load(peer); ok {
		used = v.(*atomic.Int64).Load()
	}
	return int(min(max((n.cfg.PeerQueuedBytes-used)/size, 0), math.MaxInt)) // an int may have 32 bits
}

// uncharge gives d's bytes back to its peer once it was handled or
// dropped. A delivery is touched by one goroutine at a time (the mailbox
// hands it over), and a second call does nothing.
func (d *delivery) uncharge() {
	if d.charged != nil {
		d.charged.Add(-d.size)
		d.charged = nil
	}
}

// peerFullRetry is the retry hint of a message refused because its peer
// holds too much here: about the time a mailbox takes to drain some.
const peerFullRetry = 100 * time.Millisecond

// deliverySize is what a delivery costs against its mailbox's MaxBytes:
// what it was charged to its peer, counted once at its arrival (the
// mailbox asks at post and again at pop), else its envelope's size.
func deliverySize(d *delivery) int64 {
	if d.size > 0 {
		return d.size
	}
	return envBytes(d.env)
}

// envOverhead is what a decoded envelope costs beyond its strings and
// bytes: the structs, the map, the delivery.
const envOverhead = 512

// envBytes estimates the memory a received envelope holds: its strings,
// header entries and body, plus the fixed overhead. Cheap: lengths only.
func envBytes(env *pb.Envelope) int64 {
	n := envOverhead + len(env.GetMsgId()) + len(env.GetIdempotencyKey()) + len(env.GetSender()) +
		len(env.GetRecipient()) + len(env.GetType()) + len(env.GetCoalesceKey())
	for k, v := range env.GetHeaders() {
		n += len(k) + len(v) + 48 // a map slot and two string headers
	}
	if b := env.GetBody(); b != nil {
		n += len(b.GetTypeUrl()) + cap(b.GetValue())
	}
	if r := env.GetRpc(); r != nil {
		n += len(r.GetService()) + len(r.GetMethod()) + len(r.GetCorrelationId()) + len(r.GetReplyTo())
	}
	return int64(n)
}

// WithMailboxBytes bounds the actor's mailbox by the bytes of the messages
// queued in it as well as by their count (Config.MailboxBytes by default;
// 0 removes the byte bound).
func WithMailboxBytes(n int64) SpawnOption {
	return func(o *spawnOptions) { o.bytes = n }
}
