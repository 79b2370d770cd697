package outbox

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"pgregory.net/rapid"

	"github.com/meshnode/meshnode/mailbox/pb"
)

// genStored draws a StoredMessage with any subset of its fields set, the
// envelope's strings and numbers included.
func genStored(t *rapid.T) *pb.StoredMessage {
	str := func(label string) string {
		if rapid.Bool().Draw(t, label+"?") {
			return ""
		}
		return rapid.String().Draw(t, label)
	}
	sm := &pb.StoredMessage{
		Attempts:            rapid.Uint32().Draw(t, "attempts"),
		FirstEnqueuedUnixMs: rapid.Int64().Draw(t, "first"),
		LastError:           str("last_error"),
		DeadLetteredUnixMs:  rapid.Int64().Draw(t, "dead"),
		DeadLetterReason:    str("reason"),
		CreatedElapsedMs:    rapid.Int64().Draw(t, "created"),
	}
	if rapid.Bool().Draw(t, "envelope?") {
		sm.Envelope = &pb.Envelope{
			MsgId:       str("msg_id"),
			Recipient:   str("recipient"),
			Sequence:    rapid.Uint64().Draw(t, "seq"),
			TtlMs:       rapid.Int64().Draw(t, "ttl"),
			CoalesceKey: str("coalesce"),
			Conflict:    pb.Envelope_Conflict(rapid.Int32().Draw(t, "conflict")),
		}
		if rapid.Bool().Draw(t, "headers?") {
			sm.Envelope.Headers = rapid.MapOfN(rapid.String(), rapid.String(), 0, 3).Draw(t, "headers")
		}
		if rapid.Bool().Draw(t, "body?") {
			sm.Envelope.Body = &anypb.Any{TypeUrl: str("type_url"), Value: rapid.SliceOfN(rapid.Byte(), 0, 300).Draw(t, "value")}
		}
	}
	return sm
}

// TestStoredCodecMatchesProto: the record codec writes the bytes of
// proto.Marshal (deterministic, for the headers' order) and reads back what
// proto.Unmarshal would, for every message it accepts; and it accepts
// every message of valid strings, so the fast path is the one taken.
func TestStoredCodecMatchesProto(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		sm := genStored(t)
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(sm)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := appendStored(nil, sm)
		if !ok {
			t.Fatalf("fast encoder refused a valid message: %v", sm)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("encoding differs from proto.Marshal:\n got %x\nwant %x", got, want)
		}
		back, ok := decodeStored(got)
		if !ok {
			t.Fatal("fast decoder refused what the encoder wrote")
		}
		if !proto.Equal(back, sm) {
			t.Fatalf("round trip: got %v, want %v", back, sm)
		}
	})
}

// TestStoredCodecFallsBack: what the codec was not written for goes to
// the generic path instead of being decoded differently.
func TestStoredCodecFallsBack(t *testing.T) {
	good, err := proto.Marshal(&pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "a@n"}, Attempts: 2})
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string][]byte{
		"unknown field":    append(append([]byte(nil), good...), 0x40, 0x01), // field 8, varint
		"field twice":      append(append([]byte(nil), good...), 0x10, 0x03), // attempts again: proto keeps the last
		"wrong wire type":  {0x12, 0x00},                                     // attempts as bytes
		"invalid utf-8":    {0x22, 0x01, 0xff},                               // last_error
		"truncated":        good[:len(good)-1],
		"bad envelope tag": {0x0a, 0x02, 0x38, 0x01}, // envelope field 7 is reserved
	}
	for name, b := range cases {
		if _, ok := decodeStored(b); ok {
			t.Errorf("%s: fast decoder accepted %x", name, b)
		}
	}
	sm := &pb.StoredMessage{LastError: "\xff"}
	if _, ok := appendStored(nil, sm); ok {
		t.Error("fast encoder accepted invalid UTF-8")
	}
	sm = &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "a@n"}, Attempts: 1}
	sm.ProtoReflect().SetUnknown([]byte{0x40, 0x01})
	if _, ok := appendStored(nil, sm); ok {
		t.Error("fast encoder accepted a message with unknown fields")
	}
	// The record functions still read and write such messages.
	rec, err := encodeRecord(sm, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	back, err := decodeRecord(rec)
	if err != nil || !proto.Equal(back, sm) {
		t.Fatalf("generic path: %v, %v", back, err)
	}
}

// FuzzStoredCodec: on any bytes, the fast decoder either declines or
// agrees with proto.Unmarshal, and never panics.
func FuzzStoredCodec(f *testing.F) {
	good, _ := proto.Marshal(&pb.StoredMessage{
		Envelope:         &pb.Envelope{Recipient: "a@n1", Sequence: 7, Body: &anypb.Any{TypeUrl: "t", Value: []byte("v")}, Headers: map[string]string{"k": "v"}},
		Attempts:         2,
		LastError:        "boom",
		CreatedElapsedMs: 99,
	})
	f.Add(good)
	f.Add([]byte{})
	f.Add([]byte{0x0a, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		got, ok := decodeStored(b)
		if !ok {
			return
		}
		want := &pb.StoredMessage{}
		if err := proto.Unmarshal(b, want); err != nil {
			t.Fatalf("fast decoder accepted what proto refuses: %v", err)
		}
		if !proto.Equal(got, want) {
			t.Fatalf("fast decoder disagrees with proto:\n got %v\nwant %v", got, want)
		}
	})
}
