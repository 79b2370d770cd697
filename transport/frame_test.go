package transport_test

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
	"google.golang.org/protobuf/proto"
)

func sampleFrames() []*pb.Frame {
	return []*pb.Frame{
		{Kind: &pb.Frame_Hello{Hello: &pb.Hello{NodeName: "n1", BootId: "b", ProtocolVersions: []uint32{1}, Cluster: "c"}}},
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
	if _, err := transport.ReadFrame(br, 1<<20, &f); err != io.EOF {
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
