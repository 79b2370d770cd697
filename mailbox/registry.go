package mailbox

import (
	"fmt"
	"sync"
	"time"

	"github.com/meshnode/meshnode/mailbox/pb"
)

const (
	registryShards = 16
	// MaxBufferedResponses bounds the early responses a ResponseRegistry
	// keeps (split evenly over its shards; the oldest of a shard is evicted).
	MaxBufferedResponses = 10000
	perShardBuffered     = MaxBufferedResponses / registryShards
	defaultRegistryTTL   = time.Minute
)

// ResponseRegistry matches ask responses to the goroutines waiting for them,
// by correlation id. It is sharded by a hash of the id so concurrent asks do
// not contend on one lock. It starts no goroutine: the owner calls Prune
// periodically. Safe for concurrent use.
type ResponseRegistry struct {
	ttl    time.Duration
	shards [registryShards]registryShard
}

type waiter struct {
	ch chan *pb.Envelope // buffer 1: Deliver never blocks
	at time.Time         // registration time, for Prune
}

type buffered struct {
	env *pb.Envelope
	at  time.Time // arrival time, for Prune
	seq uint64    // matches the entry in order
}

type orderEntry struct {
	id  string
	seq uint64
}

type registryShard struct {
	// mu guards the fields below.
	mu      sync.Mutex
	waiters map[string]waiter
	early   map[string]buffered
	// order lists buffered ids oldest first; entries whose seq no longer
	// matches early[id] are stale (consumed) and skipped.
	order []orderEntry
	seq   uint64
	_     [40]byte // keep shards' mutexes on separate cache lines
}

// NewResponseRegistry returns a registry whose entries expire after ttl
// (ttl <= 0 means one minute) when Prune runs.
func NewResponseRegistry(ttl time.Duration) *ResponseRegistry {
	if ttl <= 0 {
		ttl = defaultRegistryTTL
	}
	return &ResponseRegistry{ttl: ttl}
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

// Register announces a waiter for correlationID; call it before sending the
// request. The returned channel (buffer 1) receives the response. If the
// response already arrived (buffered), it is in the channel at once. A
// channel whose waiter is pruned is closed (receive gives nil, false).
func (r *ResponseRegistry) Register(correlationID string) (<-chan *pb.Envelope, error) {
	if correlationID == "" {
		return nil, fmt.Errorf("mailbox: register: %w", ErrEmptyCorrelation)
	}
	s := r.shard(correlationID)
	ch := make(chan *pb.Envelope, 1)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.waiters[correlationID]; ok {
		return nil, fmt.Errorf("mailbox: register %q: %w", correlationID, ErrDuplicateCorrelation)
	}
	if b, ok := s.early[correlationID]; ok {
		delete(s.early, correlationID)
		ch <- b.env
		return ch, nil
	}
	if s.waiters == nil {
		s.waiters = make(map[string]waiter)
	}
	s.waiters[correlationID] = waiter{ch: ch, at: time.Now()}
	return ch, nil
}

// Deliver hands env to the waiter of env.Rpc.CorrelationId and returns
// true. With no waiter it buffers env for a later Register (at most
// MaxBufferedResponses; the oldest are evicted) and returns false. An
// envelope without a correlation id is neither delivered nor buffered.
// Never blocks.
func (r *ResponseRegistry) Deliver(env *pb.Envelope) (delivered bool) {
	id := env.GetRpc().GetCorrelationId()
	if id == "" {
		return false
	}
	s := r.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	if w, ok := s.waiters[id]; ok {
		delete(s.waiters, id)
		w.ch <- env // buffer 1 and one send per waiter: never blocks
		return true
	}
	if s.early == nil {
		s.early = make(map[string]buffered)
	}
	s.seq++
	s.early[id] = buffered{env: env, at: time.Now(), seq: s.seq}
	s.order = append(s.order, orderEntry{id: id, seq: s.seq})
	for len(s.early) > perShardBuffered {
		s.popOldestLocked()
	}
	if len(s.order) > 2*perShardBuffered+16 {
		s.compactLocked()
	}
	return false
}

// popOldestLocked evicts the oldest live buffered entry.
func (s *registryShard) popOldestLocked() {
	for len(s.order) > 0 {
		e := s.order[0]
		s.order[0] = orderEntry{}
		s.order = s.order[1:]
		if b, ok := s.early[e.id]; ok && b.seq == e.seq {
			delete(s.early, e.id)
			return
		}
	}
}

// compactLocked drops stale order entries so order stays bounded.
func (s *registryShard) compactLocked() {
	live := make([]orderEntry, 0, len(s.early))
	for _, e := range s.order {
		if b, ok := s.early[e.id]; ok && b.seq == e.seq {
			live = append(live, e)
		}
	}
	s.order = live
}

// Cancel forgets the waiter of correlationID (timeout, cancel) and any
// response buffered for it. The waiter's channel is not closed.
func (r *ResponseRegistry) Cancel(correlationID string) {
	s := r.shard(correlationID)
	s.mu.Lock()
	delete(s.waiters, correlationID)
	delete(s.early, correlationID)
	s.mu.Unlock()
}

// Prune drops waiters registered and responses buffered before now-ttl, and
// returns how many of each it dropped. Pruned waiters' channels are closed.
func (r *ResponseRegistry) Prune(now time.Time) (waiters, buffered int) {
	cutoff := now.Add(-r.ttl)
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
		// order is oldest first, so stop at the first live young entry.
		for len(s.order) > 0 {
			e := s.order[0]
			b, ok := s.early[e.id]
			live := ok && b.seq == e.seq
			if live && !b.at.Before(cutoff) {
				break
			}
			if live {
				delete(s.early, e.id)
				buffered++
			}
			s.order[0] = orderEntry{}
			s.order = s.order[1:]
		}
		if len(s.early) == 0 {
			s.early, s.order = nil, nil // release memory after a burst
		}
		s.mu.Unlock()
	}
	return waiters, buffered
}

// Len returns how many waiters and buffered responses the registry holds.
func (r *ResponseRegistry) Len() (waiters, buffered int) {
	for i := range r.shards {
		s := &r.shards[i]
		s.mu.Lock()
		waiters += len(s.waiters)
		buffered += len(s.early)
		s.mu.Unlock()
	}
	return waiters, buffered
}
