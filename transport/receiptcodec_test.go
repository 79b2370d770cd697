package transport_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"pgregory.net/rapid"
)

// genReceipt draws a receipt with any subset of its fields set, sometimes
// signed (the generic path).
func genReceipt(t *rapid.T) *pb.Receipt {
	str := func(label string) string {
		if rapid.Bool().Draw(t, label+"?") {
			return ""
		}
		return rapid.String().Draw(t, label)
	}
	rc := &pb.Receipt{
		MsgId:        str("msg_id"),
		Code:         pb.Receipt_Code(rapid.Int32().Draw(t, "code")),
		RetryAfterMs: rapid.Int64().Draw(t, "retry"),
		Message:      str("message"),
		Watermark:    rapid.Uint64().Draw(t, "watermark"),
		Room:         rapid.Uint32().Draw(t, "room"),
		Arrived:      rapid.Uint64().Draw(t, "arrived"),
	}
	if rapid.Bool().Draw(t, "digest?") {
		rc.WatermarkDigest = rapid.Uint64().Draw(t, "digest")
	}
	if rapid.IntRange(0, 9).Draw(t, "signed") == 0 {
		rc.Signature = &pb.ReceiptSignature{Node: str("node"), Signature: []byte{1, 2}}
	}
	return rc
}

// The hand-written receipt encoder writes exactly the generic frame's
// bytes, and the control stream's decoder reads them back equal
// (checkReceiptEncode); an unsigned receipt takes the fast decoder.
func TestReceiptCodecMatchesProto(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		rc := genReceipt(t)
		want, err := transport.AppendReceiptFrameGeneric(nil, rc, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		checkReceiptEncode(t, rc, 1<<20)
		if rc.Signature == nil {
			v := frameBody(t, want)
			if _, ok := transport.DecodeReceiptFast(v); !ok {
				t.Fatalf("fast decoder refused an unsigned receipt % x", v)
			}
		}
	})
}

