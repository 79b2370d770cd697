package envcodec

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"pgregory.net/rapid"

	"github.com/meshnode/meshnode/mailbox/pb"
)

// A route writes, byte for byte, what Append and proto.Marshal write for
// the same envelope, and what it writes decodes back to that envelope.
func TestRouteMatchesAppend(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		sender := rapid.String().Draw(t, "sender")
		recipient := rapid.String().Draw(t, "recipient")
		url := rapid.String().Draw(t, "url")
		p := Plain{
			ID:              []byte(rapid.StringMatching(`[A-Za-z0-9_-]{0,30}`).Draw(t, "id")),
			CreatedAtUnixMs: rapid.Int64().Draw(t, "created"),
			Kind:            pb.RpcMeta_Kind(rapid.Int32().Draw(t, "kind")),
			Value:           rapid.SliceOfN(rapid.Byte(), 0, 300).Draw(t, "value"),
			TtlMs:           rapid.Int64().Draw(t, "ttl"),
		}
		r, ok := NewRoute(sender, recipient, url)
		if !ok {
			t.Fatalf("NewRoute refused valid strings %q %q %q", sender, recipient, url)
		}
		if !r.Is(sender, recipient, url) || r.Is(sender+"x", recipient, url) {
			t.Fatal("Is does not name the route's own strings")
		}
		env := &pb.Envelope{
			ProtocolVersion: pb.ProtocolVersion, MsgId: string(p.ID), Sender: sender, Recipient: recipient,
			CreatedAtUnixMs: p.CreatedAtUnixMs, Body: &anypb.Any{TypeUrl: url, Value: p.Value},
			Rpc: &pb.RpcMeta{Kind: p.Kind}, TtlMs: p.TtlMs,
		}
		prefix := []byte{7, 7}
		got, body := r.Append(bytes.Clone(prefix), p)
		if !bytes.Equal(got[:2], prefix) {
			t.Fatal("Append overwrote what b held")
		}
		got = got[2:]
		cutsAsUnnamed(t, got, body, env)
		cutsAsUnrouted(t, got, body, env)
		sz, ok := Size(env)
		if !ok {
			t.Fatal("Size refused the envelope")
		}
		if want := Append(nil, env, sz); !bytes.Equal(got, want) {
			t.Fatalf("route wrote\n%x\nAppend writes\n%x", got, want)
		}
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(env)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("route wrote\n%x\nproto writes\n%x", got, want)
		}
		dec, ok := Decode(got, false)
		if !ok {
			t.Fatal("Decode refused the route's bytes")
		}
		if len(p.Value) == 0 {
			env.Body.Value = nil // as proto.Unmarshal decodes an empty value
		}
		if !proto.Equal(dec, env) {
			t.Fatalf("decoded %v, want %v", dec, env)
		}
	})
}

// Strings proto would refuse to encode make no route.
func TestRouteRefusesInvalidUTF8(t *testing.T) {
	for _, s := range [][3]string{{"\xff", "a@n", "u"}, {"@n", "\xc3", "u"}, {"@n", "a@n", "type/\x80"}} {
		if _, ok := NewRoute(s[0], s[1], s[2]); ok {
			t.Errorf("NewRoute(%q, %q, %q) made a route", s[0], s[1], s[2])
		}
	}
}

// cutsAsUnnamed checks that CutTypeURL around body in b, the encoding of
// env, gives the encoding of env with a body that says no type.
func cutsAsUnnamed(t *rapid.T, b []byte, body Body, env *pb.Envelope) {
	head, bodyLen, tail, ok := CutTypeURL(b, body)
	if env.GetBody().GetTypeUrl() == "" {
		if ok {
			t.Fatal("CutTypeURL cut an empty type URL, which the body does not encode")
		}
		return
	}
	if !ok {
		t.Fatalf("CutTypeURL refused the route's own body at %d", body.at)
	}
	if _, _, _, ok := CutTypeURL(b, Body{at: body.at, url: body.url + "x"}); ok {
		t.Fatal("CutTypeURL cut another type URL than the body's")
	}
	cut := protowire.AppendVarint(bytes.Clone(head), bodyLen)
	cut = append(cut, tail...)
	unnamed := proto.Clone(env).(*pb.Envelope)
	unnamed.Body.TypeUrl = ""
	want, err := proto.MarshalOptions{Deterministic: true}.Marshal(unnamed)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(cut, want) {
		t.Fatalf("cut\n%x\nproto writes without the type\n%x", cut, want)
	}
}

