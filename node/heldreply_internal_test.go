package node

import (
	"bytes"
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
	for i := range maxHeldReplies {
		if !h.put("s", uint64(i+1), reqEnv("m"), heldMessage(1), nil) {
			t.Fatalf("reply %d of %d not kept", i+1, maxHeldReplies)
		}
	}
	if h.put("s", maxHeldReplies+1, reqEnv("m"), heldMessage(1), nil) {
		t.Fatalf("kept a reply past the bound of %d", maxHeldReplies)
	}
	h.drop("s", 1)
	if h.get("s", 1, reqEnv("m")) != nil {
		t.Fatal("a dropped reply is still kept")
	}
	if !h.put("s", maxHeldReplies+1, reqEnv("m"), heldMessage(1), nil) {
		t.Fatal("no room after a reply was dropped")
	}

	var b heldReplies
	big := maxHeldReplyBytes / 4
	for i := range 3 {
		if !b.put("s", uint64(i+1), reqEnv("m"), heldMessage(big), nil) {
			t.Fatalf("reply %d of %d bytes not kept", i+1, big)
		}
	}
	if b.put("s", 4, reqEnv("m"), heldMessage(big), nil) {
		t.Fatalf("kept %d bytes of replies, bound %d", 4*big, maxHeldReplyBytes)
	}
	b.drop("s", 2)
	if !b.put("s", 4, reqEnv("m"), heldMessage(big), nil) {
		t.Fatal("no room after a reply was dropped")
	}
	if got := b.get("s", 4, reqEnv("m")); got == nil || got.sm.GetEnvelope().GetMsgId() != "m" {
		t.Fatalf("get = %+v, want the kept reply", got)
	}
	if b.n.Load() != 3 || b.bytes <= 0 {
		t.Fatalf("count %d bytes %d, want 3 and positive", b.n.Load(), b.bytes)
	}
}

// A reply whose request has not come back for heldReplyTTL (its sender
// gave it up) is dropped, and its bytes with it.
func TestHeldReplyExpires(t *testing.T) {
	var h heldReplies
	h.put("s", 1, reqEnv("m"), heldMessage(10), nil)
	h.put("s", 2, reqEnv("m"), heldMessage(10), nil)
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
	h.put("s", 1, reqEnv("A"), heldMessage(1), nil)
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
