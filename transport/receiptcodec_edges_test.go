package transport_test

import (
	"bytes"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// checkReceiptEncode: the hand-written encoder writes the generic
// encoder's bytes (or fails as it fails), leaves dst unchanged on error,
// and the control decoder reads back what proto.Unmarshal reads.
func checkReceiptEncode(t interface {
	Helper()
	Fatalf(format string, args ...any)
}, rc *pb.Receipt, max int) {
	t.Helper()
	prefix := []byte("pfx")
	got, err := transport.AppendReceiptFrame(append([]byte(nil), prefix...), rc, max)
	want, werr := transport.AppendReceiptFrameGeneric(nil, rc, max)
	if (err != nil) != (werr != nil) {
		t.Fatalf("hand err %v, generic err %v (rc %v, max %d)", err, werr, rc, max)
	}
	if err != nil {
		if errors.Is(werr, transport.ErrFrameTooLarge) != errors.Is(err, transport.ErrFrameTooLarge) {
			t.Fatalf("hand err %v, generic err %v", err, werr)
		}
		if !bytes.Equal(got, prefix) {
			t.Fatalf("dst changed on error: %q", got)
		}
		return
	}
	if !bytes.Equal(got[:len(prefix)], prefix) || !bytes.Equal(got[len(prefix):], want) {
		t.Fatalf("hand-written frame differs:\n got % x\nwant % x\n(rc %v)", got[len(prefix):], want, rc)
	}
	l, n := protowire.ConsumeVarint(want)
	if n < 0 || int(l) != len(want)-n {
		t.Fatalf("bad length prefix % x", want)
	}
	body := want[n:]
	dec, _, other, derr := transport.DecodeControlFrame(body)
	var f pb.Frame
	uerr := proto.Unmarshal(body, &f)
	if (uerr != nil) != (derr != nil) || other != nil {
		t.Fatalf("decode: %v / ref %v (other %T)", derr, uerr, other)
	}
	if uerr != nil { // raw unknown bytes that are not wire format
		if !errors.Is(derr, transport.ErrBadFrame) {
			t.Fatalf("decode err %v does not wrap ErrBadFrame", derr)
		}
		return
	}
	if !proto.Equal(dec, f.GetReceipt()) || (len(rc.ProtoReflect().GetUnknown()) == 0 && !proto.Equal(dec, rc)) {
		t.Fatalf("decoded %v, proto %v, sent %v", dec, f.GetReceipt(), rc)
	}
}

// FuzzReceiptEncodeMatchesGeneric: arbitrary field values, including invalid
// UTF-8, NUL, negative codes and retry_after, and unknown fields (also
// bytes that repeat a known one).
func FuzzReceiptEncodeMatchesGeneric(f *testing.F) {
	f.Add("m", int32(2), int64(0), "", uint64(7), uint32(1024), uint64(9), uint64(0), []byte(nil), false, 1<<20)
	f.Add("", int32(-1), int64(-1), "\x00", uint64(math.MaxUint64), uint32(0), uint64(0), uint64(math.MaxUint64), []byte{0x38, 0x01}, true, 64)
	f.Add(strings.Repeat("x", 127), int32(math.MaxInt32), int64(math.MinInt64), strings.Repeat("é", 8192), uint64(1<<63), uint32(math.MaxUint32), uint64(math.MaxUint64), uint64(1), []byte{}, false, 16390)
	f.Add("\xff", int32(0), int64(math.MaxInt64), "ok", uint64(0), uint32(1), uint64(1), uint64(0), []byte{0x40, 0x02}, false, 1<<20)
	f.Add("d", int32(6), int64(0), "", uint64(3), uint32(0), uint64(0), uint64(7), []byte{0x49, 1, 2, 3, 4, 5, 6, 7, 8}, false, 1<<20)
	f.Fuzz(func(t *testing.T, id string, code int32, retry int64, msg string, wm uint64, room uint32, arrived, digest uint64, unknown []byte, signed bool, max int) {
		if max < 0 || max > 1<<22 {
			max = 1 << 20
		}
		rc := &pb.Receipt{MsgId: id, Code: pb.Receipt_Code(code), RetryAfterMs: retry, Message: msg, Watermark: wm, Room: room, Arrived: arrived, WatermarkDigest: digest}
		if signed {
			rc.Signature = &pb.ReceiptSignature{Node: id}
		}
		if len(unknown) > 0 {
			rc.ProtoReflect().SetUnknown(unknown)
		}
		checkReceiptEncode(t, rc, max)
	})
}

// Lengths crossing the varint boundaries of the receipt body, of its
// strings and of the frame, and max at, one below and one above the frame.
func TestReceiptEncodeBoundaries(t *testing.T) {
	for _, n := range []int{0, 1, 100, 110, 115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126, 127, 128, 129, 16370, 16375, 16377, 16378, 16379, 16380, 16381, 16382, 16383, 16384, 16385, 2097140, 2097151, 2097152} {
		for _, rc := range []*pb.Receipt{
			{MsgId: strings.Repeat("a", n)},
			{Message: strings.Repeat("b", n)},
			{MsgId: "m", Code: -7, RetryAfterMs: -1, Message: strings.Repeat("\x00", n), Watermark: math.MaxUint64, Room: math.MaxUint32, Arrived: 1 << 40},
			{MsgId: strings.Repeat("é", n/2), Code: pb.Receipt_FORGOTTEN, Watermark: 1 << 35},
		} {
			full, err := transport.AppendReceiptFrameGeneric(nil, rc, math.MaxInt)
			if err != nil {
				t.Fatal(err)
			}
			_, pn := protowire.ConsumeVarint(full)
			inner := len(full) - pn
			for _, max := range []int{inner - 1, inner, inner + 1, math.MaxInt} {
				checkReceiptEncode(t, rc, max)
			}
		}
	}
}