// CutTypeURL refuses what is not a body with that type URL where it is
// told to look, and never reads out of bounds.
func TestCutTypeURLRefusesOtherBytes(t *testing.T) {
	r, _ := NewRoute("s@n1", "r@n2", "type.googleapis.com/x.Y")
	b, body := r.Append(nil, Plain{ID: []byte("id"), Value: []byte("v")})
	at := body.at
	for _, tc := range []struct {
		name string
		b    []byte
		at   int
		url  string
	}{
		{"another offset", b, at - 1, "type.googleapis.com/x.Y"},
		{"past the end", b, len(b), "type.googleapis.com/x.Y"},
		{"negative", b, -1, "type.googleapis.com/x.Y"},
		{"another type", b, at, "type.googleapis.com/x.Z"},
		{"a longer type", b, at, "type.googleapis.com/x.YY"},
		{"cut short", b[:at+5], at, "type.googleapis.com/x.Y"},
		{"no body", b[:at+1], at, "type.googleapis.com/x.Y"},
	} {
		if _, _, _, ok := CutTypeURL(tc.b, Body{at: tc.at, url: tc.url}); ok {
			t.Errorf("%s: cut", tc.name)
		}
	}
	if _, _, _, ok := CutTypeURL(b, Body{}); ok {
		t.Error("the zero Body: cut")
	}
	rapid.Check(t, func(t *rapid.T) {
		b := rapid.SliceOfN(rapid.Byte(), 0, 64).Draw(t, "bytes")
		CutTypeURL(b, Body{at: rapid.IntRange(-2, 70).Draw(t, "at"), url: rapid.String().Draw(t, "url")})
	})
}

// A type URL whose length is written in more bytes than it needs is valid
// protobuf, but not what Append writes: CutTypeURL refuses it (and does
// not slice past the URL it measured).
func TestCutTypeURLRefusesALongerLengthOfTheURL(t *testing.T) {
	const url = "t/a"
	var body []byte
	body = protowire.AppendTag(body, anyTypeURL, protowire.BytesType)
	body = append(body, 0x83, 0x80, 0x80, 0x80, 0x00) // 3, in five bytes
	body = append(body, url...)
	body = protowire.AppendTag(body, anyValue, protowire.BytesType)
	body = protowire.AppendBytes(body, []byte("v"))
	var env []byte
	env = protowire.AppendTag(env, envRecipient, protowire.BytesType)
	env = protowire.AppendString(env, "r@n")
	at := len(env)
	env = protowire.AppendTag(env, envBody, protowire.BytesType)
	env = protowire.AppendBytes(env, body)
	var e pb.Envelope
	if err := proto.Unmarshal(env, &e); err != nil || !proto.Equal(e.GetBody(), &anypb.Any{TypeUrl: url, Value: []byte("v")}) {
		t.Fatalf("not the valid envelope meant: %v, %v", e.GetBody(), err)
	}
	if _, _, _, ok := CutTypeURL(env, Body{at: at, url: url}); ok {
		t.Fatal("cut a type URL whose length Append would not write")
	}
}

