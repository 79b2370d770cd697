package transport

import (
	"bufio"
	"encoding/binary"
	"fmt"

	"github.com/meshnode/meshnode/internal/envcodec"
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
// ErrFrameTooLarge before anything is allocated; undecodable bytes, and a
// stream that ends inside a frame, give ErrBadFrame; other I/O errors are
// wrapped (a clean end of stream before a frame is io.EOF). It never
// panics.
func ReadFrame(r *bufio.Reader, max int, f *pb.Frame) (n int, err error) {
	s := streamReader{br: r, max: max}
	return s.readFrame(f)
}

// readFrame is ReadFrame within s's limits.
func (s *streamReader) readFrame(f *pb.Frame) (n int, err error) {
	defer s.release()
	body, n, _, err := s.next()
	if err != nil {
		return n, err
	}
	if err := proto.Unmarshal(body, f); err != nil {
		return n, fmt.Errorf("%w: %w", ErrBadFrame, err)
	}
	return n, nil
}

// readEnvelopeFrame reads one frame that must hold an envelope, the only
// frame lane streams carry, within the header limits. It decodes the
// envelope straight from the frame bytes: no pb.Frame and no oneof wrapper
// are allocated. A frame of any other form (another kind, repeated or
// unknown fields) takes the general path, so the result is always what
// proto.Unmarshal of a pb.Frame would give; a frame of another kind
// returns its kind in other.
//
// refs are the frame's names (names.go): its Frame.body_type, the ref
// of the type its body says none of, its Frame.route, the ref of the
// sender and recipient it carries neither of, and its Frame.origin, the
// ref of the origin whose identity it carries not (0: it says its own).
func (s *streamReader) readEnvelopeFrame(maxHeaders, maxHeaderBytes int) (env *pb.Envelope, refs frameRefs, other any, n int, err error) {
	defer s.release()
	body, n, peeked, err := s.next()
	if err != nil {
		return nil, frameRefs{}, nil, n, err
	}
	// The usual frame (one envelope field, and its refs) is decoded by
	// hand, counting its headers as it goes and stopping past the limits;
	// any other, and one past them, is checked here (whose error counts
	// them all).
	if v, r, ok := envelopeFields(body); ok {
		if env, ok := envcodec.DecodeLimited(v, !peeked, maxHeaders, maxHeaderBytes); ok {
			return env, r, nil, n, nil
		}
	}
	if err := checkEnvelopeLimits(body, maxHeaders, maxHeaderBytes); err != nil {
		return nil, frameRefs{}, nil, n, err
	}
	env, refs, other, err = decodeNamedFrameOwned(body, !peeked)
	return env, refs, other, n, err
}

// frameRefs are what an envelope frame of a lane stream names by ref
// (names.go); 0 is none.
type frameRefs struct {
	bodyType uint32 // Frame.body_type
	route    uint32 // Frame.route
	origin   uint32 // Frame.origin
}

// readControlFrame reads one frame from the control stream: a receipt
// (by hand when it can, see decodeControlFrame) with the ref of the
// signer it names, or, in other, another kind.
func (s *streamReader) readControlFrame() (rc *pb.Receipt, signer uint32, other any, n int, err error) {
	defer s.release()
	body, n, _, err := s.next()
	if err != nil {
		return nil, 0, nil, n, err
	}
	rc, signer, other, err = decodeControlFrame(body)
	return rc, signer, other, n, err
}

// envelopeFields returns the envelope and the refs of the bytes of a
// pb.Frame that hold exactly one envelope field and, after it, at most a
// body type field, a route field and an origin field, in that order, each
// a varint that fits 32 bits, nothing else.
func envelopeFields(b []byte) (env []byte, refs frameRefs, ok bool) {
	num, typ, tn := protowire.ConsumeTag(b)
	if tn <= 0 || num != frameFieldEnvelope || typ != protowire.BytesType {
		return nil, frameRefs{}, false
	}
	v, vn := protowire.ConsumeBytes(b[tn:])
	if vn < 0 {
		return nil, frameRefs{}, false
	}
	rest := b[tn+vn:]
	if x, n := consumeRef(rest, frameFieldBodyType); n > 0 {
		refs.bodyType, rest = x, rest[n:]
	}
	if x, n := consumeRef(rest, frameFieldRoute); n > 0 {
		refs.route, rest = x, rest[n:]
	}
	if x, n := consumeRef(rest, frameFieldOrigin); n > 0 {
		refs.origin, rest = x, rest[n:]
	}
	if len(rest) > 0 {
		return nil, frameRefs{}, false
	}
	return v, refs, true
}

// consumeRef reads, at the start of b, the varint field num of a value
// that fits 32 bits: the value and the bytes it takes, n <= 0 when b does
// not start with one.
func consumeRef(b []byte, num protowire.Number) (ref uint32, n int) {
	got, typ, tn := protowire.ConsumeTag(b)
	if tn <= 0 || got != num || typ != protowire.VarintType {
		return 0, -1
	}
	x, xn := protowire.ConsumeVarint(b[tn:])
	if xn < 0 || x > 1<<32-1 {
		return 0, -1
	}
	return uint32(x), tn + xn
}

// decodeNamedFrameOwned decodes the bytes of one pb.Frame of a lane
// stream, which should hold an envelope and may name its body's type or
// its route by ref (refs); a frame of another kind returns its kind in
// other. owned says b is the frame's own buffer (see decodeEnvelopeOwned).
func decodeNamedFrameOwned(b []byte, owned bool) (env *pb.Envelope, refs frameRefs, other any, err error) {
	if v, r, ok := envelopeFields(b); ok {
		env, err := decodeEnvelopeOwned(v, owned)
		if err != nil {
			return nil, frameRefs{}, nil, fmt.Errorf("%w: %w", ErrBadFrame, err)
		}
		return env, r, nil, nil
	}
	var f pb.Frame
	if err := proto.Unmarshal(b, &f); err != nil {
		return nil, frameRefs{}, nil, fmt.Errorf("%w: %w", ErrBadFrame, err)
	}
	if env := f.GetEnvelope(); env != nil {
		return env, frameRefs{bodyType: f.GetBodyType(), route: f.GetRoute(), origin: f.GetOrigin()}, nil, nil
	}
	if f.GetBodyType() != 0 || f.GetRoute() != 0 || f.GetOrigin() != 0 {
		return nil, frameRefs{}, nil, fmt.Errorf("%w: a body type, route or origin on a frame without an envelope", ErrBadFrame)
	}
	return nil, frameRefs{}, f.Kind, nil
}
