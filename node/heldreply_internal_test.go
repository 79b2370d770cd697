package node

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/meshnode/meshnode/mailbox/pb"
)

// reqEnv is a request envelope told apart by its correlation id.
func reqEnv(corr string) *pb.Envelope {
	return &pb.Envelope{CreatedAtUnixMs: 1, Rpc: &pb.RpcMeta{Kind: pb.RpcMeta_REQUEST, CorrelationId: corr}}
}

func heldMessage(body int) *pb.StoredMessage {
	return &pb.StoredMessage{Envelope: &pb.Envelope{MsgId: "m", Recipient: "rx@n0", Headers: map[string]string{"pad": string(bytes.Repeat([]byte{'x'}, body))}}}
}

// The replies kept for the disk are bounded in count and bytes: past
// either bound a reply is not kept (its request runs again when resent),
// and forgetting one makes room.
func TestHeldRepliesAreBounded(t *testing.T) {
	var h heldReplies
	peer := func(i int) string { return fmt.Sprint("p", i/maxHeldPerPeer) }
	for i := range maxHeldReplies {
		if !h.put(peer(i), "s", uint64(i+1), reqEnv("m"), heldMessage(1), nil) {
			t.Fatalf("reply %d of %d not kept", i+1, maxHeldReplies)
		}
	}
	if h.put("other", "s", maxHeldReplies+1, reqEnv("m"), heldMessage(1), nil) {
		t.Fatalf("kept a reply past the bound of %d", maxHeldReplies)
	}
	h.drop("s", 1)
	if h.get("s", 1, reqEnv("m")) != nil {
		t.Fatal("a dropped reply is still kept")
	}
	if !h.put("other", "s", maxHeldReplies+1, reqEnv("m"), heldMessage(1), nil) {
		t.Fatal("no room after a reply was dropped")
	}

	var b heldReplies
	big := maxHeldReplyBytes/4 - heldReplyOverheadB - 64
	for i := range 4 {
		if !b.put(peer(i*maxHeldPerPeer), "s", uint64(i+1), reqEnv("m"), heldMessage(big), nil) {
			t.Fatalf("reply %d of %d bytes not kept", i+1, big)
		}
	}
	if b.put("other", "s", 5, reqEnv("m"), heldMessage(big), nil) {
		t.Fatalf("kept %d bytes of replies, bound %d", 5*big, maxHeldReplyBytes)
	}
	b.drop("s", 2)
	if !b.put("other", "s", 5, reqEnv("m"), heldMessage(big), nil) {
		t.Fatal("no room after a reply was dropped")
	}
	if got := b.get("s", 5, reqEnv("m")); got == nil || got.sm.GetEnvelope().GetMsgId() != "m" {
		t.Fatalf("get = %+v, want the kept reply", got)
	}
	if b.n.Load() != 4 || b.bytes <= 0 {
		t.Fatalf("count %d bytes %d, want 4 and positive", b.n.Load(), b.bytes)
	}
}

// One requesting node keeps at most a quarter of the slots and of the
// bytes: a requester whose replies the disk refuses cannot take every slot
// from the others, whose handlers would then run again on every resend.
// Dropping one of its replies gives it room again.
func TestHeldRepliesAreBoundedPerRequester(t *testing.T) {
	var h heldReplies
	for i := range maxHeldPerPeer {
		if !h.put("greedy", "s", uint64(i+1), reqEnv("m"), heldMessage(1), nil) {
			t.Fatalf("reply %d of %d not kept", i+1, maxHeldPerPeer)
		}
	}
	if h.put("greedy", "s", maxHeldPerPeer+1, reqEnv("m"), heldMessage(1), nil) {
		t.Fatalf("one requester kept more than %d replies", maxHeldPerPeer)
	}
	if !h.put("other", "t", 1, reqEnv("m"), heldMessage(1), nil) {
		t.Fatal("another requester found no room")
	}
	h.drop("s", 1)
	if !h.put("greedy", "s", maxHeldPerPeer+1, reqEnv("m"), heldMessage(1), nil) {
		t.Fatal("no room for the requester after one of its replies was dropped")
	}

	var b heldReplies
	big := maxHeldPerPeerB/2 - heldReplyOverheadB - 64
	for i := range 2 {
		if !b.put("greedy", "s", uint64(i+1), reqEnv("m"), heldMessage(big), nil) {
			t.Fatalf("reply %d of %d bytes not kept", i+1, big)
		}
	}
	if b.put("greedy", "s", 3, reqEnv("m"), heldMessage(big), nil) {
		t.Fatalf("one requester kept %d bytes, bound %d", 3*big, maxHeldPerPeerB)
	}
	if !b.put("other", "t", 1, reqEnv("m"), heldMessage(big), nil) {
		t.Fatal("another requester found no room for its bytes")
	}
	b.drop("s", 1)
	b.drop("s", 2)
	b.drop("t", 1)
	if len(b.peers) != 0 || b.bytes != 0 {
		t.Fatalf("after dropping every reply: peers %v, bytes %d", b.peers, b.bytes)
	}
}

// A reply whose request has not come back for heldReplyTTL (its sender
// gave it up) is dropped, and its bytes with it.
func TestHeldReplyExpires(t *testing.T) {
	var h heldReplies
	h.put("p", "s", 1, reqEnv("m"), heldMessage(10), nil)
	h.put("p", "s", 2, reqEnv("m"), heldMessage(10), nil)
	h.mu.Lock()
	h.m[heldKey{"s", 1}].at = time.Now().Add(-heldReplyTTL - time.Second)
	h.swept = time.Time{}
	h.mu.Unlock()
	if h.get("s", 1, reqEnv("m")) != nil {
		t.Fatal("a reply kept past its TTL is still returned")
	}
	if h.get("s", 2, reqEnv("m")) == nil {
		t.Fatal("a fresh reply was dropped with the expired one")
	}
	if h.n.Load() != 1 || h.bytes != h.m[heldKey{"s", 2}].size {
		t.Fatalf("count %d bytes %d after expiry, want 1 and one reply's", h.n.Load(), h.bytes)
	}
}

// A reply is given only to the copy of its own request: another message at
// its place (a sender restored from a backup reuses sequences) drops it.
func TestHeldReplyIsOnlyForItsRequest(t *testing.T) {
	var h heldReplies
	h.put("p", "s", 1, reqEnv("A"), heldMessage(1), nil)
	if h.get("s", 1, reqEnv("A")) == nil {
		t.Fatal("the request's own copy did not get its reply")
	}
	other := reqEnv("A")
	other.Rpc = nil // a tell
	if h.get("s", 1, other) != nil {
		t.Fatal("another message at the request's place got its reply")
	}
	if h.get("s", 1, reqEnv("A")) != nil || h.n.Load() != 0 || h.bytes != 0 {
		t.Fatalf("the reply outlived another message at its place: count %d bytes %d", h.n.Load(), h.bytes)
	}
}
