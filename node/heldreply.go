package node

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshnode/meshnode/mailbox/pb"
	"google.golang.org/protobuf/proto"
)

// heldReplies keeps the replies of reliable requests whose handler ran but
// whose reply this node's disk refused to store (full or failing). The
// request is not acknowledged then, so its sender sends it again; the copy
// stores the reply made the first time instead of running the handler
// again, which would repeat its effects once per resend for as long as the
// disk stays full.
//
// They live in memory only: after a restart the request runs again, as any
// message that ran but could not be recorded does. The count and bytes are
// bounded; a reply that does not fit is not kept, and its request runs
// again when it comes back. A reply kept longer than heldReplyTTL (its
// sender gave the request up) is dropped.
type heldReplies struct {
	n     atomic.Int32 // len(m), read without the lock on every stream message
	mu    sync.Mutex
	m     map[heldKey]*heldReply
	bytes int
	swept time.Time // the last look for expired replies
}

// heldKey is a request's place: its stream's key and its sequence.
type heldKey struct {
	stream string
	seq    uint64
}

// heldReply is a reply its handler made, waiting to be stored.
type heldReply struct {
	sm   *pb.StoredMessage
	herr error // the handler's permanent error (the reply carries it), or nil
	size int
	at   time.Time
}

// Bounds of the replies kept for requests whose reply could not be stored.
const (
	maxHeldReplies     = 1024
	maxHeldReplyBytes  = 16 << 20
	heldReplyTTL       = time.Hour
	heldReplyOverheadB = 256 // a kept reply's bookkeeping, counted with its size
)

// get returns the reply kept for the request at seq of stream, or nil.
func (h *heldReplies) get(stream string, seq uint64) *heldReply {
	if h.n.Load() == 0 {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.expireLocked(time.Now())
	return h.m[heldKey{stream, seq}]
}

// put keeps r for the request at seq of stream and reports whether it fit.
func (h *heldReplies) put(stream string, seq uint64, sm *pb.StoredMessage, herr error) bool {
	size := proto.Size(sm) + heldReplyOverheadB
	h.mu.Lock()
	defer h.mu.Unlock()
	now := time.Now()
	h.expireLocked(now)
	k := heldKey{stream, seq}
	if old := h.m[k]; old != nil {
		old.at = now // kept already (a copy met the full disk again)
		return true
	}
	if len(h.m) >= maxHeldReplies || h.bytes+size > maxHeldReplyBytes {
		return false
	}
	if h.m == nil {
		h.m = map[heldKey]*heldReply{}
	}
	h.m[k] = &heldReply{sm: sm, herr: herr, size: size, at: now}
	h.bytes += size
	h.n.Store(int32(len(h.m)))
	return true
}

// drop forgets the reply kept for the request at seq of stream, if any.
func (h *heldReplies) drop(stream string, seq uint64) {
	if h.n.Load() == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.removeLocked(heldKey{stream, seq})
}

func (h *heldReplies) removeLocked(k heldKey) {
	if r := h.m[k]; r != nil {
		delete(h.m, k)
		h.bytes -= r.size
		h.n.Store(int32(len(h.m)))
	}
}

// expireLocked drops the replies kept longer than heldReplyTTL, looking
// at most once a minute.
func (h *heldReplies) expireLocked(now time.Time) {
	if now.Sub(h.swept) < time.Minute {
		return
	}
	h.swept = now
	for k, r := range h.m {
		if now.Sub(r.at) > heldReplyTTL {
			h.removeLocked(k)
		}
	}
}