// AppendBody writes what Append writes and says where the body is, from
// the envelope's first byte, whatever b held before: around it CutTypeURL
// gives the envelope without its type, for envelopes of every field.
func TestAppendBodyCutsAsUnnamed(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		str := rapid.StringMatching(`[a-z@./]{0,12}`)
		env := &pb.Envelope{
			ProtocolVersion: rapid.Uint32().Draw(t, "version"),
			MsgId:           str.Draw(t, "id"),
			IdempotencyKey:  str.Draw(t, "key"),
			Sender:          str.Draw(t, "sender"),
			Recipient:       str.Draw(t, "recipient"),
			CreatedAtUnixMs: rapid.Int64().Draw(t, "created"),
			Type:            str.Draw(t, "type"),
			Headers:         rapid.MapOfN(str, str, 0, 3).Draw(t, "headers"),
			Sequence:        rapid.Uint64().Draw(t, "sequence"),
			Receipt:         pb.Envelope_ReceiptMode(rapid.Int32Range(0, 2).Draw(t, "receipt")),
			PrevSequence:    rapid.Uint64().Draw(t, "prev"),
			CoalesceKey:     str.Draw(t, "coalesce"),
			TtlMs:           rapid.Int64().Draw(t, "ttl"),
		}
		if rapid.Bool().Draw(t, "body") {
			env.Body = &anypb.Any{TypeUrl: str.Draw(t, "url"), Value: rapid.SliceOfN(rapid.Byte(), 0, 200).Draw(t, "value")}
		}
		if rapid.Bool().Draw(t, "rpc") {
			env.Rpc = &pb.RpcMeta{Kind: pb.RpcMeta_Kind(rapid.Int32Range(0, 3).Draw(t, "kind")), CorrelationId: str.Draw(t, "corr"), ReplyTo: str.Draw(t, "reply")}
		}
		sz, ok := Size(env)
		if !ok {
			t.Fatal("Size refused the envelope")
		}
		prefix := rapid.SliceOfN(rapid.Byte(), 0, 5).Draw(t, "prefix")
		got, body := AppendBody(bytes.Clone(prefix), env, sz)
		if !bytes.Equal(got[:len(prefix)], prefix) {
			t.Fatal("AppendBody overwrote what b held")
		}
		got = got[len(prefix):]
		if want := Append(nil, env, sz); !bytes.Equal(got, want) {
			t.Fatalf("AppendBody wrote\n%x\nAppend writes\n%x", got, want)
		}
		if body.TypeURL() != env.GetBody().GetTypeUrl() {
			t.Fatalf("Body names type %q, the envelope's is %q", body.TypeURL(), env.GetBody().GetTypeUrl())
		}
		cutsAsUnrouted(t, got, body, env)
		if body.TypeURL() == "" {
			if body.at != 0 {
				t.Fatalf("Body %+v for a body without a type, want no body", body)
			}
			return
		}
		cutsAsUnnamed(t, got, body, env)
	})
}

// cutsAsUnrouted checks that CutRoute around body in b, the encoding of
// env, gives env's sender and recipient, and without them the encoding of
// env without both; and with the type URL cut as well (as a lane sends an
// envelope that names both), the encoding of env without the three.
func cutsAsUnrouted(t *rapid.T, b []byte, body Body, env *pb.Envelope) {
	from, to, ok := CutRoute(b, body)
	if env.GetSender() == "" || env.GetRecipient() == "" {
		if ok || body.HasRoute() {
			t.Fatalf("CutRoute cut a route from an envelope without a sender %q or a recipient %q", env.GetSender(), env.GetRecipient())
		}
		return
	}
	if !ok {
		t.Fatalf("CutRoute refused the encoder's own route at [%d, %d)", body.from, body.to)
	}
	var fields pb.Envelope
	if err := proto.Unmarshal(b[from:to], &fields); err != nil || fields.GetSender() != env.GetSender() ||
		fields.GetRecipient() != env.GetRecipient() || !proto.Equal(&fields, &pb.Envelope{Sender: env.GetSender(), Recipient: env.GetRecipient()}) {
		t.Fatalf("CutRoute cut %x: %v (%v), the envelope's are %q → %q", b[from:to], &fields, err, env.GetSender(), env.GetRecipient())
	}
	for _, other := range []Body{{from: from + 1, to: to}, {from: from, to: to - 1}, {from: from, to: to + 1}} {
		if _, _, ok := CutRoute(b, other); ok && other.to <= len(b) {
			t.Fatalf("CutRoute cut at [%d, %d), the route is at [%d, %d)", other.from, other.to, from, to)
		}
	}
	unrouted := proto.Clone(env).(*pb.Envelope)
	unrouted.Sender, unrouted.Recipient = "", ""
	want, err := proto.MarshalOptions{Deterministic: true}.Marshal(unrouted)
	if err != nil {
		t.Fatal(err)
	}
	if cut := append(bytes.Clone(b[:from]), b[to:]...); !bytes.Equal(cut, want) {
		t.Fatalf("cut\n%x\nproto writes without the route\n%x", cut, want)
	}
	head, bodyLen, tail, ok := CutTypeURL(b, body)
	if !ok {
		return
	}
	if to > len(head) {
		t.Fatalf("the route [%d, %d) ends past the body's start %d", from, to, len(head))
	}
	both := append(bytes.Clone(b[:from]), head[to:]...)
	both = protowire.AppendVarint(both, bodyLen)
	both = append(both, tail...)
	unrouted.Body.TypeUrl = ""
	if want, err = (proto.MarshalOptions{Deterministic: true}).Marshal(unrouted); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(both, want) {
		t.Fatalf("cut\n%x\nproto writes without the route and the type\n%x", both, want)
	}
}

