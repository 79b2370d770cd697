package transport_test

import (
	"bytes"
	"fmt"
	"hash/fnv"
	"maps"
	"testing"

	"github.com/meshnode/meshnode/internal/envcodec"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"pgregory.net/rapid"
)

// genEnvelope draws an envelope with any subset of its fields set.
func genEnvelope(t *rapid.T) *pb.Envelope {
	str := func(label string) string {
		if rapid.Bool().Draw(t, label+"?") {
			return ""
		}
		return rapid.String().Draw(t, label)
	}
	env := &pb.Envelope{
		ProtocolVersion: rapid.Uint32().Draw(t, "pv"),
		MsgId:           str("msg_id"),
		IdempotencyKey:  str("key"),
		Sender:          str("sender"),
		Recipient:       str("recipient"),
		CreatedAtUnixMs: rapid.Int64().Draw(t, "created"),
		TtlMs:           rapid.Int64().Draw(t, "ttl"),
		Type:            str("type"),
		EventSeq:        rapid.Uint64().Draw(t, "event_seq"),
		Sequence:        rapid.Uint64().Draw(t, "seq"),
		Conflict:        pb.Envelope_Conflict(rapid.Int32().Draw(t, "conflict")),
		Attempt:         rapid.Uint32().Draw(t, "attempt"),
		Receipt:         pb.Envelope_ReceiptMode(rapid.Int32().Draw(t, "receipt")),
		PrevSequence:    rapid.Uint64().Draw(t, "prev"),
		StreamEpoch:     rapid.Uint64().Draw(t, "epoch"),
		CoalesceKey:     str("coalesce"),
	}
	if rapid.Bool().Draw(t, "headers?") {
		env.Headers = rapid.MapOfN(rapid.String(), rapid.String(), 0, 4).Draw(t, "headers")
	}
	if rapid.Bool().Draw(t, "body?") {
		env.Body = &anypb.Any{TypeUrl: str("type_url"), Value: rapid.SliceOfN(rapid.Byte(), 0, 2000).Draw(t, "value")}
	}
	if rapid.Bool().Draw(t, "rpc?") {
		env.Rpc = &pb.RpcMeta{
			Kind:          pb.RpcMeta_Kind(rapid.Int32().Draw(t, "kind")),
			Service:       str("service"),
			Method:        str("method"),
			CorrelationId: str("corr"),
			ReplyTo:       str("reply_to"),
		}
	}
	return env
}

// frameBody strips the frame prefix and the Frame wrapper from an encoded
// envelope frame.
func frameBody(tb interface{ Fatalf(string, ...any) }, frame []byte) []byte {
	_, n := protowire.ConsumeVarint(frame)
	_, _, tn := protowire.ConsumeTag(frame[n:])
	v, vn := protowire.ConsumeBytes(frame[n+tn:])
	if n < 0 || tn < 0 || vn < 0 || n+tn+vn != len(frame) {
		tb.Fatalf("malformed frame % x", frame)
	}
	return v
}

// The hand-written encoder writes exactly proto.Marshal's bytes (with
// sorted map keys, which is Deterministic's order and, for up to one
// header, the only order), and the fast decoder reads them back equal.
func TestEnvelopeCodecMatchesProto(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		env := genEnvelope(t)
		got, err := transport.AppendEnvelopeFrame(nil, env, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(env)
		if err != nil {
			t.Fatal(err)
		}
		if body := frameBody(t, got); !bytes.Equal(body, want) {
			t.Fatalf("hand-written bytes differ from proto.Marshal:\n got % x\nwant % x", body, want)
		}
		if len(env.Headers) <= 1 {
			generic, err := transport.AppendEnvelopeFrameGeneric(nil, env, 1<<20)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, generic) {
				t.Fatalf("frame differs from the generic frame:\n got % x\nwant % x", got, generic)
			}
		}
		dec, ok := transport.DecodeEnvelopeFast(want)
		if !ok {
			t.Fatalf("fast decoder refused proto.Marshal's bytes % x", want)
		}
		if !proto.Equal(dec, env) {
			t.Fatalf("decoded %v, want %v", dec, env)
		}
	})
}

