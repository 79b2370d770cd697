package transport_test

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
	"google.golang.org/protobuf/types/known/anypb"
)

// forwardedEnvelopes returns n envelopes as a forwarder carries them:
// each with the origin of one of three nodes (its node, outbox id and a
// certificate of certLen bytes) and a signature of its own.
func forwardedEnvelopes(n, certLen int) []*pb.Envelope {
	envs := make([]*pb.Envelope, n)
	for i := range envs {
		o := i % 3
		envs[i] = &pb.Envelope{ProtocolVersion: pb.ProtocolVersion, MsgId: fmt.Sprintf("f-%d", i), Sender: fmt.Sprintf("@o%d", o),
			Recipient: "sink@b", Sequence: uint64(i + 1), Body: &anypb.Any{TypeUrl: typeURL(0), Value: []byte(fmt.Sprint(i))},
			Origin: &pb.Origin{Node: fmt.Sprintf("o%d", o), OutboxId: bytes.Repeat([]byte{byte(o)}, 16),
				Certificate: bytes.Repeat([]byte{byte('A' + o)}, certLen), Signature: []byte(fmt.Sprintf("sig-%d", i))}}
	}
	return envs
}

// sendForwarded sends envs from a to b, one at a time, and checks that b
// got them as sent, in order; it returns the bytes a wrote to b.
func sendForwarded(t *testing.T, a, b *node, rec *recorder, envs []*pb.Envelope) uint64 {
	t.Helper()
	ctx := ctxT(t, 20*time.Second)
	before, had := a.PeerStats()["b"], rec.count.Load()
	for _, env := range envs {
		if err := a.Send(ctx, "b", env); err != nil {
			t.Fatal(err)
		}
	}
	checkArrivedAsSent(t, a, b, rec, had, envs)
	return a.PeerStats()["b"].BytesOut - before.BytesOut
}

// A forwarded envelope's origin (node, outbox id, certificate: most of
// its bytes) is named once per lane stream; its signature, its own, goes
// with it. Envelopes arrive as sent; a peer that does not take origin
// names gets them in full.
func TestOriginsNamedOncePerStream(t *testing.T) {
	const n, certLen = 120, 600
	a, b, rec := featuresPair(t, nil)
	named := sendForwarded(t, a, b, rec, forwardedEnvelopes(n, certLen))
	a2, b2, rec2 := featuresPair(t, []string{transport.FeatureTypeNames, transport.FeatureRouteNames})
	full := sendForwarded(t, a2, b2, rec2, forwardedEnvelopes(n, certLen))
	// Each envelope leaves out its certificate, node and outbox id (at
	// least certLen+20 bytes) and says a ref; three origins cost a frame
	// each of about as much.
	if saved, least := int(full)-int(named), (n-3)*(certLen+20-4); saved < least {
		t.Fatalf("origins named: %d bytes, in full: %d; saved %d, want at least %d", named, full, saved, least)
	}
	t.Logf("%d forwarded envelopes: %d bytes with origins named, %d in full", n, named, full)
}

// More origins than a stream names, and certificates past its bytes
// bound, go in full and arrive as sent.
func TestOriginsPastTheBoundsGoInFull(t *testing.T) {
	a, b, rec := featuresPair(t, nil)
	envs := forwardedEnvelopes(90, 700)
	for i, env := range envs {
		env.Origin.Node = fmt.Sprintf("o%d", i%30) // 30 origins: past 16
		env.Origin.Certificate = bytes.Repeat([]byte{byte(i % 30)}, 700+i%30)
	}
	sendForwarded(t, a, b, rec, envs)
}

