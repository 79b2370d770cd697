package transport

import (
	"bufio"
	"bytes"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/mailbox/pb"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// nameFrame is the frame naming ref url, as a lane writes it.
func nameFrame(ref uint32, url string) []byte {
	return append(appendTypeNameHead(nil, ref, len(url)), url...)
}

// routeFrame is the frame naming route ref, as a lane writes it.
func routeFrame(ref uint32, sender, recipient string) []byte {
	fields := protowire.AppendString(protowire.AppendTag(nil, 4, protowire.BytesType), sender)
	fields = protowire.AppendString(protowire.AppendTag(fields, 5, protowire.BytesType), recipient)
	b := appendRef(appendCopiedNameHead(nil, frameFieldRouteName, routeNameFieldRef, ref, len(fields)), routeNameFieldRef, ref)
	return append(b, fields...)
}

// A lane's frame naming a route is the one proto writes for that
// RouteName.
func TestRouteNameFrameIsProtos(t *testing.T) {
	for _, tc := range []struct {
		ref               uint32
		sender, recipient string
	}{{1, "a@n0", "sink@n1"}, {300, strings.Repeat("s", 200), strings.Repeat("r", maxRouteBytes-200)}, {64, "x", "y"}} {
		want, err := AppendFrame(nil, &pb.Frame{Kind: &pb.Frame_RouteName{RouteName: &pb.RouteName{Ref: tc.ref, Sender: tc.sender, Recipient: tc.recipient}}})
		if err != nil {
			t.Fatal(err)
		}
		got := routeFrame(tc.ref, tc.sender, tc.recipient)
		if !bytes.Equal(got, want) {
			t.Fatalf("ref %d: wrote\n%x\nproto writes\n%x", tc.ref, got, want)
		}
		fields := protowire.SizeTag(4) + protowire.SizeBytes(len(tc.sender)) + protowire.SizeTag(5) + protowire.SizeBytes(len(tc.recipient))
		if n := copiedNameSize(frameFieldRouteName, routeNameFieldRef, tc.ref, fields); n != len(want) {
			t.Fatalf("ref %d: sized %d bytes, wrote %d", tc.ref, n, len(want))
		}
	}
}

// A lane's frame naming a type is the one proto writes for that TypeName.
func TestTypeNameFrameIsProtos(t *testing.T) {
	for _, tc := range []struct {
		ref uint32
		url string
	}{{1, "type.googleapis.com/google.protobuf.BytesValue"}, {200, strings.Repeat("u", maxNameBytes)}, {64, "x"}} {
		want, err := AppendFrame(nil, &pb.Frame{Kind: &pb.Frame_TypeName{TypeName: &pb.TypeName{Ref: tc.ref, Url: tc.url}}})
		if err != nil {
			t.Fatal(err)
		}
		if got := nameFrame(tc.ref, tc.url); !bytes.Equal(got, want) {
			t.Fatalf("ref %d: wrote\n%x\nproto writes\n%x", tc.ref, got, want)
		}
	}
}

// Whatever bytes a lane stream carries, reading them frame by frame and
// applying names never panics; every envelope that comes out named says
// a type the stream named, and reading stops at the first bad frame.
func FuzzLaneNames(f *testing.F) {
	env, err := proto.Marshal(&pb.Envelope{MsgId: "m", Recipient: "a@n", Body: &anypb.Any{Value: []byte{1}}})
	if err != nil {
		f.Fatal(err)
	}
	named := func(ref, route uint32, e *pb.Envelope) []byte {
		b, err := AppendFrame(nil, &pb.Frame{Kind: &pb.Frame_Envelope{Envelope: e}, BodyType: ref, Route: route})
		if err != nil {
			f.Fatal(err)
		}
		return b
	}
	plain := func() *pb.Envelope { return &pb.Envelope{MsgId: "m", Body: &anypb.Any{Value: []byte{1}}} }
	routed := func() *pb.Envelope {
		return &pb.Envelope{MsgId: "m", Body: &anypb.Any{TypeUrl: "t/x", Value: []byte{1}}}
	}
	full := func() *pb.Envelope {
		return &pb.Envelope{MsgId: "m", Sender: "s@n", Recipient: "a@n", Body: &anypb.Any{Value: []byte{1}}}
	}
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	f.Add(cat(nameFrame(1, "t/a"), named(1, 0, full())))
	f.Add(cat(nameFrame(1, "t/a"), nameFrame(2, "t/b"), named(2, 0, full())))
	f.Add(named(1, 0, full()))
	f.Add(cat(nameFrame(2, "t/a"), env))
	f.Add(cat(routeFrame(1, "s@n", "a@n"), named(0, 1, routed())))
	f.Add(cat(nameFrame(1, "t/a"), routeFrame(1, "s@n", "a@n"), routeFrame(2, "s@n", "b@n"), named(1, 2, plain()), named(1, 1, plain())))
	f.Add(cat(routeFrame(1, "s@n", "a@n"), named(0, 1, full())))
	f.Add(cat(routeFrame(1, "s@n", "a@n"), named(0, 2, routed())))
	f.Add(cat(routeFrame(2, "s@n", "a@n"), named(0, 1, routed())))
	f.Add(cat(routeFrame(1, "", "a@n"), named(0, 1, routed())))
	f.Fuzz(func(t *testing.T, stream []byte) {
		sr := &streamReader{br: bufio.NewReaderSize(bytes.NewReader(stream), readBufSize), max: 1 << 16}
		var ns names
		for range 64 {
			env, refs, other, _, err := sr.readEnvelopeFrame(8, 1<<10)
			if err != nil {
				return
			}
			before := len(ns.urls) + len(ns.routes)
			var wasSender, wasRecipient string
			if env != nil {
				wasSender, wasRecipient = env.GetSender(), env.GetRecipient()
			}
			got, err := ns.take(env, refs, other)
			switch {
			case err != nil:
				return
			case got == nil && len(ns.urls)+len(ns.routes) != before+1:
				t.Fatalf("a frame taken with no envelope named nothing (%d names before, %d after)", before, len(ns.urls)+len(ns.routes))
			case got != nil && refs.bodyType != 0 && got.GetBody().GetTypeUrl() != ns.urls[refs.bodyType-1]:
				t.Fatalf("an envelope naming type %d has type %q, named %q", refs.bodyType, got.GetBody().GetTypeUrl(), ns.urls[refs.bodyType-1])
			case got != nil && refs.route != 0 && (wasSender != "" || wasRecipient != ""):
				t.Fatalf("an envelope naming route %d kept its own sender %q and recipient %q", refs.route, wasSender, wasRecipient)
			case got != nil && refs.route != 0 && (got.GetSender() != ns.routes[refs.route-1].sender || got.GetRecipient() != ns.routes[refs.route-1].recipient):
				t.Fatalf("an envelope naming route %d has %q → %q, named %+v", refs.route, got.GetSender(), got.GetRecipient(), ns.routes[refs.route-1])
			case got != nil && refs.route == 0 && (got.GetSender() != wasSender || got.GetRecipient() != wasRecipient):
				t.Fatal("an envelope naming no route had its sender or recipient changed")
			case len(ns.urls) > maxNames || ns.bytes > maxNameBytes:
				t.Fatalf("%d names of %d bytes, at most %d of %d", len(ns.urls), ns.bytes, maxNames, maxNameBytes)
			case len(ns.routes) > maxRoutes || ns.rbytes > maxRouteBytes:
				t.Fatalf("%d routes of %d bytes, at most %d of %d", len(ns.routes), ns.rbytes, maxRoutes, maxRouteBytes)
			}
		}
	})
}

// A lane's frame naming an origin, its identity copied from an
// envelope's origin, is the one proto writes for that OriginName.
func TestOriginNameFrameIsProtos(t *testing.T) {
	for _, tc := range []struct {
		ref uint32
		o   *pb.Origin
	}{
		{1, &pb.Origin{Node: "n1", OutboxId: []byte("0123456789abcdef"), Certificate: bytes.Repeat([]byte{7}, 500)}},
		{16, &pb.Origin{Certificate: []byte{1}}},
		{300, &pb.Origin{Node: "n", Certificate: bytes.Repeat([]byte{8}, 8000)}},
	} {
		id, err := proto.MarshalOptions{Deterministic: true}.Marshal(tc.o)
		if err != nil {
			t.Fatal(err)
		}
		got := appendCopiedNameHead(nil, frameFieldOriginName, originNameFieldRef, tc.ref, len(id))
		got = appendRef(append(got, id...), originNameFieldRef, tc.ref)
		want, err := AppendFrame(nil, &pb.Frame{Kind: &pb.Frame_OriginName{OriginName: &pb.OriginName{
			Ref: tc.ref, Node: tc.o.GetNode(), OutboxId: tc.o.GetOutboxId(), Certificate: tc.o.GetCertificate()}}})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("ref %d: wrote\n%x\nproto writes\n%x", tc.ref, got, want)
		}
		if n := copiedNameSize(frameFieldOriginName, originNameFieldRef, tc.ref, len(id)); n != len(want) {
			t.Fatalf("ref %d: sized %d bytes, wrote %d", tc.ref, n, len(want))
		}
	}
}
