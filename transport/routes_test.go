package transport_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// featuresPair is typedPair with b's Hello listing features (nil: all
// of this release's).
func featuresPair(t *testing.T, features []string) (a, b *node, rec *recorder) {
	t.Helper()
	ca, r := newCA(t), newResolver()
	a = startNode(t, testConfig(t, ca, "a"), r, &recorder{})
	cfg := testConfig(t, ca, "b")
	if features != nil {
		transport.SetHelloHook(&cfg, func(h *pb.Hello) { h.Features = features })
	}
	rec = &recorder{}
	b = startNode(t, cfg, r, rec)
	return a, b, rec
}

// Every send of whole envelopes names their sender and recipient once per
// lane stream, and they arrive as sent; a peer that takes only type names
// (the release before) gets them in full, as does one that takes neither.
func TestRoutesNamedOncePerStream(t *testing.T) {
	a, b, rec := featuresPair(t, nil)
	routed, typed := sendEveryWay(t, a, b, rec)
	a2, b2, rec2 := featuresPair(t, []string{transport.FeatureTypeNames})
	typesOnly, _ := sendEveryWay(t, a2, b2, rec2)
	a3, b3, rec3 := featuresPair(t, []string{})
	none, _ := sendEveryWay(t, a3, b3, rec3)
	// Each envelope leaves out "@a" and "sink@b" with their tags and
	// lengths (12 bytes) and says a ref (2); its lengths may take a byte
	// less. A route costs a frame per lane stream (under 30 bytes).
	const n = 270
	if saved, least := int(typesOnly)-int(routed), n*(12-2)-4*30; saved < least {
		t.Fatalf("routes named: %d bytes, types only: %d; saved %d, want at least %d", routed, typesOnly, saved, least)
	}
	u := len(typeURL(0))
	if saved, least := int(none)-int(typesOnly), typed*(u+2-2-1)-3*4*(u+12); saved < least {
		t.Fatalf("types named: %d bytes, none: %d; saved %d, want at least %d", typesOnly, none, saved, least)
	}
	t.Logf("%d envelopes: %d bytes with routes and types named, %d with types only, %d in full", n, routed, typesOnly, none)
}

// Senders and recipients past a stream's route bounds (their count, their
// bytes) go in full, and every envelope arrives with its own.
func TestRoutesPastTheBoundsGoInFull(t *testing.T) {
	a, _, rec := featuresPair(t, nil)
	ctx := ctxT(t, 20*time.Second)
	var sent []*pb.Envelope
	for i := range 300 {
		recipient := fmt.Sprintf("sink%d@b", i%2)
		if i%7 == 0 {
			recipient = strings.Repeat("r", 900+i) + "@b" // long: the bytes bound
		}
		sent = append(sent, &pb.Envelope{ProtocolVersion: pb.ProtocolVersion, MsgId: fmt.Sprintf("m-%d", i),
			Sender: fmt.Sprintf("s%d@a", i%150), Recipient: recipient,
			Body: &anypb.Any{TypeUrl: typeURL(0), Value: []byte(fmt.Sprint(i))}})
	}
	for _, env := range sent {
		if err := a.Send(ctx, "b", env); err != nil {
			t.Fatal(err)
		}
	}
	waitCond(t, 20*time.Second, "every envelope at b", func() bool { return rec.count.Load() == int64(len(sent)) })
	got, _ := rec.snapshot()
	byID := map[string]*pb.Envelope{}
	for _, env := range got { // in order per lane; lanes by recipient
		byID[env.GetMsgId()] = env
	}
	for i, want := range sent {
		if env := byID[want.GetMsgId()]; !proto.Equal(env, want) {
			t.Fatalf("envelope %d arrived as %.200v, sent %.200v", i, env, want)
		}
	}
}

// Runs of whole envelopes with new routes all along (and new types) share
// a small queue with single sends: a run the byte bound refuses leaves no
// route named, so every envelope b gets has the sender, recipient and
// type its value says, each accepted run arrives whole, and the queue
// drains to nothing.
func TestRunsOfNewRoutesShareASmallQueue(t *testing.T) {
	a, got, bad := typeCheckingPair(t, 64)
	runsShareASmallQueue(t, a, got, bad, func(g, i, j int, rcpt string) *pb.Envelope {
		// A new sender every run or so, while the queue is contended: new
		// routes all along, within the bound for the first ones and past
		// it later.
		url, sender := typeURL((i+j)%5), fmt.Sprintf("s%d-%d@a", i, j%2)
		if i%11 == 0 {
			sender += strings.Repeat("L", 300) // long ones too
		}
		return &pb.Envelope{ProtocolVersion: pb.ProtocolVersion, MsgId: fmt.Sprintf("m-%d-%d-%d", g, i, j), Sender: sender, Recipient: rcpt,
			Body:    &anypb.Any{TypeUrl: url, Value: []byte(url + "|" + sender + "|" + rcpt + "|" + strings.Repeat("x", (i*379+j*97)%9000))},
			Receipt: pb.Envelope_RECEIPT_PROCESSED}
	})
}

