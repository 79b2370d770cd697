package transport

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/meshnode/meshnode/internal/envcodec"
	"google.golang.org/protobuf/encoding/protowire"
)

// What reading from one peer may cost. A member holds a valid certificate,
// so what it sends is bounded here, per connection, before anything is
// decoded:
//
//   - each received stream reads through a readBufSize buffer; a frame
//     that fits is decoded from it, without copying it out first;
//   - a larger frame is read into a buffer of its own, whose bytes are
//     first taken from the connection's budget (Config.MaxReadBytes):
//     frames in progress on all the connection's streams together never
//     hold more; a stream waits for budget (QUIC flow control then holds
//     the peer back);
//   - once the first byte of a frame has arrived, the rest must arrive
//     within Config.FrameReadTimeout, budget wait included, or the
//     connection is closed with CodeProtocol;
//   - an envelope with more headers than Config.MaxHeaders, or more header
//     bytes than Config.MaxHeaderBytes, is refused before it is decoded
//     (a map is several times the size of its encoding).
//
// So one connection holds at most: quic-go's receive window (2 x (Lanes,
// at least 16, + 1) x StreamWindow, 17 MiB by default; setReceiveWindows),
// (2 x maxLanes + 16) streams x readBufSize (8.25 MiB), and MaxReadBytes
// of frames being read; decoded envelopes then belong to the handler (the
// node charges them to the peer until they are handled).

// errFrameTimeout: a frame was not complete within FrameReadTimeout.
var errFrameTimeout = fmt.Errorf("%w: frame not completed in time", ErrBadFrame)

// readBudget bounds the bytes of frames being read on one connection.
type readBudget struct {
	max int64

	// mu guards the fields below.
	mu    sync.Mutex
	used  int64
	freed chan struct{} // closed and replaced when bytes are released
}

func newReadBudget(max int) *readBudget {
	return &readBudget{max: int64(max), freed: make(chan struct{})}
}

// acquire takes n bytes, waiting until deadline (or done) for them. A
// request alone is always granted, so a frame up to MaxFrameSize fits
// (Validate keeps MaxReadBytes above it).
func (b *readBudget) acquire(n int64, deadline time.Time, done <-chan struct{}) error {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		b.mu.Lock()
		if b.used == 0 || b.used+n <= b.max {
			b.used += n
			b.mu.Unlock()
			return nil
		}
		freed := b.freed
		b.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(time.Until(deadline))
		}
		select {
		case <-freed:
		case <-timer.C:
			return errFrameTimeout
		case <-done:
			return io.ErrClosedPipe
		}
	}
}

func (b *readBudget) release(n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	b.used -= n
	close(b.freed)
	b.freed = make(chan struct{})
	b.mu.Unlock()
}

// inUse returns the bytes held now (tests).
func (b *readBudget) inUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// deadliner is the part of a QUIC receive stream a streamReader needs.
type deadliner interface {
	SetReadDeadline(time.Time) error
}

// streamReader reads the frames of one received stream within the limits
// above. Owned by the stream's reader goroutine; not thread-safe.
type streamReader struct {
	br      *bufio.Reader
	rs      deadliner   // nil: no deadline (ReadFrame's callers)
	budget  *readBudget // nil: no budget
	done    <-chan struct{}
	max     int
	timeout time.Duration

	// The frame last returned by next, until release.
	peeked  int   // bytes to Discard from br
	charged int64 // bytes to give back to budget
	armed   bool  // a read deadline is set
}

// next reads one frame and returns its body: in br's buffer when peeked
// (valid until release), else in a buffer of its own. n counts the length
// prefix and the body. Call release once done with body, also after an
// error.
func (s *streamReader) next() (body []byte, n int, peeked bool, err error) {
	if s.max <= 0 {
		return nil, 0, false, fmt.Errorf("transport: read frame: max %d must be positive", s.max)
	}
	size, prefix, err := s.readLength()
	if err != nil {
		return nil, prefix, false, err
	}
	if size > uint64(s.max) {
		return nil, prefix, false, fmt.Errorf("%w: %d bytes announced, limit %d", ErrFrameTooLarge, size, s.max)
	}
	sz := int(size)
	if s.br.Buffered() < sz {
		s.arm()
	}
	if sz <= s.br.Size() {
		// Decode straight out of the reader's buffer: no allocation for the
		// bytes; decoders copy what they keep.
		body, err = s.br.Peek(sz)
		if err != nil {
			return nil, prefix, false, s.bodyErr(err)
		}
		s.peeked = sz
		return body, prefix + sz, true, nil
	}
	if s.budget != nil {
		if err := s.budget.acquire(int64(sz), time.Now().Add(s.timeout), s.done); err != nil {
			return nil, prefix, false, err
		}
		s.charged = int64(sz)
	}
	body = make([]byte, sz)
	if _, err := io.ReadFull(s.br, body); err != nil {
		return nil, prefix, false, s.bodyErr(err)
	}
	return body, prefix + sz, false, nil
}

