package transport

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/meshnode/meshnode/mailbox/pb"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// A frame on a stream is a uvarint length followed by that many bytes of a
// marshalled pb.Frame.

var cachedSize = proto.MarshalOptions{UseCachedSize: true}

// AppendFrame appends the length-prefixed encoding of f to dst.
func AppendFrame(dst []byte, f *pb.Frame) ([]byte, error) {
	return appendFrameSized(dst, f, proto.Size(f))
}

// appendFrameSized is AppendFrame for a caller that already called proto.Size(f).
func appendFrameSized(dst []byte, f *pb.Frame, size int) ([]byte, error) {
	start := len(dst)
	dst = binary.AppendUvarint(dst, uint64(size))
	body := len(dst)
	dst, err := cachedSize.MarshalAppend(dst, f)
	if err != nil {
		return dst[:start], fmt.Errorf("transport: encode frame: %w", err)
	}
	if len(dst)-body != size {
		return dst[:start], fmt.Errorf("transport: encode frame: size changed during encoding (frame modified concurrently?)")
	}
	return dst, nil
}

// Field numbers of pb.Frame's oneof, for the hand-written wrapper.
const (
	frameFieldEnvelope protowire.Number = 2
	frameFieldReceipt  protowire.Number = 3
)

// appendMsgFrame appends the length-prefixed encoding of a pb.Frame whose
// oneof holds m in field num, without building the pb.Frame: the wrapper is
// one tag and one length, written by hand around m's bytes. The bytes are
// exactly those AppendFrame produces. m's size is computed once and cached
// in m for the marshal. A frame above max is refused with ErrFrameTooLarge
// and dst is returned unchanged.
func appendMsgFrame(dst []byte, num protowire.Number, m proto.Message, max int) ([]byte, error) {
	size := proto.Size(m)
	inner := protowire.SizeTag(num) + protowire.SizeBytes(size)
	if inner > max {
		return dst, fmt.Errorf("%w: %d bytes, limit %d", ErrFrameTooLarge, inner, max)
	}
	start := len(dst)
	dst = protowire.AppendVarint(dst, uint64(inner))
	dst = protowire.AppendTag(dst, num, protowire.BytesType)
	dst = protowire.AppendVarint(dst, uint64(size))
	body := len(dst)
	dst, err := cachedSize.MarshalAppend(dst, m)
	if err != nil {
		return dst[:start], fmt.Errorf("transport: encode frame: %w", err)
	}
	if len(dst)-body != size {
		return dst[:start], fmt.Errorf("transport: encode frame: size changed during encoding (message modified concurrently?)")
	}
	return dst, nil
}

// ReadFrame reads one frame from r into f (which is reset first) and returns
// the number of bytes consumed. A length prefix above max is refused with
// ErrFrameTooLarge before anything is allocated; undecodable bytes give
// ErrBadFrame; I/O errors are wrapped (a clean end of stream before a frame
// is io.EOF). It never panics.
func ReadFrame(r *bufio.Reader, max int, f *pb.Frame) (n int, err error) {
	body, n, peeked, err := nextFrame(r, max)
	if err != nil {
		return n, err
	}
	uerr := proto.Unmarshal(body, f)
	if peeked {
		_, _ = r.Discard(len(body)) // cannot fail: Peek returned these bytes
	}
	if uerr != nil {
		return n, fmt.Errorf("%w: %w", ErrBadFrame, uerr)
	}
	return n, nil
}

// readEnvelopeFrame reads one frame from r that must hold an envelope, the
// only frame lane streams carry. It decodes the envelope straight from the
// frame bytes: no pb.Frame and no oneof wrapper are allocated. A frame of
// any other form (another kind, repeated or unknown fields) takes the
// general path, so the result is always what proto.Unmarshal of a pb.Frame
// would give; a frame of another kind returns its kind in other.
func readEnvelopeFrame(r *bufio.Reader, max int) (env *pb.Envelope, other any, n int, err error) {
	body, n, peeked, err := nextFrame(r, max)
	if err != nil {
		return nil, nil, n, err
	}
	env, other, err = decodeEnvelopeFrame(body)
	if peeked {
		_, _ = r.Discard(len(body))
	}
	return env, other, n, err
}

// decodeEnvelopeFrame decodes the bytes of one pb.Frame that should hold an
// envelope; see readEnvelopeFrame.
func decodeEnvelopeFrame(b []byte) (env *pb.Envelope, other any, err error) {
	if num, typ, tn := protowire.ConsumeTag(b); tn > 0 && num == frameFieldEnvelope && typ == protowire.BytesType {
		if v, vn := protowire.ConsumeBytes(b[tn:]); vn > 0 && tn+vn == len(b) {
			env, err := decodeEnvelope(v)
			if err != nil {
				return nil, nil, fmt.Errorf("%w: %w", ErrBadFrame, err)
			}
			return env, nil, nil
		}
	}
	var f pb.Frame
	if err := proto.Unmarshal(b, &f); err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrBadFrame, err)
	}
	if env := f.GetEnvelope(); env != nil {
		return env, nil, nil
	}
	return nil, f.Kind, nil
}

// nextFrame reads a frame's length prefix and returns its body. When peeked
// is true the body aliases r's buffer and the caller must Discard
// len(body) bytes once done with it; otherwise it was read into a new slice.
// n counts the prefix and the body.
func nextFrame(r *bufio.Reader, max int) (body []byte, n int, peeked bool, err error) {
	if max <= 0 {
		return nil, 0, false, fmt.Errorf("transport: read frame: max %d must be positive", max)
	}
	size, prefix, err := readUvarint(r)
	if err != nil {
		return nil, prefix, false, err
	}
	if size > uint64(max) {
		return nil, prefix, false, fmt.Errorf("%w: %d bytes announced, limit %d", ErrFrameTooLarge, size, max)
	}
	sz := int(size)
	if sz <= r.Size() {
		// Decode straight out of the reader's buffer: no allocation for the
		// bytes; proto copies what it keeps.
		body, err = r.Peek(sz)
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, prefix, false, fmt.Errorf("transport: read frame body: %w", err)
		}
		return body, prefix + sz, true, nil
	}
	body = make([]byte, sz)
	if _, err := io.ReadFull(r, body); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, prefix, false, fmt.Errorf("transport: read frame body: %w", err)
	}
	return body, prefix + sz, false, nil
}

// readUvarint is binary.ReadUvarint with errors this package can tell apart.
func readUvarint(r io.ByteReader) (v uint64, n int, err error) {
	var shift uint
	for n < binary.MaxVarintLen64 {
		b, err := r.ReadByte()
		if err != nil {
			if n == 0 && errors.Is(err, io.EOF) {
				return 0, 0, io.EOF // clean end of stream, not wrapped so callers may compare
			}
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return 0, n, fmt.Errorf("transport: read frame length: %w", err)
		}
		n++
		if b < 0x80 {
			if n == binary.MaxVarintLen64 && b > 1 {
				break
			}
			return v | uint64(b)<<shift, n, nil
		}
		v |= uint64(b&0x7f) << shift
		shift += 7
	}
	return 0, n, fmt.Errorf("%w: length prefix overflows 64 bits", ErrBadFrame)
}
