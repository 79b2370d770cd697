package mailbox

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshnode/meshnode/internal/badconfig"
	"github.com/meshnode/meshnode/mailbox/pb"
	"google.golang.org/protobuf/proto"
)

const registryShards = 16

// earlyOverhead is what one buffered early response costs beyond its
// encoded size (the entry, its map slots, the decoded message's headers):
// charged with it, so that many tiny responses are bounded too.
const earlyOverhead = 256

// RegistryConfig bounds a ResponseRegistry. Start from DefaultRegistryConfig.
type RegistryConfig struct {
	// TTL: a waiter not answered within it is pruned (its channel closed).
	TTL time.Duration
	// EarlyTTL: a response that found no waiter is kept this long for a
	// Register of its correlation id by the same peer, then dropped.
	EarlyTTL time.Duration
	// EarlyBytesPerPeer bounds the early responses kept from one peer
	// (encoded bytes plus a fixed overhead each); the peer's oldest go
	// first. 0 keeps none.
	EarlyBytesPerPeer int
	// EarlyBytes bounds the early responses of all peers together; over
	// it, the oldest of the peer holding the most go first.
	EarlyBytes int
}

// DefaultRegistryConfig returns a RegistryConfig with every field set.
func DefaultRegistryConfig() RegistryConfig {
	return RegistryConfig{
		TTL:               time.Minute,     // no ask waits longer without a deadline of its own
		EarlyTTL:          5 * time.Second, // a response that beats its Register does so by far less
		EarlyBytesPerPeer: 1 << 20,         // 1 MiB: one peer cannot make the buffer large
		EarlyBytes:        8 << 20,         // 8 MiB: nor can all of them together
	}
}

// Validate reports the first invalid field.
func (c RegistryConfig) Validate() error {
	switch {
	case c.TTL <= 0:
		return badconfig.New(ErrBadConfig, "registry TTL %v must be positive", c.TTL)
	case c.EarlyTTL <= 0:
		return badconfig.New(ErrBadConfig, "registry EarlyTTL %v must be positive", c.EarlyTTL)
	case c.EarlyBytesPerPeer < 0 || c.EarlyBytes < c.EarlyBytesPerPeer:
		return badconfig.New(ErrBadConfig, "registry needs 0 <= EarlyBytesPerPeer (%d) <= EarlyBytes (%d)",
			c.EarlyBytesPerPeer, c.EarlyBytes)
	}
	return nil
}

// ResponseRegistry matches ask responses to the goroutines waiting for
// them, by correlation id and by the peer that was asked: a response is
// handed to a waiter only when it comes from the peer the waiter named, so
// another member cannot answer in that peer's place. Waiters are sharded
// by a hash of the id so concurrent asks do not contend on one lock. It
// starts no goroutine: the owner calls Prune periodically. Safe for
// concurrent use.
//
// Lock order: a shard's mu before early.mu.
type ResponseRegistry struct {
	cfg     RegistryConfig
	shards  [registryShards]registryShard
	early   earlyBuffer
	refused atomic.Uint64 // responses from another peer than the waiter's
	dropped atomic.Uint64 // early responses dropped for room, or kept none
}

type waiter struct {
	ch   chan *pb.Envelope // buffered, empty when registered: Deliver never blocks
	at   time.Time         // registration time, for Prune
	peer string            // the only peer whose response this waiter takes
}

type registryShard struct {
	// mu guards the field below.
	mu      sync.Mutex
	waiters map[string]waiter
	_       [40]byte // keep shards' mutexes on separate cache lines
}

// earlyBuffer holds responses that found no waiter, charged to the peer
// that sent them.
type earlyBuffer struct {
	n atomic.Int64 // entries: Register skips the lock when there are none

	// mu guards the fields below.
	mu    sync.Mutex
	byKey map[earlyKey]*earlyEntry
	peers map[string]*earlyPeer
	bytes int
}

type earlyKey struct{ peer, id string }

type earlyEntry struct {
	key  earlyKey
	env  *pb.Envelope
	size int
	at   time.Time
	gone bool // taken, pruned or evicted; its slot in the peer's queue is stale
}

// earlyPeer is one peer's early responses, oldest first (with stale slots).
type earlyPeer struct {
	q     []*earlyEntry
	live  int
	bytes int
}

// NewResponseRegistry returns a registry bounded by cfg.
func NewResponseRegistry(cfg RegistryConfig) (*ResponseRegistry, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &ResponseRegistry{cfg: cfg}, nil
}

func (r *ResponseRegistry) shard(id string) *registryShard {
	// FNV-1a, inline so it does not allocate.
	h := uint32(2166136261)
	for i := 0; i < len(id); i++ {
		h ^= uint32(id[i])
		h *= 16777619
	}
	return &r.shards[h%registryShards]
}

