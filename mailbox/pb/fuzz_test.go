package pb_test

import (
	"testing"

	"github.com/meshnode/meshnode/mailbox/pb"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// seedFrames are valid frames of every kind, encoded.
func seedFrames(tb testing.TB) [][]byte {
	tb.Helper()
	body, err := anypb.New(&pb.Hello{NodeName: "payload"})
	if err != nil {
		tb.Fatal(err)
	}
	env := &pb.Envelope{
		ProtocolVersion: pb.ProtocolVersion, MsgId: "m1", IdempotencyKey: "k1",
		Sender: "a@n1", Recipient: "b@n2", CreatedAtUnixMs: 1700000000000, TtlMs: 60000,
		Type: "greeting", Headers: map[string]string{"meshnode-status-code": "2", "x": "y"}, Body: body,
		Rpc:      &pb.RpcMeta{Kind: pb.RpcMeta_REQUEST, Service: "s", Method: "m", CorrelationId: "c1", ReplyTo: "a@n1"},
		EventSeq: 7, Sequence: 42, Conflict: pb.Envelope_OVERWRITE, Attempt: 3, Receipt: pb.Envelope_RECEIPT_PROCESSED, PrevSequence: 41,
		StreamEpoch: 5, CoalesceKey: "hb",
	}
	frames := []*pb.Frame{
		{Kind: &pb.Frame_Hello{Hello: &pb.Hello{NodeName: "n1", BootId: "b", ProtocolVersions: pb.SupportedVersions(), Cluster: "c", OutboxId: make([]byte, 16), GoneConnection: 0x0123456789abcdef}}},
		{Kind: &pb.Frame_Envelope{Envelope: env}},
		{Kind: &pb.Frame_Receipt{Receipt: &pb.Receipt{MsgId: "m1", Code: pb.Receipt_CAPACITY, RetryAfterMs: 50, Message: "full", Watermark: 9}}},
		{Kind: &pb.Frame_Goaway{Goaway: &pb.GoAway{Code: 1, Reason: "shutdown"}}},
		{},
	}
	var out [][]byte
	for _, f := range frames {
		b, err := proto.Marshal(f)
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, b)
	}
	b, err := proto.Marshal(env)
	if err != nil {
		tb.Fatal(err)
	}
	return append(out, b) // an envelope alone, for FuzzUnmarshalEnvelope
}

// roundTrip checks that a message decoded from data survives re-encoding.
func roundTrip[M proto.Message](t *testing.T, data []byte, newM func() M) {
	m := newM()
	if err := proto.Unmarshal(data, m); err != nil {
		return // refusing bad bytes is fine; panicking is not
	}
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatalf("Marshal of a decoded message: %v", err)
	}
	m2 := newM()
	if err := proto.Unmarshal(b, m2); err != nil {
		t.Fatalf("Unmarshal of re-encoded message: %v", err)
	}
	if !proto.Equal(m, m2) {
		t.Fatalf("round trip differs:\n%v\n%v", m, m2)
	}
}

func FuzzUnmarshalFrame(f *testing.F) {
	for _, b := range seedFrames(f) {
		f.Add(b)
	}
	f.Add([]byte{0x12, 0xff, 0xff, 0xff, 0xff, 0x0f}) // huge length prefix
	f.Fuzz(func(t *testing.T, data []byte) {
		roundTrip(t, data, func() *pb.Frame { return &pb.Frame{} })
	})
}

func FuzzUnmarshalEnvelope(f *testing.F) {
	for _, b := range seedFrames(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		roundTrip(t, data, func() *pb.Envelope { return &pb.Envelope{} })
	})
}
