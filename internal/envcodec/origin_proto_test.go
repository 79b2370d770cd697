package envcodec

import (
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/meshnode/meshnode/mailbox/pb"
)

// For any bytes proto decodes as an envelope, what CutOrigin says gives
// back the same envelope the way a lane's receiver puts it together: the
// envelope without its identity (the origin's tag, its new length, the
// rest) decoded by proto, its origin saying none of the three fields,
// and the identity decoded as an OriginName, put into that origin.
func FuzzCutOriginAgainstProto(f *testing.F) {
	seed := func(env *pb.Envelope) {
		b, err := proto.Marshal(env)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	seed(&pb.Envelope{MsgId: "m", Origin: &pb.Origin{Node: "o", OutboxId: []byte("0123456789abcdef"), Certificate: []byte("cert"), Signature: []byte("s")}})
	seed(&pb.Envelope{Sender: "a", Origin: &pb.Origin{Certificate: []byte("cert")}})
	seed(&pb.Envelope{Sender: "a", Origin: &pb.Origin{Node: "o"}})
	f.Add([]byte{0xaa, 0x01, 0x06, 0x0a, 0x01, 'o', 0x22, 0x01, 's'})
	f.Add([]byte{0xaa, 0x01, 0x08, 0x0a, 0x01, 'o', 0x1a, 0x01, 'c', 0x20, 0x01})
	f.Fuzz(func(t *testing.T, b []byte) {
		var want pb.Envelope
		if proto.Unmarshal(b, &want) != nil {
			return
		}
		at, from, to, end, ok := CutOrigin(b)
		if !ok {
			return
		}
		cut := append([]byte(nil), b[:at]...)
		cut = protowire.AppendTag(cut, 21, protowire.BytesType)
		cut = protowire.AppendVarint(cut, uint64(end-to))
		cut = append(cut, b[to:]...)
		var got pb.Envelope
		if err := proto.Unmarshal(cut, &got); err != nil {
			t.Fatalf("the envelope without its identity does not decode: %v", err)
		}
		var on pb.OriginName
		if err := proto.Unmarshal(b[from:to], &on); err != nil {
			t.Fatalf("the identity does not decode as an OriginName: %v", err)
		}
		o := got.GetOrigin()
		if o == nil {
			t.Fatal("no origin left to name")
		}
		if o.GetNode() != "" || len(o.GetOutboxId()) > 0 || len(o.GetCertificate()) > 0 {
			t.Fatalf("the rest of the origin says an identity field: %v", o)
		}
		if len(on.ProtoReflect().GetUnknown()) > 0 || on.GetRef() != 0 {
			t.Fatalf("the identity holds more than node, outbox id and certificate: %x", b[from:to])
		}
		o.Node, o.OutboxId, o.Certificate = on.GetNode(), on.GetOutboxId(), on.GetCertificate()
		if !proto.Equal(&got, &want) {
			t.Fatalf("put back together:\n%v\nproto:\n%v", &got, &want)
		}
	})
}
