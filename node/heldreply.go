package node

import (
	"crypto/sha256"
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
// bounded, in all and per requesting node (so that one requester cannot
// take every slot from the others); a reply that does not fit is not kept,
// and its request runs again when it comes back. A reply whose request has
// not come back for heldReplyTTL (its sender gave it up) is dropped.
type heldReplies struct {
	n     atomic.Int32 // len(m), read without the lock on every stream message
	mu    sync.Mutex
	m     map[heldKey]*heldReply
	bytes int
	peers map[string]heldUse // per requesting node; no entry while it has none kept
	swept time.Time          // the last look for expired replies
}

// heldUse is what one requesting node's kept replies take.
type heldUse struct{ n, bytes int }

// heldKey is a request's place: its stream's key and its sequence.
type heldKey struct {
	stream string
	seq    uint64
}

// heldReply is a reply its handler made, waiting to be stored.
type heldReply struct {
	req  [sha256.Size]byte // pb.RequestDigest of its request: another message at its place must run
	peer string            // the requesting node
	sm   *pb.StoredMessage
	herr error // the handler's permanent error (the reply carries it), or nil
	size int
	at   time.Time
}

// Bounds of the replies kept for requests whose reply could not be stored.
const (
	maxHeldReplies     = 1024
	maxHeldReplyBytes  = 16 << 20
	maxHeldPerPeer     = maxHeldReplies / 4 // a quarter of either bound per requesting node
	maxHeldPerPeerB    = maxHeldReplyBytes / 4
	heldReplyTTL       = time.Hour
	heldReplyOverheadB = 256 // a kept reply's bookkeeping, counted with its size
)

// get returns the reply kept for the request env at seq of stream, or
// nil. A reply kept for another message at that place is dropped: the
// sender's state went back (a restored backup) and handed the sequence to
// a new message, which must run.
func (h *heldReplies) get(stream string, seq uint64, env *pb.Envelope) *heldReply {
	if h.n.Load() == 0 {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.expireLocked(time.Now())
	k := heldKey{stream, seq}
	r := h.m[k]
	if r != nil && r.req != pb.RequestDigest(env) {
		h.removeLocked(k)
		return nil
	}
	return r
}

// touch marks r as wanted now: a copy of its request came, so its sender
// has not given it up, and its hour starts again.
func (h *heldReplies) touch(r *heldReply) {
	h.mu.Lock()
	r.at = time.Now()
	h.mu.Unlock()
}

// put keeps the reply sm (and the handler's error herr) of the request
// env from node peer at seq of stream, and reports whether it fit.
func (h *heldReplies) put(peer, stream string, seq uint64, env *pb.Envelope, sm *pb.StoredMessage, herr error) bool {
	size := proto.Size(sm) + heldReplyOverheadB
	h.mu.Lock()
	defer h.mu.Unlock()
	h.expireLocked(time.Now())
	k := heldKey{stream, seq}
	h.removeLocked(k) // another message's (get drops those; this is the handler's newer run)
	use := h.peers[peer]
	if len(h.m) >= maxHeldReplies || h.bytes+size > maxHeldReplyBytes ||
		use.n >= maxHeldPerPeer || use.bytes+size > maxHeldPerPeerB {
		return false
	}
	if h.m == nil {
		h.m, h.peers = map[heldKey]*heldReply{}, map[string]heldUse{}
	}
	h.m[k] = &heldReply{req: pb.RequestDigest(env), peer: peer, sm: sm, herr: herr, size: size, at: time.Now()}
	h.bytes += size
	h.peers[peer] = heldUse{use.n + 1, use.bytes + size}
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
		if use := h.peers[r.peer]; use.n > 1 {
			h.peers[r.peer] = heldUse{use.n - 1, use.bytes - r.size}
		} else {
			delete(h.peers, r.peer)
		}
		h.n.Store(int32(len(h.m)))
	}
}

// expireLocked drops the replies whose request has not come back for
// heldReplyTTL, looking at most once a minute.
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
