package transport_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/envcodec"
	"github.com/meshnode/meshnode/internal/rawpeer"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
	"github.com/quic-go/quic-go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// typeURL is the i-th of a test's body types: long, as real ones are.
func typeURL(i int) string {
	return fmt.Sprintf("type.googleapis.com/example.fleet.telemetry.v1.Reading%03d", i)
}

// sendTyped sends n envelopes from a to sink@b, encoded as a node
// encodes a plain tell, the i-th with the body type typeOf(i); named says
// whether SendEncoded is told where the body is. It waits until b has
// them all, checks that they arrived as sent, in order, and returns the
// bytes a wrote to b.
func sendTyped(t *testing.T, a, b *node, rec *recorder, n int, typeOf func(int) string, named bool) uint64 {
	t.Helper()
	ctx := ctxT(t, 20*time.Second)
	before, had := a.PeerStats()["b"], rec.count.Load()
	var sent []*pb.Envelope
	for i := range n {
		url := typeOf(i)
		r, ok := envcodec.NewRoute("@a", "sink@b", url)
		if !ok {
			t.Fatalf("no route for %q", url)
		}
		p := envcodec.Plain{ID: []byte(fmt.Sprintf("m-%d", i)), CreatedAtUnixMs: 1, Kind: pb.RpcMeta_EVENT, Value: []byte(fmt.Sprintf("value %d", i)), TtlMs: 100}
		wire, where := r.Append(nil, p)
		var env pb.Envelope
		if err := proto.Unmarshal(wire, &env); err != nil {
			t.Fatal(err)
		}
		sent = append(sent, &env)
		body := transport.Body{}
		if named {
			body = where
		}
		if err := a.SendEncoded(ctx, "b", "sink@b", wire, body); err != nil {
			t.Fatal(err)
		}
		clear(wire) // the caller's once SendEncoded returns
	}
	waitCond(t, 20*time.Second, "every envelope at b", func() bool { return rec.count.Load() == had+int64(n) })
	got, _ := rec.snapshot()
	got = got[had:]
	for i := range sent {
		if !proto.Equal(got[i], sent[i]) {
			t.Fatalf("envelope %d arrived as %v, sent %v", i, got[i], sent[i])
		}
	}
	// A lane counts its frames and bytes once its write returns; b counts
	// the same as it reads them.
	waitCond(t, 5*time.Second, "a's counters", func() bool {
		out, in := a.PeerStats()["b"], b.PeerStats()["a"]
		return out.BytesOut == in.BytesIn && out.FramesOut == in.FramesIn && out.FramesOut >= before.FramesOut+uint64(n)
	})
	return a.PeerStats()["b"].BytesOut - before.BytesOut
}

// typedPair starts a and b; b's Hello lists no type names when old.
func typedPair(t *testing.T, old bool) (a, b *node, rec *recorder) {
	t.Helper()
	ca, r := newCA(t), newResolver()
	a = startNode(t, testConfig(t, ca, "a"), r, &recorder{})
	cfg := testConfig(t, ca, "b")
	if old {
		transport.SetHelloHook(&cfg, func(h *pb.Hello) { h.Features = nil })
	}
	rec = &recorder{}
	b = startNode(t, cfg, r, rec)
	return a, b, rec
}

// A plain envelope's body type is named once per lane stream: what b
// receives is what a sent, and each envelope after the first of its type
// leaves out its type URL. A peer of an older release, whose Hello does
// not take names, gets every type in full, as does any send that does not
// say where its body is.
func TestBodyTypesNamedOncePerStream(t *testing.T) {
	const n = 300
	three := func(i int) string { return typeURL(i % 3) }
	a, b, rec := typedPair(t, false)
	named := sendTyped(t, a, b, rec, n, three, true)
	full := sendTyped(t, a, b, rec, n, three, false)
	a2, b2, rec2 := typedPair(t, true)
	old := sendTyped(t, a2, b2, rec2, n, three, true)
	// Each named envelope leaves out its type URL with its tag and length
	// and says a ref (2 bytes), a length may take a byte less; the three
	// names cost a frame each (the URL and at most 12 bytes).
	u := len(typeURL(0))
	if saved, least := int(full)-int(named), n*(u+2-2-1)-3*(u+12); saved < least {
		t.Fatalf("named: %d bytes, in full: %d; saved %d, want at least %d", named, full, saved, least)
	}
	if old != full {
		t.Fatalf("to a peer without names: %d bytes, want %d, as in full", old, full)
	}
}

