package pb_test

import (
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshnode/meshnode/mailbox/pb"
)

func digestEnv() *pb.Envelope {
	return &pb.Envelope{MsgId: "m-1", CreatedAtUnixMs: 1764900000000, Type: "order", IdempotencyKey: "k",
		Rpc: &pb.RpcMeta{CorrelationId: "c"}, Body: &anypb.Any{TypeUrl: "type.googleapis.com/x.Y", Value: []byte{1, 2, 3}},
		Sequence: 7, PrevSequence: 6, TtlMs: 500, Attempt: 2, StreamEpoch: 3}
}

// Receivers and senders of different releases compare digests (a
// receipt's watermark_digest): the digest of an envelope must not change
// between releases.
func TestStreamDigestIsStable(t *testing.T) {
	const golden = uint64(0x5509e63b12960a20)
	if got := pb.StreamDigest(digestEnv()); got != golden {
		t.Fatalf("StreamDigest = %#x, want %#x: receivers and senders of other releases would take copies for other messages", got, golden)
	}
}

// A copy (another emission of the same stored message) differs in msg id,
// TTL, attempt, its predecessor and epoch: same digest. Each field the
// sender stored makes another one.
func TestStreamDigestTellsCopiesFromOtherMessages(t *testing.T) {
	want := pb.StreamDigest(digestEnv())
	for name, edit := range map[string]func(e *pb.Envelope){
		"msg id":  func(e *pb.Envelope) { e.MsgId = "m-2" },
		"ttl":     func(e *pb.Envelope) { e.TtlMs = 9 },
		"attempt": func(e *pb.Envelope) { e.Attempt = 5 },
		"prev":    func(e *pb.Envelope) { e.PrevSequence = 0 },
		"epoch":   func(e *pb.Envelope) { e.StreamEpoch = 4 },
	} {
		e := digestEnv()
		edit(e)
		if got := pb.StreamDigest(e); got != want {
			t.Errorf("a copy with another %s: digest %#x, want %#x", name, got, want)
		}
	}
	for name, edit := range map[string]func(e *pb.Envelope){
		"created":        func(e *pb.Envelope) { e.CreatedAtUnixMs++ },
		"type":           func(e *pb.Envelope) { e.Type = "orders" },
		"key":            func(e *pb.Envelope) { e.IdempotencyKey = "" },
		"correlation id": func(e *pb.Envelope) { e.Rpc.CorrelationId = "d" },
		"body type":      func(e *pb.Envelope) { e.Body.TypeUrl += "Z" },
		"body":           func(e *pb.Envelope) { e.Body.Value = []byte{1, 2} },
		"type into key":  func(e *pb.Envelope) { e.Type, e.IdempotencyKey = "orderk", "" },
	} {
		e := proto.Clone(digestEnv()).(*pb.Envelope)
		edit(e)
		if got := pb.StreamDigest(e); got == want {
			t.Errorf("another %s: the same digest %#x", name, got)
		}
	}
	if d := pb.StreamDigest(&pb.Envelope{}); d == 0 || d == ^uint64(0) {
		t.Errorf("digest of an empty envelope %#x: 0 and MaxUint64 are kept for unknown and marked", d)
	}
}
