package transport

import (
	"bufio"
	"bytes"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/mailbox/pb"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// nameFrame is the frame naming ref url, as a lane writes it.
func nameFrame(ref uint32, url string) []byte {
	return append(appendTypeNameHead(nil, ref, len(url)), url...)
}

// A lane's frame naming a type is the one proto writes for that TypeName.
func TestTypeNameFrameIsProtos(t *testing.T) {
	for _, tc := range []struct {
		ref uint32
		url string
	}{{1, "type.googleapis.com/google.protobuf.BytesValue"}, {200, strings.Repeat("u", maxNameBytes)}, {64, "x"}} {
		want, err := AppendFrame(nil, &pb.Frame{Kind: &pb.Frame_TypeName{TypeName: &pb.TypeName{Ref: tc.ref, Url: tc.url}}})
		if err != nil {
			t.Fatal(err)
		}
		if got := nameFrame(tc.ref, tc.url); !bytes.Equal(got, want) {
			t.Fatalf("ref %d: wrote\n%x\nproto writes\n%x", tc.ref, got, want)
		}
	}
}

// Whatever bytes a lane stream carries, reading them frame by frame and
// applying names never panics; every envelope that comes out named says
// a type the stream named, and reading stops at the first bad frame.
func FuzzLaneNames(f *testing.F) {
	env, err := proto.Marshal(&pb.Envelope{MsgId: "m", Recipient: "a@n", Body: &anypb.Any{Value: []byte{1}}})
	if err != nil {
		f.Fatal(err)
	}
	named := func(ref uint32) []byte {
		b, err := AppendFrame(nil, &pb.Frame{Kind: &pb.Frame_Envelope{Envelope: &pb.Envelope{MsgId: "m", Recipient: "a@n", Body: &anypb.Any{Value: []byte{1}}}}, BodyType: ref})
		if err != nil {
			f.Fatal(err)
		}
		return b
	}
	f.Add(append(nameFrame(1, "t/a"), named(1)...))
	f.Add(append(append(nameFrame(1, "t/a"), nameFrame(2, "t/b")...), named(2)...))
	f.Add(named(1))
	f.Add(append(nameFrame(2, "t/a"), env...))
	f.Fuzz(func(t *testing.T, stream []byte) {
		sr := &streamReader{br: bufio.NewReaderSize(bytes.NewReader(stream), readBufSize), max: 1 << 16}
		var ns names
		for range 64 {
			env, bt, other, _, err := sr.readEnvelopeFrame(8, 1<<10)
			if err != nil {
				return
			}
			before := len(ns.urls)
			got, err := ns.take(env, bt, other)
			switch {
			case err != nil:
				return
			case got == nil && len(ns.urls) != before+1:
				t.Fatalf("a frame taken with no envelope named nothing (%d names before, %d after)", before, len(ns.urls))
			case got != nil && bt != 0 && got.GetBody().GetTypeUrl() != ns.urls[bt-1]:
				t.Fatalf("an envelope naming type %d has type %q, named %q", bt, got.GetBody().GetTypeUrl(), ns.urls[bt-1])
			case len(ns.urls) > maxNames || ns.bytes > maxNameBytes:
				t.Fatalf("%d names of %d bytes, at most %d of %d", len(ns.urls), ns.bytes, maxNames, maxNameBytes)
			}
		}
	})
}
