package transport_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"testing"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

func sampleFrames() []*pb.Frame {
	return []*pb.Frame{
		{Kind: &pb.Frame_Hello{Hello: &pb.Hello{NodeName: "n1", BootId: "b", ProtocolVersions: []uint32{1}, Cluster: "c", GoneConnection: 0x0123456789abcdef}}},
		{Kind: &pb.Frame_Envelope{Envelope: &pb.Envelope{MsgId: "m", Recipient: "a@n", Headers: map[string]string{"k": "v"}}}},
		{Kind: &pb.Frame_Receipt{Receipt: &pb.Receipt{MsgId: "m", Code: pb.Receipt_CAPACITY, RetryAfterMs: 50}}},
		{Kind: &pb.Frame_Goaway{Goaway: &pb.GoAway{Code: 1, Reason: "bye"}}},
		{},
	}
}

func TestFrameRoundTrip(t *testing.T) {
	var buf []byte
	var err error
	frames := sampleFrames()
	for _, f := range frames {
		if buf, err = transport.AppendFrame(buf, f); err != nil {
			t.Fatal(err)
		}
	}
	br := bufio.NewReader(bytes.NewReader(buf))
	total := 0
	for i, want := range frames {
		var got pb.Frame
		n, err := transport.ReadFrame(br, 1<<20, &got)
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		total += n
		if !proto.Equal(&got, want) {
			t.Fatalf("frame %d: got %v, want %v", i, &got, want)
		}
	}
	if total != len(buf) {
		t.Fatalf("consumed %d bytes, wrote %d", total, len(buf))
	}
	var f pb.Frame
	if _, err := transport.ReadFrame(br, 1<<20, &f); !errors.Is(err, io.EOF) {
		t.Fatalf("at end: %v, want io.EOF", err)
	}
}