// release ends the frame next returned: its bytes leave the buffer and the
// budget, and the deadline is lifted.
func (s *streamReader) release() {
	if s.peeked > 0 {
		_, _ = s.br.Discard(s.peeked) // cannot fail: Peek returned these bytes
		s.peeked = 0
	}
	if s.charged > 0 {
		s.budget.release(s.charged)
		s.charged = 0
	}
	if s.armed {
		_ = s.rs.SetReadDeadline(time.Time{})
		s.armed = false
	}
}

// arm sets the deadline for the rest of the frame in progress.
func (s *streamReader) arm() {
	if s.rs == nil || s.armed {
		return
	}
	_ = s.rs.SetReadDeadline(time.Now().Add(s.timeout))
	s.armed = true
}

// readLength is binary.ReadUvarint with errors this package can tell
// apart. Waiting for the first byte has no deadline (a stream may be idle
// for ever); the frame's deadline starts once it has arrived.
func (s *streamReader) readLength() (v uint64, n int, err error) {
	var shift uint
	for n < binary10 {
		if n > 0 && s.br.Buffered() == 0 {
			s.arm()
		}
		b, err := s.br.ReadByte()
		if err != nil {
			if n == 0 && errors.Is(err, io.EOF) {
				return 0, 0, io.EOF // clean end of stream, not wrapped so callers may compare
			}
			return 0, n, fmt.Errorf("transport: read frame length: %w", s.cause(err))
		}
		n++
		if b < 0x80 {
			if n == binary10 && b > 1 {
				break
			}
			return v | uint64(b)<<shift, n, nil
		}
		v |= uint64(b&0x7f) << shift
		shift += 7
	}
	return 0, n, fmt.Errorf("%w: length prefix overflows 64 bits", ErrBadFrame)
}

// binary10 is binary.MaxVarintLen64.
const binary10 = 10

func (s *streamReader) bodyErr(err error) error {
	return fmt.Errorf("transport: read frame body: %w", s.cause(err))
}

// cause maps what a read inside a frame can end with: the stream's end
// (FIN) is a truncated frame, a deadline is a frame too slow; both are
// the peer's fault (ErrBadFrame). Other errors (a reset, the connection
// gone) pass unchanged.
func (s *streamReader) cause(err error) error {
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("%w: the stream ended inside a frame: %w", ErrBadFrame, io.ErrUnexpectedEOF)
	case s.armed && isTimeout(err):
		return errFrameTimeout
	}
	return err
}

func isTimeout(err error) bool {
	var te interface{ Timeout() bool }
	return errors.As(err, &te) && te.Timeout()
}

// checkEnvelopeLimits reports an envelope frame (the bytes of a pb.Frame)
// whose envelope has more than maxHeaders header entries or more than
// maxHeaderBytes of them, counting every occurrence of the envelope field
// (proto merges repeated ones). It reads only tags and lengths; anything
// malformed is left for the decoder to refuse.
func checkEnvelopeLimits(frame []byte, maxHeaders, maxHeaderBytes int) error {
	entries, bytes := 0, 0
	for len(frame) > 0 {
		num, typ, n := protowire.ConsumeTag(frame)
		if n < 0 {
			return nil
		}
		frame = frame[n:]
		n = protowire.ConsumeFieldValue(num, typ, frame)
		if n < 0 {
			return nil
		}
		if num == frameFieldEnvelope && typ == protowire.BytesType {
			env, _ := protowire.ConsumeBytes(frame[:n])
			for len(env) > 0 {
				en, et, k := protowire.ConsumeTag(env)
				if k < 0 {
					break
				}
				env = env[k:]
				k = protowire.ConsumeFieldValue(en, et, env)
				if k < 0 {
					break
				}
				if en == envcodec.FieldHeaders {
					entries++
					bytes += k
				}
				env = env[k:]
			}
		}
		frame = frame[n:]
	}
	if entries > maxHeaders || bytes > maxHeaderBytes {
		return fmt.Errorf("%w: envelope with %d header entries of %d bytes (limits %d and %d)",
			ErrBadFrame, entries, bytes, maxHeaders, maxHeaderBytes)
	}
	return nil
}

// CheckHeaders reports application headers that a peer with c's limits
// refuses: more than MaxHeaders entries, or more than MaxHeaderBytes
// encoded (as the receiver counts them). Senders check before sending so
// that a refused envelope never reaches the wire.
func (c Config) CheckHeaders(h map[string]string) error {
	bytes := 0
	for k, v := range h {
		bytes += protowire.SizeBytes(envcodec.MapEntrySize(k, v))
	}
	if len(h) > c.MaxHeaders || bytes > c.MaxHeaderBytes {
		return fmt.Errorf("transport: %d headers of %d bytes encoded (limits %d and %d)", len(h), bytes, c.MaxHeaders, c.MaxHeaderBytes)
	}
	return nil
}