// What a peer names as origins on a lane stream is checked: a ref it did
// not name, a name out of order, twice, without a certificate, past the
// bounds, a named envelope without an origin or whose origin says a node,
// outbox id or certificate of its own, and an origin ref on a frame
// without an envelope close its connection; other peers are not touched.
// Named as the rules say, its envelopes arrive with their origins.
func TestBadOriginNamesCloseTheConnection(t *testing.T) {
	envelope := func(ref uint32, o *pb.Origin) *pb.Frame {
		return &pb.Frame{Kind: &pb.Frame_Envelope{Envelope: &pb.Envelope{ProtocolVersion: pb.ProtocolVersion, MsgId: "m1",
			Sender: "@evil", Recipient: "x@srv", Origin: o}}, Origin: ref}
	}
	name := func(ref uint32, node string, cert []byte) *pb.Frame {
		return &pb.Frame{Kind: &pb.Frame_OriginName{OriginName: &pb.OriginName{Ref: ref, Node: node, OutboxId: []byte("id"), Certificate: cert}}}
	}
	cert := []byte("certificate")
	sig := &pb.Origin{Signature: []byte("s")}
	many := make([]*pb.Frame, 17)
	for i := range many {
		many[i] = name(uint32(i+1), fmt.Sprint("o", i), cert)
	}
	for _, tc := range []struct {
		name   string
		frames []*pb.Frame
	}{
		{"a ref not named", []*pb.Frame{envelope(1, sig)}},
		{"a ref past those named", []*pb.Frame{name(1, "o", cert), envelope(2, sig)}},
		{"a name out of order", []*pb.Frame{name(2, "o", cert)}},
		{"a name twice", []*pb.Frame{name(1, "o", cert), name(1, "o", cert)}},
		{"a name without a certificate", []*pb.Frame{name(1, "o", nil)}},
		{"a name too long", []*pb.Frame{name(1, "o", bytes.Repeat([]byte("c"), 8<<10))}},
		{"names too long together", []*pb.Frame{name(1, "o", bytes.Repeat([]byte("c"), 5000)), name(2, "p", bytes.Repeat([]byte("d"), 3200))}},
		{"more names than a stream takes", many},
		{"a named envelope without an origin", []*pb.Frame{name(1, "o", cert), envelope(1, nil)}},
		{"a named envelope whose origin says its node", []*pb.Frame{name(1, "o", cert), envelope(1, &pb.Origin{Node: "o", Signature: []byte("s")})}},
		{"a named envelope whose origin says its certificate", []*pb.Frame{name(1, "o", cert), envelope(1, &pb.Origin{Certificate: cert})}},
		{"an origin without an envelope", []*pb.Frame{{Kind: &pb.Frame_OriginName{OriginName: &pb.OriginName{Ref: 1, Certificate: cert}}, Origin: 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) { framesCloseTheConnection(t, tc.frames) })
	}
	t.Run("as the rules say", func(t *testing.T) {
		var origins []string
		for _, env := range framesArrive(t, []*pb.Frame{name(1, "o1", cert), name(2, "o2", []byte("other")), envelope(2, sig), envelope(1, sig)}, 2) {
			o := env.GetOrigin()
			origins = append(origins, fmt.Sprintf("%s/%s/%s/%s", o.GetNode(), o.GetOutboxId(), o.GetCertificate(), o.GetSignature()))
		}
		if want := "[o2/id/other/s o1/id/certificate/s]"; fmt.Sprint(origins) != want {
			t.Fatalf("origins %v, want %s", origins, want)
		}
	})
}

// An envelope of nothing but an origin, its frame at the peer's limit,
// arrives: its naming frame, whose ref takes the place of the origin
// field's own tag and length, is never longer than the envelope's.
func TestOriginAtThePeersFrameLimitArrives(t *testing.T) {
	ca, r := newCA(t), newResolver()
	a := startNode(t, testConfig(t, ca, "a"), r, &recorder{})
	cfg := testConfig(t, ca, "b")
	cfg.MaxFrameSize = 2048
	rec := &recorder{}
	b := startNode(t, cfg, r, rec)
	// The frame's envelope field (3 bytes), the recipient (8; the same
	// lane as the next envelope), the origin's tag and length (4), its
	// node field (3) and its certificate's tag and length (3).
	env := &pb.Envelope{Recipient: "sink@b", Origin: &pb.Origin{Node: "o", Certificate: []byte(strings.Repeat("c", 2048-21))}}
	frame, err := transport.AppendEnvelopeFrame(nil, env, 1<<20)
	if err != nil || len(frame) != 2+2048 {
		t.Fatalf("frame of %d bytes (%v), want 2048 and its 2-byte length", len(frame), err)
	}
	sent := []*pb.Envelope{env, forwardedEnvelopes(1, 100)[0]}
	ctx := ctxT(t, 10*time.Second)
	for _, e := range sent {
		if err := a.Send(ctx, "b", e); err != nil {
			t.Fatal(err)
		}
	}
	checkArrivedAsSent(t, a, b, rec, 0, sent)
}