// Input the fast paths were not written for goes to the generic code, with
// the generic result.
func TestEnvelopeCodecFallback(t *testing.T) {
	base, err := proto.Marshal(&pb.Envelope{MsgId: "m", Rpc: &pb.RpcMeta{Kind: pb.RpcMeta_EVENT}})
	if err != nil {
		t.Fatal(err)
	}
	tag := func(b []byte, num protowire.Number, typ protowire.Type) []byte {
		return protowire.AppendTag(b, num, typ)
	}
	entry := func(fields ...[]byte) []byte {
		var e []byte
		for _, f := range fields {
			e = append(e, f...)
		}
		return protowire.AppendBytes(tag(nil, 9, protowire.BytesType), e)
	}
	strField := func(num protowire.Number, s string) []byte {
		return protowire.AppendString(tag(nil, num, protowire.BytesType), s)
	}
	cases := []struct {
		name  string
		input []byte
	}{
		{"unknown field", protowire.AppendVarint(tag(bytes.Clone(base), 99, protowire.VarintType), 7)},
		{"field twice", append(bytes.Clone(base), strField(2, "again")...)},
		{"rpc twice merges", append(bytes.Clone(base), protowire.AppendBytes(tag(nil, 11, protowire.BytesType), strField(2, "svc"))...)},
		{"wrong wire type", protowire.AppendVarint(tag(bytes.Clone(base), 2, protowire.VarintType), 1)},
		{"invalid utf-8", append(bytes.Clone(base), strField(8, "\xff")...)},
		{"map value before key", append(bytes.Clone(base), entry(strField(2, "v"), strField(1, "k"))...)},
		{"map unknown field", append(bytes.Clone(base), entry(strField(1, "k"), strField(3, "x"))...)},
		{"body unknown field", append(bytes.Clone(base), protowire.AppendBytes(tag(nil, 10, protowire.BytesType), strField(5, "x"))...)},
		{"truncated", base[:len(base)-1]},
		{"group", tag(nil, 2, protowire.StartGroupType)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, ok := transport.DecodeEnvelopeFast(tc.input); ok {
				t.Fatal("fast path accepted input it should hand to proto.Unmarshal")
			}
			checkDecodeMatches(t, tc.input)
		})
	}
	// The encoder refuses what proto.Marshal refuses and keeps unknown fields.
	bad := &pb.Envelope{Headers: map[string]string{"k": "\xff"}}
	if _, err := transport.AppendEnvelopeFrame(nil, bad, 1<<20); err == nil {
		t.Fatal("invalid UTF-8 header encoded")
	}
	var withUnknown pb.Envelope
	if err := proto.Unmarshal(protowire.AppendVarint(tag(bytes.Clone(base), 99, protowire.VarintType), 7), &withUnknown); err != nil {
		t.Fatal(err)
	}
	frame, err := transport.AppendEnvelopeFrame(nil, &withUnknown, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if got := frameBody(t, frame); !bytes.Contains(got, protowire.AppendVarint(tag(nil, 99, protowire.VarintType), 7)) {
		t.Fatalf("unknown field lost: % x", got)
	}
}

// checkDecodeMatches decodes b with the hand-written decoder and with
// proto.Unmarshal and fails unless both agree.
func checkDecodeMatches(tb testing.TB, b []byte) {
	tb.Helper()
	got, err := transport.DecodeEnvelope(b)
	var want pb.Envelope
	werr := proto.Unmarshal(b, &want)
	if (err == nil) != (werr == nil) {
		tb.Fatalf("decode error %v, proto.Unmarshal error %v", err, werr)
	}
	if err == nil && !proto.Equal(got, &want) {
		tb.Fatalf("decoded %v, proto.Unmarshal %v", got, &want)
	}
	if err == nil {
		envcodec.Recycle(got) // the next input decodes into it
	}
}

// An envelope handed back with Recycle decodes the next one as a new one
// would (nothing of the last is left, whichever parts either had), and
// what was read from it before stays as it was: strings, the body's bytes
// and the headers map are not reused.
func TestRecycledEnvelopeDecodesAsNew(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		type kept struct {
			want    *pb.Envelope
			id      string
			value   []byte
			headers map[string]string
		}
		var all []kept
		for i := range rapid.IntRange(1, 8).Draw(t, "n") {
			want := genEnvelope(t)
			b, err := proto.MarshalOptions{Deterministic: true}.Marshal(want)
			if err != nil {
				t.Fatal(err)
			}
			got, ok := transport.DecodeEnvelopeFast(b)
			if !ok {
				t.Fatalf("fast decoder refused proto.Marshal's bytes % x", b)
			}
			if !proto.Equal(got, want) {
				t.Fatalf("envelope %d decoded %v, want %v", i, got, want)
			}
			all = append(all, kept{want, got.GetMsgId(), got.GetBody().GetValue(), got.GetHeaders()})
			envcodec.Recycle(got)
		}
		for i, k := range all {
			if k.id != k.want.GetMsgId() || !bytes.Equal(k.value, k.want.GetBody().GetValue()) || !maps.Equal(k.headers, k.want.GetHeaders()) {
				t.Fatalf("envelope %d: what was read before Recycle changed: id %q, body % x, headers %v; want %q, % x, %v",
					i, k.id, k.value, k.headers, k.want.GetMsgId(), k.want.GetBody().GetValue(), k.want.GetHeaders())
			}
		}
	})
}

