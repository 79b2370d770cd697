package envcodec

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"pgregory.net/rapid"

	"github.com/meshnode/meshnode/mailbox/pb"
)

// Around what CutOrigin says, an envelope's encoding gives the encoding
// of the same envelope whose origin says no node, outbox id or
// certificate, and the cut part is exactly those three fields.
func TestCutOriginCutsTheIdentity(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		str := rapid.StringMatching(`[a-z@./]{0,12}`)
		env := &pb.Envelope{ProtocolVersion: rapid.Uint32().Draw(t, "version"), MsgId: str.Draw(t, "id"),
			Sender: str.Draw(t, "sender"), Recipient: str.Draw(t, "recipient"), Sequence: rapid.Uint64().Draw(t, "seq"),
			TtlMs: rapid.Int64().Draw(t, "ttl")}
		bs := rapid.SliceOfN(rapid.Byte(), 0, 300)
		if rapid.Bool().Draw(t, "origin") {
			env.Origin = &pb.Origin{Node: str.Draw(t, "node"), OutboxId: bs.Draw(t, "outbox"),
				Certificate: bs.Draw(t, "cert"), Signature: bs.Draw(t, "sig")}
		}
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(env)
		if err != nil {
			t.Fatal(err)
		}
		at, from, to, end, ok := CutOrigin(b)
		o := env.GetOrigin()
		if len(o.GetCertificate()) == 0 {
			if ok {
				t.Fatalf("cut an origin without a certificate: [%d, %d)", from, to)
			}
			return
		}
		if !ok {
			t.Fatalf("refused the origin of %v", env)
		}
		var id pb.Origin
		if err := proto.Unmarshal(b[from:to], &id); err != nil ||
			!proto.Equal(&id, &pb.Origin{Node: o.GetNode(), OutboxId: o.GetOutboxId(), Certificate: o.GetCertificate()}) {
			t.Fatalf("cut %x: %v (%v)", b[from:to], &id, err)
		}
		cut := protowire.AppendTag(bytes.Clone(b[:at]), envOrigin, protowire.BytesType)
		cut = protowire.AppendVarint(cut, uint64(end-to))
		cut = append(cut, b[to:]...)
		stripped := proto.Clone(env).(*pb.Envelope)
		stripped.Origin.Node, stripped.Origin.OutboxId, stripped.Origin.Certificate = "", nil, nil
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(stripped)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(cut, want) {
			t.Fatalf("cut\n%x\nproto writes without the identity\n%x", cut, want)
		}
	})
}

// CutOrigin refuses an origin it could not cut so that the receiver's
// restoring gives back the envelope: two origin fields (proto merges
// them), identity fields out of order or again after the signature, and
// bytes that do not parse; it never reads out of bounds.
func TestCutOriginRefusesOtherShapes(t *testing.T) {
	field := func(b []byte, num protowire.Number, v string) []byte {
		return protowire.AppendString(protowire.AppendTag(b, num, protowire.BytesType), v)
	}
	origin := func(inner []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(nil, envOrigin, protowire.BytesType), inner)
	}
	good := origin(field(field(nil, 1, "n"), 3, "cert"))
	if _, _, _, _, ok := CutOrigin(good); !ok {
		t.Fatal("refused a plain origin")
	}
	for name, b := range map[string][]byte{
		"two origins":               append(bytes.Clone(good), good...),
		"out of order":              origin(field(field(nil, 3, "cert"), 1, "n")),
		"the certificate again":     origin(field(field(field(nil, 3, "cert"), 4, "sig"), 3, "more")),
		"a signature first":         origin(field(field(nil, 4, "sig"), 3, "cert")),
		"a node as a varint":        origin(protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), 7)),
		"truncated":                 good[:len(good)-1],
		"an origin as a varint":     protowire.AppendVarint(protowire.AppendTag(nil, envOrigin, protowire.VarintType), 1),
		"a signature alone":         origin(field(nil, 4, "sig")),
		"no certificate":            origin(field(field(field(nil, 1, "n"), 2, "id"), 4, "sig")),
		"junk before":               append([]byte{0xff}, good...),
		"a longer tag for the node": origin(append([]byte{1<<3 | 2 | 0x80, 0x00, 1, 'n'}, field(nil, 3, "c")...)),
	} {
		if _, _, _, _, ok := CutOrigin(b); ok {
			t.Errorf("%s: cut", name)
		}
	}
	rapid.Check(t, func(t *rapid.T) {
		CutOrigin(rapid.SliceOfN(rapid.Byte(), 0, 80).Draw(t, "bytes"))
	})
}