// richEnvelopes returns n envelopes from @a to sink@b of the shapes the
// node sends (headers, an RpcMeta, a body of one of three types, a body
// without a type or without a value, no body), asking a receipt when
// receipt says so.
func richEnvelopes(n int, receipt bool) []*pb.Envelope {
	envs := make([]*pb.Envelope, n)
	for i := range envs {
		env := &pb.Envelope{ProtocolVersion: pb.ProtocolVersion, MsgId: fmt.Sprintf("e-%d", i), Sender: "@a", Recipient: "sink@b",
			CreatedAtUnixMs: int64(i), Sequence: uint64(i + 1), TtlMs: 500}
		switch i % 7 {
		case 5:
			env.Body = &anypb.Any{Value: []byte("no type")}
		case 6:
		default:
			env.Body = &anypb.Any{TypeUrl: typeURL(i % 3), Value: []byte(fmt.Sprintf("value %d", i))}
		}
		if i%4 == 0 && env.Body != nil {
			env.Body.TypeUrl = typeURL(i % 3) // a body without a value
			env.Body.Value = nil
		}
		if i%3 == 0 {
			env.Headers = map[string]string{"trace": fmt.Sprint(i), "a": "b"}
		}
		if i%2 == 0 {
			env.Rpc = &pb.RpcMeta{Kind: pb.RpcMeta_REQUEST, CorrelationId: fmt.Sprintf("c-%d", i), ReplyTo: "r@a"}
		}
		if receipt {
			env.Receipt = pb.Envelope_RECEIPT_PROCESSED
		}
		envs[i] = env
	}
	return envs
}

// sendEveryWay sends richEnvelopes from a to b with each of the
// transport's sends of whole envelopes: Send, Request one at a time, and
// RequestBatch in runs of 25. It checks that b got them as sent, in order,
// and returns the bytes a wrote to b and the envelopes whose body has a type.
func sendEveryWay(t *testing.T, a, b *node, rec *recorder) (bytes uint64, typed int) {
	t.Helper()
	ctx := ctxT(t, 20*time.Second)
	before, had := a.PeerStats()["b"], rec.count.Load()
	tells, asks := richEnvelopes(70, false), richEnvelopes(200, true)
	for _, env := range tells {
		if err := a.Send(ctx, "b", env); err != nil {
			t.Fatal(err)
		}
	}
	for _, env := range asks[:30] {
		if _, err := a.Request(ctx, "b", env); err != nil {
			t.Fatal(err)
		}
	}
	for i := 30; i < len(asks); i += 25 {
		if _, err := a.RequestBatch(ctx, "b", asks[i:min(i+25, len(asks))]); err != nil {
			t.Fatal(err)
		}
	}
	sent := append(tells, asks...)
	waitCond(t, 20*time.Second, "every envelope at b", func() bool { return rec.count.Load() == had+int64(len(sent)) })
	got, _ := rec.snapshot()
	got = got[had:]
	for i := range sent {
		if !proto.Equal(got[i], sent[i]) {
			t.Fatalf("envelope %d arrived as %v, sent %v", i, got[i], sent[i])
		}
		if sent[i].GetBody().GetTypeUrl() != "" {
			typed++
		}
	}
	waitCond(t, 5*time.Second, "a's counters", func() bool {
		out, in := a.PeerStats()["b"], b.PeerStats()["a"]
		return out.BytesOut == in.BytesIn && out.FramesOut == in.FramesIn
	})
	return a.PeerStats()["b"].BytesOut - before.BytesOut, typed
}

// Whole envelopes (tells, requests, runs of requests: what asks, replies
// and the outbox's emissions send) name their body types too, and arrive
// as sent; a peer without names gets them in full.
func TestEverySendNamesItsBodyTypes(t *testing.T) {
	a, b, rec := typedPair(t, false)
	named, typed := sendEveryWay(t, a, b, rec)
	a2, b2, rec2 := typedPair(t, true)
	full, _ := sendEveryWay(t, a2, b2, rec2)
	u := len(typeURL(0))
	if saved, least := int(full)-int(named), typed*(u+2-2-1)-3*(u+12); saved < least {
		t.Fatalf("named: %d bytes, in full: %d; saved %d, want at least %d (%d typed bodies)", named, full, saved, least, typed)
	}
	t.Logf("%d typed bodies of 270: %d bytes named, %d in full", typed, named, full)
}

// More types than a stream names go in full past the bound, and arrive
// as sent.
func TestBodyTypesPastTheNamesBoundGoInFull(t *testing.T) {
	a, b, rec := typedPair(t, false)
	sendTyped(t, a, b, rec, 200, func(i int) string { return typeURL(i % 100) }, true)
	sendTyped(t, a, b, rec, 20, func(i int) string { return strings.Repeat("t", 2000+i) }, true)
}

// framesCloseTheConnection has a peer write frames on a lane stream and
// checks that the server closes its connection for bad input
// (CodeProtocol) and still serves another peer.
func framesCloseTheConnection(t *testing.T, frames []*pb.Frame) {
	t.Helper()
	framesOnCloseTheConnection(t, func(p *rawpeer.Peer) *quic.SendStream { return p.Lane(t) }, frames)
}