// CutRoute refuses what is not a sender and a recipient field, exactly,
// where it is told to look, and never reads out of bounds.
func TestCutRouteRefusesOtherBytes(t *testing.T) {
	r, _ := NewRoute("s@n1", "r@n2", "type.googleapis.com/x.Y")
	b, body := r.Append(nil, Plain{ID: []byte("id"), Value: []byte("v")})
	if from, to, ok := CutRoute(b, body); !ok || string(b[from:to]) != "\x22\x04s@n1\x2a\x04r@n2" {
		t.Fatalf("CutRoute of the route's own bytes: [%d, %d) %v", from, to, ok)
	}
	from, to := body.from, body.to
	for _, tc := range []struct {
		name     string
		b        []byte
		from, to int
	}{
		{"earlier", b, from - 1, to},
		{"later", b, from + 1, to},
		{"short", b, from, to - 1},
		{"long", b, from, to + 1},
		{"the sender alone", b, from, from + 6},
		{"past the end", b[:to-1], from, to},
		{"negative", b, -1, to},
		{"empty", b, from, from},
	} {
		if _, _, ok := CutRoute(tc.b, Body{from: tc.from, to: tc.to}); ok {
			t.Errorf("%s: cut", tc.name)
		}
	}
	if _, _, ok := CutRoute(b, Body{}); ok {
		t.Error("the zero Body: cut")
	}
	// A length written in more bytes than it needs is valid protobuf, but
	// not what the encoders write.
	long := []byte{byte(envSender)<<3 | byte(protowire.BytesType), 0x81, 0x00, 'a', byte(envRecipient)<<3 | byte(protowire.BytesType), 1, 'b'}
	if _, _, ok := CutRoute(long, Body{from: 0, to: len(long)}); ok {
		t.Error("cut a sender whose length Append would not write")
	}
	// Bytes that look like the two fields, inside another field (a msg
	// id), at the offsets another envelope's Body says.
	short, _ := NewRoute("s", "r", "t/x")
	_, shortBody := short.Append(nil, Plain{ID: []byte("abcdefgh"), Value: []byte("v")})
	inside, _ := NewRoute("real@a", "real@b", "t/y")
	foreign, _ := inside.Append(nil, Plain{ID: []byte("01234567\"\x01s*\x01rzz"), Value: []byte("v")})
	if got := foreign[shortBody.from:shortBody.to]; string(got) != "\"\x01s*\x01r" {
		t.Fatalf("the look-alike is not where the Body says: %q", got)
	}
	if _, _, ok := CutRoute(foreign, shortBody); ok {
		t.Error("cut look-alike fields inside the msg id")
	}
	// A body with its type URL, as Append writes it, inside a msg id.
	fake := []byte{byte(envBody)<<3 | 2, 5, byte(anyTypeURL)<<3 | 2, 3, 't', '/', 'y'}
	inID, _ := inside.Append(nil, Plain{ID: append([]byte("id"), fake...), Value: []byte("v")})
	at := bytes.Index(inID, fake)
	if _, _, _, ok := CutTypeURL(inID, Body{at: at, url: "t/y"}); ok {
		t.Errorf("CutTypeURL cut a look-alike body inside the msg id, at %d", at)
	}
	rapid.Check(t, func(t *rapid.T) {
		b := rapid.SliceOfN(rapid.Byte(), 0, 64).Draw(t, "bytes")
		CutRoute(b, Body{from: rapid.IntRange(-2, 70).Draw(t, "from"), to: rapid.IntRange(-2, 70).Draw(t, "to")})
	})
}

// BenchmarkCutsOfATell: what the lane's checks cost for a plain tell's
// two cuts (its body's type and its route), each of which walks the
// envelope's fields from its start to its own.
func BenchmarkCutsOfATell(b *testing.B) {
	r, _ := NewRoute("@n0", "sink@n1", "type.googleapis.com/google.protobuf.BytesValue")
	env, body := r.Append(nil, Plain{ID: []byte("abcdefghijklmnopqrstuv"), CreatedAtUnixMs: 1764900000000, Kind: pb.RpcMeta_EVENT, Value: make([]byte, 128)})
	b.ResetTimer()
	for range b.N {
		_, _, _, typed := CutTypeURL(env, body)
		_, _, routed := CutRoute(env, body)
		if !typed || !routed {
			b.Fatal("a tell's own Body did not cut")
		}
	}
}