// Register announces a waiter for correlationID that takes a response only
// from peer; call it before sending the request. The returned channel
// (buffer 1) receives the response. If that peer's response already
// arrived (buffered), it is in the channel at once. A channel whose waiter
// is pruned is closed (receive gives nil, false).
func (r *ResponseRegistry) Register(correlationID, peer string) (<-chan *pb.Envelope, error) {
	ch := make(chan *pb.Envelope, 1)
	if err := r.RegisterChan(correlationID, peer, ch); err != nil {
		return nil, err
	}
	return ch, nil
}

// RegisterChan is Register with a channel of the caller's: empty, with a
// buffer of at least 1. It receives one response, or is closed if its
// waiter is pruned. Once a response was received from it, the registry no
// longer holds it and the caller may register it again (one allocation
// less per ask); after Cancel it may still receive nothing or hold one.
func (r *ResponseRegistry) RegisterChan(correlationID, peer string, ch chan *pb.Envelope) error {
	if correlationID == "" {
		return fmt.Errorf("mailbox: register: %w", ErrEmptyCorrelation)
	}
	if cap(ch) == 0 || len(ch) != 0 {
		return fmt.Errorf("mailbox: register %q: the channel must be empty and buffered (cap %d, len %d)", correlationID, cap(ch), len(ch))
	}
	s := r.shard(correlationID)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.waiters[correlationID]; ok {
		return fmt.Errorf("mailbox: register %q: %w", correlationID, ErrDuplicateCorrelation)
	}
	if r.early.n.Load() > 0 {
		if env := r.early.take(earlyKey{peer, correlationID}); env != nil {
			select {
			case ch <- env:
				return nil
			default: // the caller filled its channel meanwhile: never block under the lock
				r.dropped.Add(1)
				return fmt.Errorf("mailbox: register %q: the channel filled before its response was put in it", correlationID)
			}
		}
	}
	if s.waiters == nil {
		s.waiters = make(map[string]waiter)
	}
	s.waiters[correlationID] = waiter{ch: ch, at: time.Now(), peer: peer}
	return nil
}

// Deliver hands env, a response that came from peer, to the waiter of
// env.Rpc.CorrelationId and returns true. A waiter that named another
// peer does not take it: it is refused (counted) and dropped. With no
// waiter it is kept for a later Register by the same peer, within the
// early-response bounds, and Deliver returns false. An envelope without a
// correlation id is neither delivered nor kept. Never blocks.
func (r *ResponseRegistry) Deliver(peer string, env *pb.Envelope) (delivered bool) {
	id := env.GetRpc().GetCorrelationId()
	if id == "" {
		return false
	}
	s := r.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	if w, ok := s.waiters[id]; ok {
		if w.peer != peer {
			r.refused.Add(1)
			return false
		}
		delete(s.waiters, id)
		select {
		case w.ch <- env: // one send per waiter into an empty buffer
			return true
		default: // a caller's channel that was not empty: never block
			r.dropped.Add(1)
			return false
		}
	}
	// Under the shard's lock, so a Register of this id either found the
	// waiter gone above or finds the response in the buffer.
	r.dropped.Add(uint64(r.early.put(r.cfg, earlyKey{peer, id}, env)))
	return false
}

// Cancel forgets the waiter of correlationID (timeout, cancel). The
// waiter's channel is not closed; a response that arrives later is kept
// as an early one until EarlyTTL.
func (r *ResponseRegistry) Cancel(correlationID string) {
	s := r.shard(correlationID)
	s.mu.Lock()
	delete(s.waiters, correlationID)
	s.mu.Unlock()
}

// ForgetPeer drops the early responses of peer (it left or restarted) and
// returns how many.
func (r *ResponseRegistry) ForgetPeer(peer string) int {
	b := &r.early
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.peers[peer]
	if p == nil {
		return 0
	}
	n := p.live
	for _, e := range p.q {
		if !e.gone {
			b.removeLocked(e)
		}
	}
	delete(b.peers, peer)
	return n
}

// Prune drops waiters registered before now-TTL and early responses that
// arrived before now-EarlyTTL, and returns how many of each it dropped.
// Pruned waiters' channels are closed.
func (r *ResponseRegistry) Prune(now time.Time) (waiters, buffered int) {
	cutoff := now.Add(-r.cfg.TTL)
	for i := range r.shards {
		s := &r.shards[i]
		s.mu.Lock()
		for id, w := range s.waiters {
			if w.at.Before(cutoff) {
				delete(s.waiters, id)
				close(w.ch)
				waiters++
			}
		}
		s.mu.Unlock()
	}
	return waiters, r.early.prune(now.Add(-r.cfg.EarlyTTL))
}