// framesOnCloseTheConnection is framesCloseTheConnection for frames the
// peer writes on the stream on gives (a lane, its control stream).
func framesOnCloseTheConnection(t *testing.T, on func(*rawpeer.Peer) *quic.SendStream, frames []*pb.Frame) {
	t.Helper()
	ca, srv, good, _ := hostileSetup(t, nil)
	evil := rawpeer.Dial(t, ca, "evil", targetOf(srv))
	_ = writeFrames(t, on(evil), frames) // a write may find the connection closed already
	assertClosedWith(t, evil, transport.CodeProtocol, 5*time.Second)
	assertGoodPeerWorks(t, srv, good)
}

// writeFrames writes frames on s, and says why a write failed.
func writeFrames(t *testing.T, s *quic.SendStream, frames []*pb.Frame) error {
	t.Helper()
	for _, f := range frames {
		b, err := transport.AppendFrame(nil, f)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Write(b); err != nil {
			return err
		}
	}
	return nil
}

// framesArrive has a peer write frames on a lane stream, within the
// rules, and returns what the server's handler got after the good
// peer's envelope, once it has n envelopes from the peer.
func framesArrive(t *testing.T, frames []*pb.Frame, n int) []*pb.Envelope {
	t.Helper()
	ca, srv, _, rec := hostileSetup(t, nil)
	if err := writeFrames(t, rawpeer.Dial(t, ca, "evil", targetOf(srv)).Lane(t), frames); err != nil {
		t.Fatal(err)
	}
	waitCond(t, 5*time.Second, fmt.Sprintf("%d envelopes from evil", n), func() bool { return rec.count.Load() >= int64(n)+1 })
	got, _ := rec.snapshot()
	return got[1:] // the first is the good peer's
}

// What a peer names on a lane stream is checked: a ref it did not name, a
// name out of order, twice, empty or too long, past the bound, a named
// envelope without a body or whose body says a type of its own, and a
// body type on a frame without an envelope close its connection; other
// peers are not touched. Named as the rules say, its envelopes arrive
// with their types.
func TestBadTypeNamesCloseTheConnection(t *testing.T) {
	envelope := func(ref uint32, body *anypb.Any) *pb.Frame {
		return &pb.Frame{Kind: &pb.Frame_Envelope{Envelope: &pb.Envelope{ProtocolVersion: pb.ProtocolVersion, MsgId: "m1",
			Sender: "@evil", Recipient: "x@srv", Body: body}}, BodyType: ref}
	}
	name := func(ref uint32, url string) *pb.Frame {
		return &pb.Frame{Kind: &pb.Frame_TypeName{TypeName: &pb.TypeName{Ref: ref, Url: url}}}
	}
	value := &anypb.Any{Value: []byte("v")}
	many := make([]*pb.Frame, 65)
	for i := range many {
		many[i] = name(uint32(i+1), typeURL(i))
	}
	for _, tc := range []struct {
		name   string
		frames []*pb.Frame
	}{
		{"a ref not named", []*pb.Frame{envelope(1, value)}},
		{"a ref past those named", []*pb.Frame{name(1, "t/a"), envelope(2, value)}},
		{"a name out of order", []*pb.Frame{name(2, "t/a")}},
		{"a name twice", []*pb.Frame{name(1, "t/a"), name(1, "t/a")}},
		{"an empty name", []*pb.Frame{name(1, "")}},
		{"a name too long", []*pb.Frame{name(1, strings.Repeat("t", 4097))}},
		{"names too long together", []*pb.Frame{name(1, strings.Repeat("t", 4000)), name(2, strings.Repeat("u", 97))}},
		{"more names than a stream takes", many},
		{"a named envelope without a body", []*pb.Frame{name(1, "t/a"), envelope(1, nil)}},
		{"a named envelope whose body says its type", []*pb.Frame{name(1, "t/a"), envelope(1, &anypb.Any{TypeUrl: "t/b", Value: []byte("v")})}},
		{"a body type without an envelope", []*pb.Frame{{Kind: &pb.Frame_TypeName{TypeName: &pb.TypeName{Ref: 1, Url: "t/a"}}, BodyType: 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) { framesCloseTheConnection(t, tc.frames) })
	}
	t.Run("as the rules say", func(t *testing.T) {
		got := framesArrive(t, []*pb.Frame{name(1, "t/a"), name(2, "t/b"), envelope(2, value), envelope(1, value), envelope(0, &anypb.Any{TypeUrl: "t/c"})}, 3)
		var types []string
		for _, env := range got {
			types = append(types, env.GetBody().GetTypeUrl())
		}
		if fmt.Sprint(types) != "[t/b t/a t/c]" {
			t.Fatalf("types %v, want [t/b t/a t/c]", types)
		}
	})
}