func TestReadFrameErrors(t *testing.T) {
	big, _ := transport.AppendFrame(nil, &pb.Frame{Kind: &pb.Frame_Envelope{Envelope: &pb.Envelope{Type: string(make([]byte, 2000))}}})
	cases := []struct {
		name  string
		input []byte
		max   int
		want  error
	}{
		{"too large", appendUvarint(nil, 1<<40), 1 << 20, transport.ErrFrameTooLarge},
		{"just over max", big, len(big) - 3, transport.ErrFrameTooLarge},
		{"garbage body", []byte{3, 0xff, 0xff, 0xff}, 1 << 20, transport.ErrBadFrame},
		{"overflow prefix", bytes.Repeat([]byte{0xff}, 11), 1 << 20, transport.ErrBadFrame},
		{"truncated prefix", []byte{0x80}, 1 << 20, io.ErrUnexpectedEOF},
		{"truncated body", []byte{10, 1, 2}, 1 << 20, io.ErrUnexpectedEOF},
		{"truncated large body", big[:len(big)-1], 1 << 20, io.ErrUnexpectedEOF},
		{"zero max", []byte{0}, 0, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var f pb.Frame
			// A small buffer makes frames above it take the allocating path.
			_, err := transport.ReadFrame(bufio.NewReaderSize(bytes.NewReader(tc.input), 16), tc.max, &f)
			if err == nil {
				t.Fatal("no error")
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
}

func FuzzReadFrame(f *testing.F) {
	for _, fr := range sampleFrames() {
		b, err := transport.AppendFrame(nil, fr)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Add([]byte{5, 0x12, 0x03, 'a', 'b'})
	f.Add(appendUvarint(nil, 4<<20+1))
	f.Fuzz(func(t *testing.T, data []byte) {
		br := bufio.NewReaderSize(bytes.NewReader(data), 64)
		for {
			var fr pb.Frame
			n, err := transport.ReadFrame(br, 4096, &fr)
			if err != nil {
				if n > len(data) {
					t.Fatalf("consumed %d of %d bytes", n, len(data))
				}
				return
			}
			// A frame that decoded re-encodes to a frame that decodes equal.
			b, err := transport.AppendFrame(nil, &fr)
			if err != nil {
				t.Fatalf("re-encode: %v", err)
			}
			var again pb.Frame
			if _, err := transport.ReadFrame(bufio.NewReader(bytes.NewReader(b)), 1<<20, &again); err != nil {
				t.Fatalf("re-decode: %v", err)
			}
			if !proto.Equal(&fr, &again) {
				t.Fatalf("round trip changed the frame: %v != %v", &fr, &again)
			}
		}
	})
}

// The hand-written wrapper must give exactly the bytes of a marshalled
// pb.Frame, or peers running the generic decoder would disagree.
func TestAppendMsgFrameMatchesAppendFrame(t *testing.T) {
	envs := []*pb.Envelope{
		{},
		{MsgId: "m", Recipient: "a@n", Headers: map[string]string{"k": "v"}},
		{MsgId: "big", Type: string(make([]byte, 300))}, // a two-byte inner length
		{MsgId: "huge", Type: string(make([]byte, 70000))},
	}
	for i, env := range envs {
		want, err := transport.AppendFrame(nil, &pb.Frame{Kind: &pb.Frame_Envelope{Envelope: env}})
		if err != nil {
			t.Fatal(err)
		}
		got, err := transport.AppendEnvelopeFrame([]byte("prefix"), env, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got[len("prefix"):], want) || string(got[:len("prefix")]) != "prefix" {
			t.Fatalf("envelope %d: hand-written frame differs from AppendFrame", i)
		}
	}
	rc := &pb.Receipt{MsgId: "m", Code: pb.Receipt_CAPACITY, RetryAfterMs: 50, Message: "full"}
	want, _ := transport.AppendFrame(nil, &pb.Frame{Kind: &pb.Frame_Receipt{Receipt: rc}})
	got, err := transport.AppendReceiptFrame(nil, rc, 1<<20)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("receipt frame differs from AppendFrame (err %v)", err)
	}
}

func TestAppendMsgFrameTooLarge(t *testing.T) {
	env := &pb.Envelope{Type: string(make([]byte, 2000))}
	full, _ := transport.AppendFrame(nil, &pb.Frame{Kind: &pb.Frame_Envelope{Envelope: env}})
	inner := len(full) - 2 // the 2000+ byte frame has a two-byte length prefix
	cases := []struct {
		name string
		max  int
		ok   bool
	}{
		{"exactly max", inner, true},
		{"one over", inner - 1, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := transport.AppendEnvelopeFrame([]byte("x"), env, tc.max)
			if tc.ok != (err == nil) {
				t.Fatalf("max %d: err = %v, want ok=%v", tc.max, err, tc.ok)
			}
			if !tc.ok && (!errors.Is(err, transport.ErrFrameTooLarge) || string(got) != "x") {
				t.Fatalf("refused frame: err %v, dst %q (want ErrFrameTooLarge and dst unchanged)", err, got)
			}
		})
	}
}

// checkDecodeEnvelopeFrame: the fast decoder must agree with proto.Unmarshal
// of a pb.Frame on every input: same error-ness, same envelope and body
// type, same kind (and a body type on a frame without an envelope is bad).
func checkDecodeEnvelopeFrame(t *testing.T, b []byte) {
	t.Helper()
	checkDecodeEnvelopeFrameMode(t, b, false)
	// Owned: the decoder keeps b itself; it must still agree, and leave
	// the strings untouched when the body bytes are overwritten.
	owned := append([]byte(nil), b...)
	env := checkDecodeEnvelopeFrameMode(t, owned, true)
	if env != nil {
		want := proto.Clone(env).(*pb.Envelope)
		clear(env.GetBody().GetValue())
		if env.GetBody() != nil {
			want.Body.Value = env.Body.Value
		}
		if !proto.Equal(env, want) {
			t.Fatalf("writing into the body changed other fields: %v, want %v", env, want)
		}
	}
}

func checkDecodeEnvelopeFrameMode(t *testing.T, b []byte, owned bool) *pb.Envelope {
	t.Helper()
	env, bodyType, route, origin, other, err := transport.DecodeEnvelopeFrameOwned(b, owned)
	var f pb.Frame
	ref := proto.Unmarshal(b, &f)
	if ref == nil && f.GetEnvelope() == nil && (f.GetBodyType() != 0 || f.GetRoute() != 0 || f.GetOrigin() != 0) {
		ref = errors.New("a body type, route or origin on a frame without an envelope")
	}
	if (err != nil) != (ref != nil) {
		t.Fatalf("fast err %v, reference err %v", err, ref)
	}
	if err != nil {
		if !errors.Is(err, transport.ErrBadFrame) {
			t.Fatalf("err %v does not wrap ErrBadFrame", err)
		}
		return nil
	}
	if want := f.GetEnvelope(); want != nil {
		if env == nil || !proto.Equal(env, want) || bodyType != f.GetBodyType() || route != f.GetRoute() || origin != f.GetOrigin() {
			t.Fatalf("fast decoder (owned %v) gave %v of refs %d/%d/%d, reference %v of %d/%d/%d", owned, env, bodyType, route, origin,
				want, f.GetBodyType(), f.GetRoute(), f.GetOrigin())
		}
		return env
	}
	if env != nil {
		t.Fatalf("fast decoder gave an envelope for a %T frame", f.Kind)
	}
	if fmt.Sprintf("%T", other) != fmt.Sprintf("%T", f.Kind) {
		t.Fatalf("other kind %T, reference %T", other, f.Kind)
	}
	return nil
}

// FuzzEnvelopeLimits: the header pre-check never panics, and an envelope
// it lets through decodes to no more headers than the limit.
func FuzzEnvelopeLimits(f *testing.F) {
	for _, b := range decodeSeeds(f) {
		f.Add(b, 2, 64)
	}
	many := &pb.Envelope{Headers: map[string]string{"a": "1", "b": "2", "c": "3"}}
	if b, err := transport.AppendFrame(nil, &pb.Frame{Kind: &pb.Frame_Envelope{Envelope: many}}); err == nil {
		_, n := protowire.ConsumeVarint(b)
		f.Add(b[n:], 2, 64)
		f.Add(append(b[n:], b[n:]...), 4, 64) // the envelope twice: proto merges the maps
	}
	f.Fuzz(func(t *testing.T, b []byte, maxHeaders, maxBytes int) {
		maxHeaders, maxBytes = max(maxHeaders%100, 0), max(maxBytes%10000, 0)
		if transport.CheckEnvelopeLimits(b, maxHeaders, maxBytes) != nil {
			return
		}
		var fr pb.Frame
		if proto.Unmarshal(b, &fr) == nil {
			if n := len(fr.GetEnvelope().GetHeaders()); n > maxHeaders {
				t.Fatalf("%d headers passed a limit of %d", n, maxHeaders)
			}
		}
	})
}

func decodeSeeds(tb testing.TB) [][]byte {
	var seeds [][]byte
	for _, fr := range sampleFrames() {
		b, err := proto.Marshal(fr)
		if err != nil {
			tb.Fatal(err)
		}
		seeds = append(seeds, b)
	}
	env, _ := proto.Marshal(&pb.Frame{Kind: &pb.Frame_Envelope{Envelope: &pb.Envelope{MsgId: "a", Sender: "x@y"}}})
	env2, _ := proto.Marshal(&pb.Frame{Kind: &pb.Frame_Envelope{Envelope: &pb.Envelope{Recipient: "b@c", Attempt: 3}}})
	hello, _ := proto.Marshal(sampleFrames()[0])
	seeds = append(seeds,
		append(slices.Clone(env), env2...),    // the field twice: proto merges
		append(slices.Clone(env), hello...),   // envelope then hello: last oneof wins
		append(slices.Clone(env), 0x28, 0x01), // an unknown field after
		[]byte{0x12, 0x05, 0x0a, 0x01},        // truncated inner message
		[]byte{0x12, 0x02, 0x12, 0x80},        // bad inner string length
		[]byte{0x12, 0x00},                    // an empty envelope
		[]byte{0x12, 0x03, 0x12, 0x01, 0xff},  // invalid UTF-8 in msg_id
		[]byte{0x10, 0x01},                    // field 2 with the wrong wire type
		[]byte{},                              // an empty frame
	)
	return seeds
}

func TestDecodeEnvelopeFrameAgreesWithProto(t *testing.T) {
	for i, b := range decodeSeeds(t) {
		t.Run(fmt.Sprint(i), func(t *testing.T) { checkDecodeEnvelopeFrame(t, b) })
	}
}

func FuzzDecodeEnvelopeFrame(f *testing.F) {
	for _, b := range decodeSeeds(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) { checkDecodeEnvelopeFrame(t, b) })
}

// TestCheckHeadersAgreesWithReceiver: what a sender checks is exactly
// what a receiver with the same limits accepts.
func TestCheckHeadersAgreesWithReceiver(t *testing.T) {
	cfg := transport.DefaultConfig("n")
	cfg.MaxHeaders, cfg.MaxHeaderBytes = 8, 200
	for n := 0; n < 12; n++ {
		for _, vlen := range []int{0, 5, 20, 40} {
			h := map[string]string{}
			for i := 0; i < n; i++ {
				h[fmt.Sprint("k", i)] = string(bytes.Repeat([]byte{'v'}, vlen))
			}
			b, err := transport.AppendFrame(nil, &pb.Frame{Kind: &pb.Frame_Envelope{Envelope: &pb.Envelope{MsgId: "m", Headers: h}}})
			if err != nil {
				t.Fatal(err)
			}
			_, k := protowire.ConsumeVarint(b)
			sender := cfg.CheckHeaders(h) == nil
			receiver := transport.CheckEnvelopeLimits(b[k:], cfg.MaxHeaders, cfg.MaxHeaderBytes) == nil
			if sender != receiver {
				t.Fatalf("%d headers of %d bytes: sender ok %v, receiver ok %v", n, vlen, sender, receiver)
			}
		}
	}
}
