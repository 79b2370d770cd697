package transport

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/meshnode/meshnode/internal/envcodec"
	"github.com/meshnode/meshnode/mailbox/pb"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// The lane reader counts an envelope's headers while it decodes it; it
// refuses exactly the frames the standalone check refuses, with the same
// error, a key repeated in the bytes counting each time, for frames read
// from the stream's buffer and frames read into one of their own.
func TestReaderCountsHeadersAsTheCheckDoes(t *testing.T) {
	const maxHeaders, maxHeaderBytes = 8, 200
	for _, large := range []bool{false, true} {
		for n := 0; n <= 12; n++ {
			for _, vlen := range []int{0, 5, 20, 40} {
				for _, repeat := range []bool{false, true} {
					name := fmt.Sprintf("large=%v,headers=%d,value=%d,repeat=%v", large, n, vlen, repeat)
					env := &pb.Envelope{MsgId: "m", Recipient: "a@n"}
					if large {
						env.Body = &anypb.Any{TypeUrl: "t", Value: make([]byte, readBufSize+100)}
					}
					b, err := proto.Marshal(env)
					if err != nil {
						t.Fatal(err)
					}
					for i := range n {
						k := fmt.Sprint("k", i)
						if repeat {
							k = "k" // the same key every time: one map entry, n in the bytes
						}
						entry := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), k)
						entry = protowire.AppendString(protowire.AppendTag(entry, 2, protowire.BytesType), string(bytes.Repeat([]byte{'v'}, vlen)))
						b = protowire.AppendBytes(protowire.AppendTag(b, envcodec.FieldHeaders, protowire.BytesType), entry)
					}
					body := protowire.AppendBytes(protowire.AppendTag(nil, frameFieldEnvelope, protowire.BytesType), b)
					stream := protowire.AppendBytes(nil, body)
					check := checkEnvelopeLimits(body, maxHeaders, maxHeaderBytes)

					sr := &streamReader{br: bufio.NewReaderSize(bytes.NewReader(stream), readBufSize), max: 1 << 20}
					got, _, _, _, err := sr.readEnvelopeFrame(maxHeaders, maxHeaderBytes)
					switch {
					case check != nil && (err == nil || err.Error() != check.Error()):
						t.Fatalf("%s: the check refuses it (%v), the reader answered %v", name, check, err)
					case check == nil && err != nil:
						t.Fatalf("%s: the check accepts it, the reader refused it: %v", name, err)
					case check == nil:
						want := new(pb.Envelope)
						if err := proto.Unmarshal(b, want); err != nil {
							t.Fatal(err)
						}
						if !proto.Equal(got, want) {
							t.Fatalf("%s: read %v, want %v", name, got, want)
						}
					}
				}
			}
		}
	}
}

// FuzzReadEnvelopeFrame: whatever the bytes of a frame, the lane reader
// answers what the header check and the general decoder answer together:
// the same refusal, or the same envelope.
func FuzzReadEnvelopeFrame(f *testing.F) {
	env, err := proto.Marshal(&pb.Envelope{MsgId: "m", Recipient: "a@n", Headers: map[string]string{"k": "v", "j": ""},
		Body: &anypb.Any{TypeUrl: "t", Value: []byte{1, 2}}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(protowire.AppendBytes(protowire.AppendTag(nil, frameFieldEnvelope, protowire.BytesType), env))
	named := protowire.AppendBytes(protowire.AppendTag(nil, frameFieldEnvelope, protowire.BytesType), env)
	f.Add(protowire.AppendVarint(protowire.AppendTag(named, frameFieldBodyType, protowire.VarintType), 3))
	typed := protowire.AppendVarint(protowire.AppendTag(bytes.Clone(named), frameFieldBodyType, protowire.VarintType), 3)
	f.Add(protowire.AppendVarint(protowire.AppendTag(bytes.Clone(typed), frameFieldRoute, protowire.VarintType), 2))
	f.Add(protowire.AppendVarint(protowire.AppendTag(bytes.Clone(named), frameFieldRoute, protowire.VarintType), 1))
	f.Add(protowire.AppendVarint(protowire.AppendTag(bytes.Clone(typed), frameFieldRoute, protowire.VarintType), 1<<33))
	f.Add(protowire.AppendVarint(protowire.AppendTag(nil, frameFieldBodyType, protowire.VarintType), 1))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, body []byte) {
		const maxHeaders, maxHeaderBytes = 3, 40
		stream := protowire.AppendBytes(nil, body)
		sr := &streamReader{br: bufio.NewReaderSize(bytes.NewReader(stream), readBufSize), max: 1 << 20}
		got, gotType, gotOther, _, err := sr.readEnvelopeFrame(maxHeaders, maxHeaderBytes)
		// What proto makes of the frame, within the limits.
		var f pb.Frame
		wantErr := proto.Unmarshal(body, &f)
		want, wantType, wantOther := f.GetEnvelope(), frameRefs{bodyType: f.GetBodyType(), route: f.GetRoute(), origin: f.GetOrigin()}, any(f.Kind)
		if want != nil {
			wantOther = nil
		} else if wantErr == nil && wantType != (frameRefs{}) {
			wantErr = errors.New("a body type, route or origin on a frame without an envelope")
		}
		if check := checkEnvelopeLimits(body, maxHeaders, maxHeaderBytes); check != nil {
			want, wantType, wantOther, wantErr = nil, frameRefs{}, nil, check
		}
		switch {
		case (err == nil) != (wantErr == nil):
			t.Fatalf("reader: %v; check and proto: %v", err, wantErr)
		case err != nil:
		case !proto.Equal(got, want):
			t.Fatalf("reader read %v, proto %v", got, want)
		case gotType != wantType:
			t.Fatalf("reader read refs %+v, proto %+v", gotType, wantType)
		case (gotOther == nil) != (wantOther == nil):
			t.Fatalf("reader's other frame %v, proto's %v", gotOther, wantOther)
		}
	})
}
