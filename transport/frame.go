package transport

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/meshnode/meshnode/mailbox/pb"
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

// ReadFrame reads one frame from r into f (which is reset first) and returns
// the number of bytes consumed. A length prefix above max is refused with
// ErrFrameTooLarge before anything is allocated; undecodable bytes give
// ErrBadFrame; I/O errors are wrapped (a clean end of stream before a frame
// is io.EOF). It never panics.
func ReadFrame(r *bufio.Reader, max int, f *pb.Frame) (n int, err error) {
	if max <= 0 {
		return 0, fmt.Errorf("transport: read frame: max %d must be positive", max)
	}
	size, prefix, err := readUvarint(r)
	if err != nil {
		return prefix, err
	}
	if size > uint64(max) {
		return prefix, fmt.Errorf("%w: %d bytes announced, limit %d", ErrFrameTooLarge, size, max)
	}
	sz := int(size)
	var body []byte
	if sz <= r.Size() {
		// Decode straight out of the reader's buffer: no allocation for the
		// bytes; proto copies what it keeps.
		body, err = r.Peek(sz)
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return prefix, fmt.Errorf("transport: read frame body: %w", err)
		}
	} else {
		body = make([]byte, sz)
		if _, err := io.ReadFull(r, body); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return prefix, fmt.Errorf("transport: read frame body: %w", err)
		}
	}
	uerr := proto.Unmarshal(body, f)
	if sz <= r.Size() {
		_, _ = r.Discard(sz) // cannot fail: Peek returned sz bytes
	}
	if uerr != nil {
		return prefix + sz, fmt.Errorf("%w: %w", ErrBadFrame, uerr)
	}
	return prefix + sz, nil
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