// What a peer names as routes on a lane stream is checked: a ref it did
// not name, a name out of order, twice, without a sender or a recipient,
// too long, past the bound, a routed envelope that carries a sender or a
// recipient of its own, and a route on a frame without an envelope close
// its connection; other peers are not touched. Named as the rules say,
// its envelopes arrive with their senders and recipients.
func TestBadRouteNamesCloseTheConnection(t *testing.T) {
	value := &anypb.Any{TypeUrl: "t/a", Value: []byte("v")}
	envelope := func(ref uint32, sender, recipient string) *pb.Frame {
		return &pb.Frame{Kind: &pb.Frame_Envelope{Envelope: &pb.Envelope{ProtocolVersion: pb.ProtocolVersion, MsgId: "m1",
			Sender: sender, Recipient: recipient, Body: value}}, Route: ref}
	}
	name := func(ref uint32, sender, recipient string) *pb.Frame {
		return &pb.Frame{Kind: &pb.Frame_RouteName{RouteName: &pb.RouteName{Ref: ref, Sender: sender, Recipient: recipient}}}
	}
	many := make([]*pb.Frame, 65)
	for i := range many {
		many[i] = name(uint32(i+1), fmt.Sprintf("s%d@evil", i), "x@srv")
	}
	for _, tc := range []struct {
		name   string
		frames []*pb.Frame
	}{
		{"a ref not named", []*pb.Frame{envelope(1, "", "")}},
		{"a ref past those named", []*pb.Frame{name(1, "@evil", "x@srv"), envelope(2, "", "")}},
		{"a name out of order", []*pb.Frame{name(2, "@evil", "x@srv")}},
		{"a name twice", []*pb.Frame{name(1, "@evil", "x@srv"), name(1, "@evil", "x@srv")}},
		{"a name without a sender", []*pb.Frame{name(1, "", "x@srv")}},
		{"a name without a recipient", []*pb.Frame{name(1, "@evil", "")}},
		{"a name too long", []*pb.Frame{name(1, "@evil", strings.Repeat("x", 4096)+"@srv")}},
		{"names too long together", []*pb.Frame{name(1, "@evil", strings.Repeat("x", 4000)+"@srv"), name(2, "@evil", strings.Repeat("y", 80)+"@srv")}},
		{"more names than a stream takes", many},
		{"a routed envelope with its own sender", []*pb.Frame{name(1, "@evil", "x@srv"), envelope(1, "@evil", "")}},
		{"a routed envelope with its own recipient", []*pb.Frame{name(1, "@evil", "x@srv"), envelope(1, "", "x@srv")}},
		{"a route without an envelope", []*pb.Frame{{Kind: &pb.Frame_RouteName{RouteName: &pb.RouteName{Ref: 1, Sender: "@evil", Recipient: "x@srv"}}, Route: 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) { framesCloseTheConnection(t, tc.frames) })
	}
	t.Run("as the rules say", func(t *testing.T) {
		frames := []*pb.Frame{name(1, "a@evil", "x@srv"), name(2, "b@evil", "y@srv"), envelope(2, "", ""), envelope(1, "", ""), envelope(0, "c@evil", "z@srv")}
		typed := &pb.Frame{Kind: &pb.Frame_TypeName{TypeName: &pb.TypeName{Ref: 1, Url: "t/n"}}}
		both := envelope(1, "", "")
		both.BodyType = 1
		both.GetEnvelope().Body = &anypb.Any{Value: []byte("v")}
		var routes []string
		for _, env := range framesArrive(t, append(frames, typed, both), 4) {
			routes = append(routes, env.GetSender()+">"+env.GetRecipient()+":"+env.GetBody().GetTypeUrl())
		}
		if want := "[b@evil>y@srv:t/a a@evil>x@srv:t/a c@evil>z@srv:t/a a@evil>x@srv:t/n]"; fmt.Sprint(routes) != want {
			t.Fatalf("routes %v, want %s", routes, want)
		}
	})
}