// Strings and the body share one copy of the input: the input can be
// reused at once, and neither writing into every byte of the body nor an
// append to it reaches a string.
func TestDecodeEnvelopeOwnsItsBytes(t *testing.T) {
	for _, size := range []int{8, 64 << 10} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			in := &pb.Envelope{MsgId: "id-1", Body: &anypb.Any{TypeUrl: "u", Value: bytes.Repeat([]byte{1}, size)}, Type: "after",
				Headers: map[string]string{"k": "v"}, Rpc: &pb.RpcMeta{Method: "m", CorrelationId: "c"}}
			b, err := proto.Marshal(in)
			if err != nil {
				t.Fatal(err)
			}
			env, err := transport.DecodeEnvelope(b)
			if err != nil {
				t.Fatal(err)
			}
			clear(b)
			if !bytes.Equal(env.Body.Value, in.Body.Value) {
				t.Fatal("the body changed when the input was cleared")
			}
			v := env.Body.Value
			for i := range v {
				v[i] = 0xff
			}
			_ = append(v, 9, 9, 9, 9, 9, 9, 9, 9)
			if env.MsgId != "id-1" || env.Type != "after" || env.Body.TypeUrl != "u" || env.Headers["k"] != "v" ||
				env.Rpc.GetMethod() != "m" || env.Rpc.GetCorrelationId() != "c" {
				t.Fatalf("a string changed when the body was written: %v", env)
			}
		})
	}
}

// FuzzEnvelopeCodec: the hand-written decoder agrees with proto.Unmarshal
// on any input and never panics.
func FuzzEnvelopeCodec(f *testing.F) {
	for _, env := range []*pb.Envelope{
		{},
		{ProtocolVersion: 1, MsgId: "m", Sender: "@a", Recipient: "x@b", CreatedAtUnixMs: 1700000000000,
			Headers: map[string]string{"k": "v", "": ""}, Body: &anypb.Any{TypeUrl: "type.googleapis.com/x", Value: []byte{8, 1}},
			Rpc:      &pb.RpcMeta{Kind: pb.RpcMeta_REQUEST, Service: "s", Method: "m", CorrelationId: "c", ReplyTo: "@a"},
			EventSeq: 1, Sequence: 2, Conflict: pb.Envelope_OVERWRITE, Attempt: 3, Receipt: pb.Envelope_RECEIPT_PROCESSED, PrevSequence: 1},
		{Conflict: -1, Rpc: &pb.RpcMeta{}, Body: &anypb.Any{}},
		// A forwarded envelope: origin (field 21) takes the generic path.
		{MsgId: "m", Recipient: "x@c", Sequence: 3, Receipt: pb.Envelope_RECEIPT_PROCESSED,
			Origin: &pb.Origin{Node: "a", OutboxId: []byte("0123456789abcdef"), Certificate: []byte{0x30, 0x82}, Signature: []byte{0x30, 0x45}}},
	} {
		b, err := proto.Marshal(env)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0x12, 0x01, 0xff})
	f.Add([]byte{0x4a, 0x04, 0x12, 0x00, 0x0a, 0x00})
	f.Add([]byte{0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f})
	f.Fuzz(func(t *testing.T, b []byte) {
		checkDecodeMatches(t, b)
	})
}

func benchEnvelope() *pb.Envelope {
	return &pb.Envelope{
		ProtocolVersion: 1, MsgId: "01JAXQ4Z8K3M5N7P9R1T3V5X7Z", Sender: "@n1", Recipient: "sink@n2",
		CreatedAtUnixMs: 1700000000000, Rpc: &pb.RpcMeta{Kind: pb.RpcMeta_EVENT},
		Body: &anypb.Any{TypeUrl: "type.googleapis.com/meshnode.v1.Status", Value: bytes.Repeat([]byte{'x'}, 128)},
	}
}

// BenchmarkEnvelopeEncode compares the hand-written frame encoder with the
// proto.Marshal-based one for a tell-sized envelope.
func BenchmarkEnvelopeEncode(b *testing.B) {
	env := benchEnvelope()
	for _, c := range []struct {
		name string
		enc  func([]byte, *pb.Envelope, int) ([]byte, error)
	}{{"hand", transport.AppendEnvelopeFrame}, {"proto", transport.AppendEnvelopeFrameGeneric}} {
		b.Run(c.name, func(b *testing.B) {
			buf := make([]byte, 0, 1024)
			b.ReportAllocs()
			for b.Loop() {
				var err error
				if buf, err = c.enc(buf[:0], env, 1<<20); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}

// BenchmarkEnvelopeDecode compares the hand-written decoder with
// proto.Unmarshal.
func BenchmarkEnvelopeDecode(b *testing.B) {
	raw, err := proto.Marshal(benchEnvelope())
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		dec  func([]byte) (*pb.Envelope, error)
	}{
		{"hand", transport.DecodeEnvelope},
		{"proto", func(b []byte) (*pb.Envelope, error) {
			env := new(pb.Envelope)
			return env, proto.Unmarshal(b, env)
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.dec(raw); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}

// laneOf is FNV-1a of the recipient, as hash/fnv computes it, so a
// recipient keeps its lane across versions.
func TestLaneOfIsFNV1a(t *testing.T) {
	for _, r := range []string{"", "a@b", "worker-17@n2", "ünïcode@n", string(bytes.Repeat([]byte{0xff}, 40))} {
		for _, lanes := range []int{1, 3, 4, 64} {
			h := fnv.New32a()
			_, _ = h.Write([]byte(r))
			if got, want := transport.LaneOf(r, lanes), int(h.Sum32()%uint32(lanes)); got != want {
				t.Errorf("LaneOf(%q, %d) = %d, want %d", r, lanes, got, want)
			}
		}
	}
}