// Len returns how many waiters and buffered responses the registry holds.
func (r *ResponseRegistry) Len() (waiters, buffered int) {
	for i := range r.shards {
		s := &r.shards[i]
		s.mu.Lock()
		waiters += len(s.waiters)
		s.mu.Unlock()
	}
	return waiters, int(r.early.n.Load())
}

// RegistryStats describes a ResponseRegistry.
type RegistryStats struct {
	Waiters    int    // asks waiting
	Early      int    // responses kept for a Register
	EarlyBytes int    // their charged bytes
	Refused    uint64 // responses from another peer than the one asked
	Dropped    uint64 // responses without a waiter that were not kept, or evicted, or that found their waiter's channel full
}

// Stats returns a snapshot.
func (r *ResponseRegistry) Stats() RegistryStats {
	w, e := r.Len()
	r.early.mu.Lock()
	bytes := r.early.bytes
	r.early.mu.Unlock()
	return RegistryStats{Waiters: w, Early: e, EarlyBytes: bytes, Refused: r.refused.Load(), Dropped: r.dropped.Load()}
}

// take removes and returns the response key holds, or nil.
func (b *earlyBuffer) take(key earlyKey) *pb.Envelope {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.byKey[key]
	if e == nil {
		return nil
	}
	env := e.env
	b.removeLocked(e)
	return env
}

// put keeps env for key within cfg's bounds and returns how many
// responses were dropped for it (env itself included when it cannot be
// kept).
func (b *earlyBuffer) put(cfg RegistryConfig, key earlyKey, env *pb.Envelope) (dropped int) {
	size := proto.Size(env) + earlyOverhead
	if size > cfg.EarlyBytesPerPeer {
		return 1
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if old := b.byKey[key]; old != nil {
		b.removeLocked(old) // a second response to one id: the newest stays
		dropped++
	}
	p := b.peers[key.peer]
	if p == nil {
		if b.peers == nil {
			b.peers = make(map[string]*earlyPeer)
			b.byKey = make(map[earlyKey]*earlyEntry)
		}
		p = &earlyPeer{}
		b.peers[key.peer] = p
	}
	for p.bytes+size > cfg.EarlyBytesPerPeer {
		b.popOldestLocked(p)
		dropped++
	}
	for b.bytes+size > cfg.EarlyBytes {
		b.popOldestLocked(b.largestLocked())
		dropped++
	}
	b.peers[key.peer] = p // evicting its last response may have removed it
	e := &earlyEntry{key: key, env: env, size: size, at: time.Now()}
	b.byKey[key] = e
	p.q = append(p.q, e)
	p.live++
	p.bytes += size
	b.bytes += size
	b.n.Add(1)
	return dropped
}

// removeLocked drops e from the indexes; its queue slot goes stale.
func (b *earlyBuffer) removeLocked(e *earlyEntry) {
	e.gone = true
	e.env = nil
	delete(b.byKey, e.key)
	p := b.peers[e.key.peer]
	p.live--
	p.bytes -= e.size
	b.bytes -= e.size
	b.n.Add(-1)
	if p.live == 0 {
		delete(b.peers, e.key.peer)
	} else if len(p.q) > 2*p.live+16 {
		live := make([]*earlyEntry, 0, p.live)
		for _, x := range p.q {
			if !x.gone {
				live = append(live, x)
			}
		}
		p.q = live
	}
}

// popOldestLocked drops p's oldest live response.
func (b *earlyBuffer) popOldestLocked(p *earlyPeer) {
	for len(p.q) > 0 {
		e := p.q[0]
		p.q[0] = nil
		p.q = p.q[1:]
		if !e.gone {
			b.removeLocked(e)
			return
		}
	}
}

// largestLocked returns the peer charged the most bytes.
func (b *earlyBuffer) largestLocked() *earlyPeer {
	var best *earlyPeer
	for _, p := range b.peers {
		if best == nil || p.bytes > best.bytes {
			best = p
		}
	}
	return best
}

// prune drops responses that arrived before cutoff and returns how many.
func (b *earlyBuffer) prune(cutoff time.Time) (n int) {
	if b.n.Load() == 0 {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, p := range b.peers {
		for len(p.q) > 0 && p.live > 0 {
			e := p.q[0]
			if !e.gone && !e.at.Before(cutoff) {
				break
			}
			p.q[0] = nil
			p.q = p.q[1:]
			if !e.gone {
				b.removeLocked(e) // may delete p from peers: safe while ranging
				n++
			}
		}
	}
	return n
}
