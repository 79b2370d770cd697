package envcodec

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/meshnode/meshnode/mailbox/pb"
)

// Marshal writes what proto.Marshal writes, through the codec or, for what
// the codec declines, through proto, and leaves the room asked for.
func TestMarshalMatchesProto(t *testing.T) {
	fast := &pb.Envelope{MsgId: "id", Recipient: "a@n", Sequence: 9, Headers: map[string]string{"b": "2", "a": "1"},
		Body: &anypb.Any{TypeUrl: "type.googleapis.com/x", Value: []byte{1, 2, 3}}, Rpc: &pb.RpcMeta{Kind: pb.RpcMeta_REQUEST, ReplyTo: "r@m"}}
	unknown := &pb.Envelope{Recipient: "a@n"}
	unknown.ProtoReflect().SetUnknown([]byte{0xb8, 0x01, 0x01}) // field 23, varint
	origin := &pb.Envelope{Recipient: "a@n", Origin: &pb.Origin{Node: "n0"}}
	for name, env := range map[string]*pb.Envelope{"fast": fast, "unknown field": unknown, "origin": origin} {
		if _, ok := Size(env); ok != (name == "fast") {
			t.Fatalf("%s: Size ok = %v", name, ok)
		}
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(env)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Marshal(env, 11)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s: Marshal = %x, proto = %x", name, got, want)
		}
		if cap(got)-len(got) < 11 {
			t.Fatalf("%s: %d bytes of room, want 11", name, cap(got)-len(got))
		}
	}
	if _, err := Marshal(&pb.Envelope{Recipient: "\xff"}, 0); err == nil {
		t.Fatal("Marshal accepted invalid UTF-8; proto refuses it")
	}
}
