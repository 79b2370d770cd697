package transport_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/envcodec"
	"github.com/meshnode/meshnode/internal/rawpeer"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// A peer that takes route names but not type names, and one that takes
// type names only, get every send as sent.
func TestRouteNamesWithAndWithoutTypeNames(t *testing.T) {
	for _, features := range [][]string{{transport.FeatureRouteNames}, {transport.FeatureTypeNames}, {"route-names", "type-names", "route-names"}} {
		t.Run(fmt.Sprint(features), func(t *testing.T) {
			a, b, rec := featuresPair(t, features)
			sendEveryWay(t, a, b, rec)
			// SendEncoded, as a node's plain tells.
			ctx := ctxT(t, 10*time.Second)
			had := rec.count.Load()
			var sent []*pb.Envelope
			for i := range 100 {
				sender, rcpt, url := fmt.Sprintf("s%d@a", i%5), "sink@b", typeURL(i%3)
				r, _ := envcodec.NewRoute(sender, rcpt, url)
				id := fmt.Sprintf("id-%d", i)
				wire, body := r.Append(nil, envcodec.Plain{ID: []byte(id), CreatedAtUnixMs: 5, Kind: pb.RpcMeta_EVENT, Value: []byte{byte(i)}, TtlMs: 9})
				if err := a.SendEncoded(ctx, "b", rcpt, wire, body); err != nil {
					t.Fatal(err)
				}
				var env pb.Envelope
				if err := proto.Unmarshal(wire, &env); err != nil {
					t.Fatal(err)
				}
				sent = append(sent, &env)
			}
			waitCond(t, 10*time.Second, "every tell at b", func() bool { return rec.count.Load() == had+int64(len(sent)) })
			got, _ := rec.snapshot()
			for i, env := range got[had:] {
				if !proto.Equal(env, sent[i]) {
					t.Fatalf("tell %d arrived as %v, sent %v", i, env, sent[i])
				}
			}
		})
	}
}

// Frames a peer may write that proto reads as valid (fields in other
// orders, a field twice, unknown fields in a RouteName, a ref past 32
// bits, which proto cuts) are read as proto reads them.
func TestRouteFramesReadAsProtoReadsThem(t *testing.T) {
	envBytes := func(sender, recipient string) []byte {
		b, err := proto.Marshal(&pb.Envelope{ProtocolVersion: pb.ProtocolVersion, MsgId: "m", Sender: sender, Recipient: recipient,
			Body: &anypb.Any{TypeUrl: "t/a", Value: []byte("v")}})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	frame := func(parts ...[]byte) []byte {
		var inner []byte
		for _, p := range parts {
			inner = append(inner, p...)
		}
		return append(protowire.AppendVarint(nil, uint64(len(inner))), inner...)
	}
	envField := func(b []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), b)
	}
	ref := func(num protowire.Number, v uint64) []byte {
		return protowire.AppendVarint(protowire.AppendTag(nil, num, protowire.VarintType), v)
	}
	routeName := func(r uint64, sender, recipient string, extra ...[]byte) []byte {
		rn := ref(1, r)
		rn = protowire.AppendString(protowire.AppendTag(rn, 4, protowire.BytesType), sender)
		rn = protowire.AppendString(protowire.AppendTag(rn, 5, protowire.BytesType), recipient)
		for _, e := range extra {
			rn = append(rn, e...)
		}
		return frame(protowire.AppendBytes(protowire.AppendTag(nil, 7, protowire.BytesType), rn))
	}
	unknown := protowire.AppendString(protowire.AppendTag(nil, 15, protowire.BytesType), "junk")
	ca, srv, _, rec := hostileSetup(t, nil)
	evil := rawpeer.Dial(t, ca, "evil", targetOf(srv))
	s := evil.Lane(t)
	stream := [][]byte{
		routeName(1, "a@evil", "x@srv", unknown),
		routeName(1<<32+2, "b@evil", "y@srv"),                                        // proto reads ref 2
		frame(ref(8, 1), envField(envBytes("", ""))),                                 // route before the envelope: a@evil>x@srv
		frame(envField(envBytes("", "")), ref(8, 1), ref(8, 2)),                      // twice: the last, b@evil>y@srv
		frame(envField(envBytes("", "")), ref(8, 1<<32+1)),                           // past 32 bits: 1
		frame(envField(envBytes("", "")), ref(8, 2), ref(6, 0)),                      // route then a zero body type
		frame(envField(envBytes("c@evil", "z@srv")), ref(8, 0)),                      // route 0: its own
		frame(envField(envBytes("", "")), unknown, ref(8, 1)),                        // an unknown field: proto keeps it
		frame(envField(envBytes("", "")[:0]), envField(envBytes("", "")), ref(8, 2)), // two envelope fields: proto merges
	}
	for _, b := range stream {
		if _, err := s.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	waitCond(t, 5*time.Second, "seven envelopes from evil", func() bool { return rec.count.Load() >= 8 })
	got, _ := rec.snapshot()
	var routes []string
	for _, env := range got[1:] { // the first is the good peer's
		routes = append(routes, env.GetSender()+">"+env.GetRecipient())
	}
	if want := "[a@evil>x@srv b@evil>y@srv a@evil>x@srv b@evil>y@srv c@evil>z@srv a@evil>x@srv b@evil>y@srv]"; fmt.Sprint(routes) != want {
		t.Fatalf("routes %v, want %s", routes, want)
	}
}