// A receipt the hand-written encoder cannot write takes the generic path:
// invalid UTF-8 is refused as proto.Marshal refuses it, and the size limit
// holds for both paths.
func TestReceiptEncodeFallbackAndLimit(t *testing.T) {
	_, err := transport.AppendReceiptFrame(nil, &pb.Receipt{MsgId: "\xff"}, 1<<20)
	_, werr := transport.AppendReceiptFrameGeneric(nil, &pb.Receipt{MsgId: "\xff"}, 1<<20)
	if err == nil || werr == nil {
		t.Fatalf("invalid UTF-8: err %v, generic err %v; both must refuse", err, werr)
	}
	for _, rc := range []*pb.Receipt{
		{MsgId: "m", Message: string(make([]byte, 300))},
		{MsgId: "m", Message: string(make([]byte, 300)), Signature: &pb.ReceiptSignature{Node: "n"}},
	} {
		full, err := transport.AppendReceiptFrameGeneric(nil, rc, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		_, n := protowire.ConsumeVarint(full)
		inner := len(full) - n
		if _, err := transport.AppendReceiptFrame(nil, rc, inner); err != nil {
			t.Fatalf("a frame of exactly max refused: %v", err)
		}
		got, err := transport.AppendReceiptFrame([]byte("x"), rc, inner-1)
		if !errors.Is(err, transport.ErrFrameTooLarge) || string(got) != "x" {
			t.Fatalf("one byte over max: err %v, dst %q; want ErrFrameTooLarge and dst unchanged", err, got)
		}
	}
}

// receiptSeeds are control frames of every form the decoder must sort:
// plain and signed receipts, other kinds, and forms only proto's merge
// rules decode.
func receiptSeeds(tb testing.TB) [][]byte {
	frame := func(f *pb.Frame) []byte {
		b, err := proto.Marshal(f)
		if err != nil {
			tb.Fatal(err)
		}
		return b
	}
	rcf := func(rc *pb.Receipt) []byte { return frame(&pb.Frame{Kind: &pb.Frame_Receipt{Receipt: rc}}) }
	plain := rcf(&pb.Receipt{MsgId: "m1", Code: pb.Receipt_PROCESSED, Watermark: 7})
	other := rcf(&pb.Receipt{MsgId: "m2", Code: pb.Receipt_CAPACITY, RetryAfterMs: 40, Message: "full"})
	seeds := [][]byte{
		plain,
		other,
		rcf(&pb.Receipt{}),
		rcf(&pb.Receipt{Code: -1, RetryAfterMs: -5}),
		rcf(&pb.Receipt{MsgId: "m", Signature: &pb.ReceiptSignature{Node: "n", Certificate: []byte{0x30}, Signature: []byte{1}}}),
		frame(&pb.Frame{Kind: &pb.Frame_Goaway{Goaway: &pb.GoAway{Code: 1, Reason: "bye"}}}),
		frame(&pb.Frame{Kind: &pb.Frame_Receipt{Receipt: &pb.Receipt{MsgId: "m", Signature: &pb.ReceiptSignature{Signature: []byte{1}}}}, Signer: 3}),
		frame(&pb.Frame{Kind: &pb.Frame_SignerName{SignerName: &pb.SignerName{Node: "n", Certificate: []byte{0x30}, Ref: 1}}}),
		frame(&pb.Frame{Kind: &pb.Frame_Goaway{Goaway: &pb.GoAway{Code: 1}}, Signer: 2}), // a signer without a receipt
		append(slices.Clone(plain), 0x60, 0x01), // a signer after a plain receipt
		frame(&pb.Frame{Kind: &pb.Frame_Envelope{Envelope: &pb.Envelope{MsgId: "e"}}}),
		append(slices.Clone(plain), other...),   // the receipt twice: proto merges
		append(slices.Clone(plain), 0x28, 0x01), // an unknown field after
		{0x1a, 0x04, 0x08, 0x01, 0x08, 0x02},    // msg_id with the wrong wire type
		{0x1a, 0x04, 0x10, 0x01, 0x10, 0x02},    // code twice: the last wins
		{0x1a, 0x03, 0x0a, 0x01, 0xff},          // invalid UTF-8 in msg_id
		{0x1a, 0x02, 0x30, 0x01},                // an unknown field inside
		{0x1a, 0x05, 0x0a, 0x01},                // truncated
		{0x1a, 0x00},                            // an empty receipt
		rcf(&pb.Receipt{MsgId: "m3", Code: pb.Receipt_DUPLICATE, Watermark: 9, WatermarkDigest: 0x0102030405060708}),
		{0x1a, 0x02, 0x48, 0x01},                   // watermark_digest as a varint: the wrong wire type
		{0x1a, 0x05, 0x49, 0x01, 0x02, 0x03, 0x04}, // watermark_digest truncated
		{}, // an empty frame
	}
	return seeds
}

// checkControlFrame: the control stream's decoder gives what
// proto.Unmarshal of a pb.Frame gives, on any input, but for a signer's
// ref on a frame without a receipt, which it refuses.
func checkControlFrame(t *testing.T, b []byte) {
	t.Helper()
	rc, signer, other, err := transport.DecodeControlFrame(b)
	var f pb.Frame
	ref := proto.Unmarshal(b, &f)
	if ref == nil && f.GetReceipt() == nil && f.GetSigner() != 0 {
		if !errors.Is(err, transport.ErrBadFrame) {
			t.Fatalf("a signer without a receipt: err %v, want ErrBadFrame", err)
		}
		return
	}
	if (err != nil) != (ref != nil) {
		t.Fatalf("decoder err %v, reference err %v", err, ref)
	}
	if err != nil {
		if !errors.Is(err, transport.ErrBadFrame) {
			t.Fatalf("err %v does not wrap ErrBadFrame", err)
		}
		return
	}
	if want := f.GetReceipt(); want != nil {
		if rc == nil || other != nil || !proto.Equal(rc, want) || signer != f.GetSigner() {
			t.Fatalf("decoded %v signer %d (other %T), reference %v signer %d", rc, signer, other, want, f.GetSigner())
		}
		return
	}
	if rc != nil || fmt.Sprintf("%T", other) != fmt.Sprintf("%T", f.Kind) {
		t.Fatalf("decoded %v / %T, reference kind %T", rc, other, f.Kind)
	}
}

func TestDecodeControlFrameAgreesWithProto(t *testing.T) {
	for i, b := range receiptSeeds(t) {
		t.Run(fmt.Sprint(i), func(t *testing.T) { checkControlFrame(t, b) })
	}
}

func FuzzDecodeControlFrame(f *testing.F) {
	for _, b := range receiptSeeds(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) { checkControlFrame(t, b) })
}

// BenchmarkReceiptDecode compares the control stream's decoder with
// proto.Unmarshal of a pb.Frame, for a drain's typical receipt.
func BenchmarkReceiptDecode(b *testing.B) {
	rc := &pb.Receipt{MsgId: "AbCdEfGhIjKlMnOpQrStUv", Code: pb.Receipt_PROCESSED, Watermark: 123456}
	frame, err := proto.Marshal(&pb.Frame{Kind: &pb.Frame_Receipt{Receipt: rc}})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("hand-written", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, _, err := transport.DecodeControlFrame(frame); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("proto", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var f pb.Frame
			if err := proto.Unmarshal(frame, &f); err != nil {
				b.Fatal(err)
			}
		}
	})
}
