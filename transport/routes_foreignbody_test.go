package transport_test

import (
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/envcodec"
	"github.com/meshnode/meshnode/mailbox/pb"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// SendEncoded with a Body that came with other bytes sends them as they
// are, even when the bytes at the Body's offsets look like a sender and a
// recipient field: here they are inside another field (a msg id), which
// a cut would corrupt.
func TestSendEncodedWithAnotherEnvelopesBodyGoesAsItIs(t *testing.T) {
	a, _, rec := featuresPair(t, nil)
	r, ok := envcodec.NewRoute("s", "r", "t/x")
	if !ok {
		t.Fatal("route")
	}
	_, body := r.Append(nil, envcodec.Plain{ID: []byte("abcdefgh"), Value: []byte("v")})
	// body says the route is at [12, 18): after the version (2 bytes),
	// the id's tag and length (2) and the 8-byte id.
	want := &pb.Envelope{ProtocolVersion: pb.ProtocolVersion, MsgId: "01234567\"\x01s*\x01rzz",
		Sender: "real@a", Recipient: "real@b", Body: &anypb.Any{TypeUrl: "t/y", Value: []byte("payload")}}
	wire, err := proto.MarshalOptions{Deterministic: true}.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.SendEncoded(ctxT(t, 5*time.Second), "b", want.GetRecipient(), wire, body); err != nil {
		t.Fatal(err)
	}
	// Then the same bytes with no Body, which go as they are.
	if err := a.SendEncoded(ctxT(t, 5*time.Second), "b", want.GetRecipient(), wire, envcodec.Body{}); err != nil {
		t.Fatal(err)
	}
	pollFor(5*time.Second, func() bool { return rec.count.Load() >= 2 })
	got, _ := rec.snapshot()
	if len(got) == 0 {
		t.Fatalf("b got nothing; a's logs:\n%s", a.logs.String())
	}
	for i, env := range got {
		if !proto.Equal(env, want) {
			t.Fatalf("envelope %d arrived as %v, sent %v", i, env, want)
		}
	}
	if len(got) != 2 {
		t.Fatalf("b got %d envelopes, want 2; a's logs:\n%s", len(got), a.logs.String())
	}
}
