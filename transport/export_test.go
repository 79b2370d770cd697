package transport

import (
	"time"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/quic-go/quic-go"
)

// Test hooks for the external test package.

// SetMaxQueuedReceipts makes a transport built from cfg hold at most n
// receipts for its control lane's writer.
func SetMaxQueuedReceipts(cfg *Config, n int) { cfg.maxReceipts = n }

// SetLargeStall makes a transport built from cfg pass a large-frame slot
// only from a lane none of whose bytes were sent for d.
func SetLargeStall(cfg *Config, d time.Duration) { cfg.largeStall = d }

// SetHelloHook makes a transport built from cfg send the Hello that f edits.
func SetHelloHook(cfg *Config, f func(*pb.Hello)) { cfg.helloHook = f }

// LoadResetKey exposes loadResetKey.
func LoadResetKey(dir string) (*quic.StatelessResetKey, error) { return loadResetKey(dir) }

// LaneOf exposes laneOf.
func LaneOf(recipient string, lanes int) int { return laneOf(recipient, lanes) }

// ConnInfo reports whether t has a live connection to node and whether t dialed it.
func ConnInfo(t *Transport, node string) (ok, dialed bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.peers[node]
	if p == nil || p.conn == nil || p.conn.isClosed() {
		return false, false
	}
	return true, p.conn.dialed
}

// AppendEnvelopeFrame exposes the hand-written envelope frame encoder.
func AppendEnvelopeFrame(dst []byte, env *pb.Envelope, max int) ([]byte, error) {
	return appendEnvelopeFrame(dst, env, max)
}

// AppendEnvelopeFrameGeneric is the proto.Marshal-based encoder the
// hand-written one must match byte for byte.
func AppendEnvelopeFrameGeneric(dst []byte, env *pb.Envelope, max int) ([]byte, error) {
	return appendMsgFrame(dst, frameFieldEnvelope, env, max)
}

// DecodeEnvelope exposes the hand-written envelope decoder (with its fallback).
func DecodeEnvelope(b []byte) (*pb.Envelope, error) { return decodeEnvelope(b) }

// DecodeEnvelopeFast exposes the decoder's fast path alone.
func DecodeEnvelopeFast(b []byte) (*pb.Envelope, bool) { return decodeEnvelopeFast(b) }

// AppendReceiptFrame exposes the hand-written receipt frame encoder.
func AppendReceiptFrame(dst []byte, rc *pb.Receipt, max int) ([]byte, error) {
	return appendReceiptFrame(dst, rc, max)
}

// AppendReceiptFrameGeneric is the proto.Marshal-based encoder the
// hand-written one must match byte for byte.
func AppendReceiptFrameGeneric(dst []byte, rc *pb.Receipt, max int) ([]byte, error) {
	return appendMsgFrame(dst, frameFieldReceipt, rc, max)
}

// DecodeControlFrame exposes the control stream's frame decoder.
func DecodeControlFrame(b []byte) (*pb.Receipt, uint32, any, error) { return decodeControlFrame(b) }

// DecodeReceiptFast exposes the receipt decoder's fast path alone.
func DecodeReceiptFast(b []byte) (*pb.Receipt, bool) { return decodeReceiptFast(b) }

// ReadBytesInUse returns the bytes of frames being read on t's connection
// from node (0 without one).
func ReadBytesInUse(t *Transport, node string) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.peers[node]
	if p == nil || p.conn == nil {
		return 0
	}
	return p.conn.reads.inUse()
}

// DecodeEnvelopeFrameOwned exposes the lane streams' frame decoder with
// its owned mode.
// bodyType, route and origin are the frame's refs.
func DecodeEnvelopeFrameOwned(b []byte, owned bool) (env *pb.Envelope, bodyType, route, origin uint32, other any, err error) {
	env, refs, other, err := decodeNamedFrameOwned(b, owned)
	return env, refs.bodyType, refs.route, refs.origin, other, err
}

// CheckEnvelopeLimits exposes the header pre-check.
func CheckEnvelopeLimits(frame []byte, maxHeaders, maxHeaderBytes int) error {
	return checkEnvelopeLimits(frame, maxHeaders, maxHeaderBytes)
}

// QueueState reports the send-queue counters of t's connection to node.
func QueueState(t *Transport, node string) (ok bool, queued, qbytes int64, crowded bool, wrate int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.peers[node]
	if p == nil || p.conn == nil {
		return false, 0, 0, false, 0
	}
	c := p.conn
	return true, c.queued.Load(), c.qbytes.Load(), c.crowded.Load(), c.wrate.Load()
}

// CrowdedConns is t's count of crowded connections.
func CrowdedConns(t *Transport) int32 { return t.crowded.Load() }

// RetryFor is the RetryAfter full gives for excess bytes on a connection of t
// that has measured rate bytes/s.
func RetryFor(t *Transport, rate, excess int64) time.Duration {
	c := &conn{t: t}
	c.wrate.Store(rate)
	return c.full(0, "bytes", excess).RetryAfter
}

// RateAfter is the write rate of a fresh connection of t after one
// noteRate(n, d, writers).
func RateAfter(t *Transport, n int, d time.Duration, writers int32) int64 {
	c := &conn{t: t}
	c.noteRate(n, d, writers)
	return c.wrate.Load()
}

// Waiting returns the number of receipts t's connection to node still
// waits for (0 without a connection).
func Waiting(t *Transport, node string) int {
	t.mu.Lock()
	p := t.peers[node]
	var c *conn
	if p != nil {
		c = p.conn
	}
	t.mu.Unlock()
	if c == nil {
		return 0
	}
	return c.waiting()
}

// ConnID returns the id of t's live connection to node (0 without one).
func ConnID(t *Transport, node string) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.peers[node]
	if p == nil || p.conn == nil || p.conn.isClosed() {
		return 0
	}
	return p.conn.id
}

// Dialing reports whether t has a dial to node in flight.
func Dialing(t *Transport, node string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.peers[node]
	return p != nil && p.dialing != nil
}

// Queued reports what t's send queue to node holds: frames and bytes
// (zeros without a connection).
func Queued(t *Transport, node string) (frames, bytes int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p := t.peers[node]; p != nil && p.conn != nil {
		return p.conn.queued.Load(), p.conn.qbytes.Load()
	}
	return 0, 0
}

// LargeGate reports the large-frame gate of t's connection to node: free
// slots, lanes holding one, lanes waiting (ok false without a connection).
func LargeGate(t *Transport, node string) (ok bool, free, held, waiting int) {
	t.mu.Lock()
	p := t.peers[node]
	var c *conn
	if p != nil {
		c = p.conn
	}
	t.mu.Unlock()
	if c == nil || c.large == nil {
		return false, 0, 0, 0
	}
	g := c.large
	g.mu.Lock()
	defer g.mu.Unlock()
	return true, g.free, len(g.holders), len(g.waiting)
}
