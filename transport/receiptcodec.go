package transport

import (
	"fmt"
	"unicode/utf8"

	"github.com/meshnode/meshnode/mailbox/pb"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Receipts go one per stream message and per ask, so their frames are as
// hot as the envelopes': a drain decodes as many receipts as it sends
// envelopes. A receipt of the common form (no signature, no unknown
// fields, valid UTF-8) is written and read by hand; any other takes the
// generic proto path, so the bytes and the decoded receipt are always
// those of proto.Marshal and proto.Unmarshal.

// Field numbers of pb.Receipt (meshnode.proto). Signature (6) and unknown
// fields take the generic path.
const (
	receiptMsgID      = 1
	receiptCode       = 2
	receiptRetryAfter = 3
	receiptMessage    = 4
	receiptWatermark  = 5
	receiptRoom       = 7
	receiptArrived    = 8
	receiptWMDigest   = 9
)

// receiptSize is the encoded size of rc, or ok=false when rc needs the
// generic path.
func receiptSize(rc *pb.Receipt) (size int, ok bool) {
	if rc.Signature != nil || len(rc.ProtoReflect().GetUnknown()) > 0 ||
		!utf8.ValidString(rc.MsgId) || !utf8.ValidString(rc.Message) {
		return 0, false
	}
	str := func(s string) int {
		if s == "" {
			return 0
		}
		return 1 + protowire.SizeBytes(len(s))
	}
	varint := func(v uint64) int {
		if v == 0 {
			return 0
		}
		return 1 + protowire.SizeVarint(v)
	}
	fixed := 0
	if rc.WatermarkDigest != 0 {
		fixed = 1 + 8
	}
	return str(rc.MsgId) + varint(uint64(int64(rc.Code))) + varint(uint64(rc.RetryAfterMs)) +
		str(rc.Message) + varint(rc.Watermark) + varint(uint64(rc.Room)) + varint(rc.Arrived) + fixed, true
}

// appendReceiptFrame appends the length-prefixed frame of rc, the bytes
// appendMsgFrame(dst, frameFieldReceipt, rc, max) writes. A frame above
// max is refused with ErrFrameTooLarge and dst is returned unchanged.
func appendReceiptFrame(dst []byte, rc *pb.Receipt, max int) ([]byte, error) {
	size, ok := receiptSize(rc)
	if !ok {
		return appendMsgFrame(dst, frameFieldReceipt, rc, max)
	}
	inner := protowire.SizeTag(frameFieldReceipt) + protowire.SizeBytes(size)
	if inner > max {
		return dst, fmt.Errorf("%w: %d bytes, limit %d", ErrFrameTooLarge, inner, max)
	}
	str := func(b []byte, num protowire.Number, s string) []byte {
		if s == "" {
			return b
		}
		b = protowire.AppendTag(b, num, protowire.BytesType)
		return protowire.AppendString(b, s)
	}
	varint := func(b []byte, num protowire.Number, v uint64) []byte {
		if v == 0 {
			return b
		}
		b = protowire.AppendTag(b, num, protowire.VarintType)
		return protowire.AppendVarint(b, v)
	}
	dst = protowire.AppendVarint(dst, uint64(inner))
	dst = protowire.AppendTag(dst, frameFieldReceipt, protowire.BytesType)
	dst = protowire.AppendVarint(dst, uint64(size))
	dst = str(dst, receiptMsgID, rc.MsgId)
	dst = varint(dst, receiptCode, uint64(int64(rc.Code)))
	dst = varint(dst, receiptRetryAfter, uint64(rc.RetryAfterMs))
	dst = str(dst, receiptMessage, rc.Message)
	dst = varint(dst, receiptWatermark, rc.Watermark)
	dst = varint(dst, receiptRoom, uint64(rc.Room))
	dst = varint(dst, receiptArrived, rc.Arrived)
	if rc.WatermarkDigest != 0 {
		dst = protowire.AppendTag(dst, receiptWMDigest, protowire.Fixed64Type)
		dst = protowire.AppendFixed64(dst, rc.WatermarkDigest)
	}
	return dst, nil
}

// decodeControlFrame decodes the bytes of one pb.Frame read from the
// control stream: a receipt, with the ref of the signer it names (names.go;
// 0: its signature, if any, says its own), or any other kind in other. The
// result is what proto.Unmarshal of a pb.Frame gives; bytes it cannot
// decode, and a signer on a frame without a receipt, give ErrBadFrame.
func decodeControlFrame(b []byte) (rc *pb.Receipt, signer uint32, other any, err error) {
	if num, typ, tn := protowire.ConsumeTag(b); tn > 0 && num == frameFieldReceipt && typ == protowire.BytesType {
		if v, vn := protowire.ConsumeBytes(b[tn:]); vn > 0 && tn+vn == len(b) {
			if rc, ok := decodeReceiptFast(v); ok {
				return rc, 0, nil, nil
			}
		}
	}
	var f pb.Frame
	if err := proto.Unmarshal(b, &f); err != nil {
		return nil, 0, nil, fmt.Errorf("%w: %w", ErrBadFrame, err)
	}
	if rc := f.GetReceipt(); rc != nil {
		return rc, f.GetSigner(), nil, nil
	}
	if f.GetSigner() != 0 {
		return nil, 0, nil, fmt.Errorf("%w: a signer on a frame without a receipt", ErrBadFrame)
	}
	return nil, 0, f.Kind, nil
}

// decodeReceiptFast decodes a receipt of the form appendReceiptFrame
// writes by hand; ok=false means "use proto.Unmarshal", never that b is
// bad. A field seen twice, a wire type the schema does not give, the
// signature, an unknown field or invalid UTF-8 all answer ok=false.
func decodeReceiptFast(b []byte) (rc *pb.Receipt, ok bool) {
	rc = new(pb.Receipt)
	var seen uint32
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || num < receiptMsgID || num > receiptWMDigest || num == receiptRoom-1 || seen&(1<<num) != 0 {
			return nil, false
		}
		seen |= 1 << num
		b = b[n:]
		switch num {
		case receiptMsgID, receiptMessage:
			if typ != protowire.BytesType {
				return nil, false
			}
			v, n := protowire.ConsumeBytes(b)
			if n < 0 || !utf8.Valid(v) {
				return nil, false
			}
			b = b[n:]
			if num == receiptMsgID {
				rc.MsgId = string(v)
			} else {
				rc.Message = string(v)
			}
		case receiptWMDigest:
			if typ != protowire.Fixed64Type {
				return nil, false
			}
			v, n := protowire.ConsumeFixed64(b)
			if n < 0 {
				return nil, false
			}
			b = b[n:]
			rc.WatermarkDigest = v
		default:
			if typ != protowire.VarintType {
				return nil, false
			}
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return nil, false
			}
			b = b[n:]
			switch num {
			case receiptCode:
				rc.Code = pb.Receipt_Code(int32(v))
			case receiptRetryAfter:
				rc.RetryAfterMs = int64(v)
			case receiptWatermark:
				rc.Watermark = v
			case receiptRoom:
				rc.Room = uint32(v)
			case receiptArrived:
				rc.Arrived = v
			}
		}
	}
	return rc, true
}
