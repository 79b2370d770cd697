package transport

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/meshnode/meshnode/internal/envcodec"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/quic-go/quic-go"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// lane is one outgoing unidirectional stream with its bounded queue and
// writer goroutine. Senders encode their frames into a pooled scratch
// buffer without any lock and copy them into pooled chunks under mu; the
// writer takes every chunk at once and writes each with one Write. So a
// batch costs one Write per 64 KiB and no allocation.
type lane struct {
	c       *conn
	control bool          // the receipt/GoAway lane; its stream is opened during the handshake
	wake    chan struct{} // capacity 1: "buf has data"

	// stream is owned by run; set before run starts for the control lane.
	stream *quic.SendStream

	// sent is when QUIC last put bytes of this lane's stream into a packet
	// while the lane held a large-frame slot, or when it took the slot
	// (unix ns): how long a holder has been blocked (largeGate).
	sent atomic.Int64
	// packed is the limiter a slot holder writes with, which sets sent; made
	// once, so a write allocates no closure.
	packed func(maxBytes int) int
	// unwritten counts the control lane's receipt bytes queued or being
	// written, until each chunk's Write returns (maxQueuedReceipts).
	unwritten atomic.Int64

	// mu guards the fields below.
	mu          sync.Mutex
	names       map[string]uint32 // body types named on the stream (names.go)
	nameBytes   int               // their URLs' length together
	routes      map[string]uint32 // routes named on the stream, by their fields' bytes
	routeBytes  int               // their fields' length together
	origins     map[string]uint32 // forwarded envelopes' origins named on the stream, by their identity's bytes
	originBytes int               // their identities' length together
	signers     map[string]uint32 // receipts' signers named on the control stream, by their identity's bytes
	signerBytes int               // their identities' length together
	chunks      []*[]byte         // encoded frames not yet taken by the writer, in chunkSize pieces
	size        int64             // their bytes
	n           int               // envelope (or receipt) frames in chunks
	named       int               // naming frames (types, routes, origins, signers) in chunks (names.go)
	large       []span            // where frames too large for the peer's stream buffer (isLarge) lie in chunks
	finished    chan struct{}     // set by finish; closed by run after the last write
}

// span is where a frame lies in a lane's queue: its bytes from, up to to.
type span struct{ from, to int64 }

// encBuf is a scratch buffer in which senders encode their frames before
// taking the lane lock, so concurrent senders marshal in parallel and the
// lock is held only for a copy.
type encBuf struct{ b []byte }

var encBufs = sync.Pool{New: func() any { return new(encBuf) }}

// maxPooledEnc: a scratch buffer grown beyond this by a big frame is not
// pooled again, so one large message does not pin memory.
const maxPooledEnc = 64 << 10

// enqueueEnvelopes encodes envs contiguously into the lane, or none of them.
func (l *lane) enqueueEnvelopes(envs []*pb.Envelope) error {
	c := l.c
	k := int64(len(envs))
	if err := l.reserve(k); err != nil {
		return err
	}
	// The envelopes' sizes, a lower bound of their frames': near the byte
	// bound they refuse before encoding what the bound would refuse after
	// (a sender retrying against a full queue of large messages must not
	// spend a copy of each on every attempt; an envelope too large for any
	// frame is left to the encoding, which says so), and for a batch they
	// size its buffer once instead of a doubling per size step (a relay
	// emission of a thousand envelopes is ~300 KB). Far from the bound a
	// single envelope needs neither.
	crowded := c.crowded.Load()
	least, fits := int64(0), true
	if crowded || len(envs) > 1 {
		for _, env := range envs {
			if sz, ok := envcodec.Size(env); ok {
				least += int64(sz.Total)
				fits = fits && sz.Total < c.maxFrame
			}
		}
	}
	if cur, max := c.qbytes.Load(), int64(c.t.cfg.SendQueueBytes); crowded && fits && cur > 0 && cur+least > max {
		c.queued.Add(-k)
		return c.full(cur, "bytes", cur+least-max)
	}
	eb := encBufs.Get().(*encBuf)
	defer func() {
		if cap(eb.b) <= maxPooledEnc {
			encBufs.Put(eb)
		}
	}()
	out := eb.b[:0]
	if len(envs) > 1 {
		out = slices.Grow(out, int(least)+16*len(envs)) // each with its frame length, tag and envelope length
	}
	if c.names || c.routes || c.origins {
		// Each envelope without its frame's head, which pushEnvelopes
		// writes, naming bodies' types, routes and origins. (Here, not in
		// a function of its own: a sender's stack, a mailbox goroutine's,
		// is deepest here, and a frame more would make it grow for every
		// reply.)
		var one [1]encodedEnv
		run := one[:0]
		if len(envs) > 1 {
			run = make([]encodedEnv, 0, len(envs))
		}
		for _, env := range envs {
			at := len(out)
			var where Body
			var err error
			if out, where, err = appendEnvelope(out, env, c.maxFrame); err != nil {
				eb.b = out
				c.queued.Add(-k)
				return err
			}
			run = append(run, encodedEnv{from: at, to: len(out), body: where})
		}
		eb.b = out
		return l.pushEnvelopes(out, run)
	}
	var one [1]span
	large := one[:0]
	for _, env := range envs {
		var err error
		at := len(out)
		if out, err = appendEnvelopeFrame(out, env, c.maxFrame); err != nil {
			eb.b = out
			c.queued.Add(-k)
			return fmt.Errorf("envelope %q: %w", env.GetMsgId(), err)
		}
		if isLarge(len(out) - at) {
			large = append(large, span{int64(at), int64(len(out))})
		}
	}
	eb.b = out
	return l.push(out, nil, k, large)
}

// appendEnvelope appends env's encoding, as appendEnvelopeFrame does
// without the frame's head, and says where its body is (the zero Body
// for an envelope the codec leaves to proto).
func appendEnvelope(out []byte, env *pb.Envelope, max int) ([]byte, Body, error) {
	sz, ok := envcodec.Size(env)
	if !ok {
		return appendEnvelopeByProto(out, env, max)
	}
	at := len(out)
	out, where := envcodec.AppendBody(out, env, sz)
	if n := len(out) - at; n != sz.Total || protowire.SizeTag(frameFieldEnvelope)+protowire.SizeBytes(n) > max {
		return out[:at], Body{}, encodeError(env, n, sz.Total, max)
	}
	return out, where, nil
}

// appendEnvelopeByProto is appendEnvelope for an envelope the codec
// leaves to proto.
func appendEnvelopeByProto(out []byte, env *pb.Envelope, max int) ([]byte, Body, error) {
	at := len(out)
	out, err := (proto.MarshalOptions{}).MarshalAppend(out, env)
	if err != nil {
		return out[:at], Body{}, fmt.Errorf("envelope %q: transport: encode frame: %w", env.GetMsgId(), err)
	}
	if n := len(out) - at; protowire.SizeTag(frameFieldEnvelope)+protowire.SizeBytes(n) > max {
		return out[:at], Body{}, encodeError(env, n, n, max)
	}
	return out, Body{}, nil
}

// encodeError says why env, encoded in n bytes where its size said
// size, cannot go in a frame of at most max bytes.
func encodeError(env *pb.Envelope, n, size, max int) error {
	if n != size {
		return fmt.Errorf("envelope %q: transport: encode frame: size changed during encoding (envelope modified concurrently?)", env.GetMsgId())
	}
	inner := protowire.SizeTag(frameFieldEnvelope) + protowire.SizeBytes(n)
	return fmt.Errorf("envelope %q: %w: %d bytes, limit %d", env.GetMsgId(), ErrFrameTooLarge, inner, max)
}

// enqueueEncoded queues the frame of one envelope already encoded (env,
// which the caller may reuse once it returns), as enqueueEnvelopes does
// for an envelope that encodes to env; with its body's type and its
// route named on the lane's stream when body says where they are, and
// its origin when it has one, as far as the peer takes such names.
func (l *lane) enqueueEncoded(env []byte, body Body) error {
	c := l.c
	inner := protowire.SizeTag(frameFieldEnvelope) + protowire.SizeBytes(len(env))
	if inner > c.maxFrame {
		return fmt.Errorf("%w: %d bytes, limit %d", ErrFrameTooLarge, inner, c.maxFrame)
	}
	if err := l.reserve(1); err != nil {
		return err
	}
	if cur, max := c.qbytes.Load(), int64(c.t.cfg.SendQueueBytes); c.crowded.Load() && cur > 0 && cur+int64(len(env)) > max {
		c.queued.Add(-1)
		return c.full(cur, "bytes", cur+int64(len(env))-max)
	}
	if (c.names && body.TypeURL() != "") || (c.routes && body.HasRoute()) || c.origins {
		return l.pushEnvelopes(env, []encodedEnv{{to: len(env), body: body}})
	}
	var hb [2 * binary.MaxVarintLen64]byte
	head := protowire.AppendVarint(hb[:0], uint64(inner))
	head = protowire.AppendTag(head, frameFieldEnvelope, protowire.BytesType)
	head = protowire.AppendVarint(head, uint64(len(env)))
	var large []span
	if n := len(head) + len(env); isLarge(n) {
		large = []span{{0, int64(n)}}
	}
	return l.push(head, env, 1, large)
}

// reserve takes room for k frames in the connection's queue bound, or
// says it is full.
func (l *lane) reserve(k int64) error {
	c := l.c
	limit := int64(c.t.cfg.SendQueueSize)
	for {
		cur := c.queued.Load()
		if cur+k > limit && cur > 0 {
			// Over the bound, unless the queue is empty: a batch larger
			// than SendQueueSize (a relay emission) would otherwise never
			// fit, as one frame up to MaxFrameSize fits the byte bound.
			return c.full(cur, "envelopes", c.perEnvelope()*(cur+k-limit))
		}
		if c.queued.CompareAndSwap(cur, cur+k) {
			return nil
		}
	}
}

// push queues the encoded frames a then b (b may be empty), k of them,
// whose room reserve took: it gives the room back when the byte bound or a
// closed connection refuses them. large says where the large ones lie,
// from the start of a.
func (l *lane) push(a, b []byte, k int64, large []span) error {
	c := l.c
	size := int64(len(a) + len(b))
	cur, max := c.qbytes.Add(size), int64(c.t.cfg.SendQueueBytes)
	if cur > max && cur != size {
		// Over the byte bound, unless the queue was empty: one frame up to
		// MaxFrameSize always fits (Validate keeps SendQueueBytes above it).
		c.qbytes.Add(-size)
		c.queued.Add(-k)
		return c.full(cur-size, "bytes", cur-max)
	}
	if cur == size {
		// The queue was empty: its wait starts now, not at the last write.
		c.progress.Store(time.Now().UnixNano())
	}
	c.noteQueue()
	l.mu.Lock()
	if l.finished != nil || c.isClosedFast() {
		l.mu.Unlock()
		c.queued.Add(-k)
		c.qbytes.Add(-size)
		c.noteQueue()
		return fmt.Errorf("%w: connection to %s closed", ErrConnLost, c.peer.Name)
	}
	for _, sp := range large {
		l.large = append(l.large, span{l.size + sp.from, l.size + sp.to})
	}
	l.appendLocked(a)
	l.appendLocked(b)
	l.n += int(k)
	l.mu.Unlock()
	l.signal()
	return nil
}

// isLarge reports whether a frame of n bytes (length prefix included) may
// be too large for the receiver's stream buffer, so that reading it takes
// the connection's read budget (readlimit.go).
//
// Such frames are written by a few lanes of a connection at a time: as
// many as the peer's read budget holds frames of the largest size
// (largeGate, sized from this node's own configuration, which a cluster
// shares). Were every lane to write them at once, QUIC would interleave
// their bytes: every frame would be partly received, the budget held by
// the first few, and the rest of the connection's flow-control window
// spent on bytes waiting for budget behind them. The frames holding the
// budget would then never get their remaining bytes, and each would end in
// the frame read timeout. Frames that fit the stream buffer are read
// without budget, so they keep flowing around the large ones.
func isLarge(n int) bool { return n > readBufSize }

// largeStall: a lane holding a large-frame slot none of whose bytes QUIC
// has put into a packet for this long is stalled, and a waiting lane takes
// its slot. Its stream is not being read (the recipient's handler is slow),
// so it has used up the stream's flow-control window, and the frame it is
// in the middle of holds none of the peer's read budget: the reader takes
// budget only once it is back from the handler.
//
// The rule watches packets, not writes: on a slow machine or link a 64 KiB
// write of a lane that is merely slow can take seconds, but QUIC sends the
// writing lanes' bytes in turns, a packet at a time, so such a lane is
// never silent for long. Passing its slot would put more large frames in
// progress than the peer's read budget holds; the frames waiting for
// budget would fill the connection's receive window and starve those
// holding it, until the frame read timeout ended the connection.
//
// What it cannot tell apart: a connection on which nothing at all is sent
// for this long (the peer reads none of its streams, or the link is down)
// passes the slots of all its holders. More frames than the budget holds
// then wait for it at the peer; they cannot starve those holding it, whose
// streams always get their bytes (setReceiveWindows), but each must be
// complete within the peer's FrameReadTimeout.
//
// A lane holds a slot for one large frame, from its first byte to its
// last, and lanes get slots in the order they asked (largeGate.take): a
// lane whose recipient's handler is steadily slow, not stalled, reads a
// frame now and then, so its bytes keep going out and no rule would call
// it stalled; it gives its slot to a waiting lane after each frame, not
// only once its whole batch is out.
const largeStall = time.Second

// largeGate hands out a connection's large-frame slots. A lane blocked in
// the middle of a frame because its recipient's handler is slow would
// otherwise keep a slot, and the other lanes' large frames, until that
// handler returns: a slot held by a stalled lane passes to a waiting one.
// The stalled frame's reader holds no budget while it waits for its
// handler, so the frames being read stay within the budget.
type largeGate struct {
	mu      sync.Mutex
	free    int
	holders map[*lane]struct{}
	waiting []*lane       // lanes waiting for a slot, in the order they came: the first takes the next
	freed   chan struct{} // closed and replaced when a slot is freed
	stall   time.Duration // largeStall, unless a test set another
}

func newLargeGate(slots int, stall time.Duration) *largeGate {
	if stall <= 0 {
		stall = largeStall
	}
	return &largeGate{free: slots, holders: make(map[*lane]struct{}), freed: make(chan struct{}), stall: stall}
}

// take waits for a slot for l; false means done closed first. Lanes get
// slots in the order they asked: a lane that has just written a large
// frame and has another waits behind those already waiting.
func (g *largeGate) take(l *lane, done <-chan struct{}) bool {
	var t *time.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	for {
		g.mu.Lock()
		now := time.Now().UnixNano()
		if len(g.waiting) == 0 || g.waiting[0] == l {
			if g.free > 0 {
				g.free--
				g.hold(l, now)
				return true
			}
			for h := range g.holders {
				if now-h.sent.Load() >= int64(g.stall) {
					delete(g.holders, h) // h's release is now a no-op
					g.hold(l, now)
					return true
				}
			}
		}
		if !slices.Contains(g.waiting, l) {
			g.waiting = append(g.waiting, l)
		}
		freed := g.freed
		g.mu.Unlock()
		if t == nil {
			t = time.NewTimer(g.stall)
		} else {
			t.Reset(g.stall)
		}
		select {
		case <-freed:
		case <-t.C:
		case <-done:
			g.mu.Lock()
			g.unwait(l)
			g.mu.Unlock()
			return false
		}
	}
}

// hold gives l a slot and unlocks g. l counts as sending from now, or a
// timestamp of its last batch would make it look stalled at once.
func (g *largeGate) hold(l *lane, now int64) {
	l.sent.Store(now)
	g.holders[l] = struct{}{}
	g.unwait(l)
	g.mu.Unlock()
}

// unwait takes l out of the waiting lanes; if it was in, the lanes
// waiting behind it are woken, since the next in line may take a slot
// still free.
func (g *largeGate) unwait(l *lane) {
	if i := slices.Index(g.waiting, l); i >= 0 {
		g.waiting = slices.Delete(g.waiting, i, i+1)
		g.wake()
	}
}

// wake wakes every lane waiting in take. g.mu must be held.
func (g *largeGate) wake() {
	close(g.freed)
	g.freed = make(chan struct{})
}

// release gives back l's slot, unless a waiting lane took it over.
func (g *largeGate) release(l *lane) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.holders[l]; !ok {
		return
	}
	delete(g.holders, l)
	g.free++
	g.wake()
}

// enqueueReceipt queues a receipt on the control lane; it never blocks.
// It refuses one only when the connection is gone or the peer reads no
// receipts (maxQueuedReceipts), and then the connection is closed.
func (l *lane) enqueueReceipt(rc *pb.Receipt) error {
	eb := encBufs.Get().(*encBuf)
	defer func() {
		if cap(eb.b) <= maxPooledEnc {
			encBufs.Put(eb)
		}
	}()
	var err error
	eb.b, err = appendReceiptFrame(eb.b[:0], rc, l.c.maxFrame)
	if errors.Is(err, ErrFrameTooLarge) && len(rc.GetMessage()) > 0 && rc.GetSignature() == nil {
		// Its text (a handler's error) is longer than the peer reads in
		// a frame: the verdict matters, the text is cut to fit. A signed
		// text cannot be cut here (SignReceipt cut it already).
		over := protowire.SizeTag(frameFieldReceipt) + protowire.SizeBytes(proto.Size(rc)) - l.c.maxFrame
		cut := proto.CloneOf(rc)
		cut.Message = cutUTF8(rc.GetMessage(), len(rc.GetMessage())-over-16)
		eb.b, err = appendReceiptFrame(eb.b[:0], cut, l.c.maxFrame)
	}
	if err != nil {
		return err
	}
	// A signed receipt (for a forwarded message) may name its signer
	// (names.go): after its frame, its signer's identity and the receipt
	// without it.
	full, idEnd := len(eb.b), 0
	if l.c.signers {
		eb.b, idEnd = appendSignerParts(eb.b, rc)
	}
	l.mu.Lock()
	if l.finished != nil || l.c.isClosedFast() {
		l.mu.Unlock()
		return fmt.Errorf("%w: connection to %s closed", ErrConnLost, l.c.peer.Name)
	}
	size := int64(full)
	if n, held := l.n, l.unwritten.Load(); n >= l.c.t.maxQueuedReceipts() || (held > 0 && held+size > int64(l.c.t.cfg.SendQueueBytes)) {
		l.mu.Unlock()
		err := fmt.Errorf("%w: %d receipts (%d bytes) wait for %s, which does not read them", ErrQueueFull, n, held, l.c.peer.Name)
		l.c.protocolError(CodeProtocol, err.Error())
		return err
	}
	if idEnd > 0 {
		size = int64(l.appendSignedLocked(eb.b, full, idEnd))
	} else {
		l.appendLocked(eb.b[:full])
	}
	l.unwritten.Add(size)
	l.n++
	l.mu.Unlock()
	l.signal()
	return nil
}

// minQueuedReceipts is the least number of receipts a connection's control
// lane holds for its writer (maxQueuedReceipts).
const minQueuedReceipts = 1 << 16

// maxQueuedReceipts bounds the receipts waiting for the control lane's
// writer. Each answers an envelope this node already took, and a group
// commit answers hundreds at once, faster than the writer takes them,
// while neither side's SendQueueSize bounds how many envelopes are in
// flight: so a healthy peer must never meet this bound, and it is at
// least minQueuedReceipts whatever SendQueueSize is. Their bytes, also
// those the writer took and is still writing, are bounded by
// SendQueueBytes, as a peer's envelopes are (a receipt may carry a long
// message). Only a peer that stops reading its receipts (QUIC's flow
// control then stops the writer) fills either; enqueueReceipt then
// closes the connection, which fails the peer's waiting requests at once
// (they are sent again on the next connection and answered as
// duplicates) instead of dropping a receipt and leaving them to their
// timeout.
func (t *Transport) maxQueuedReceipts() int {
	if t.cfg.maxReceipts > 0 {
		return t.cfg.maxReceipts
	}
	return max(t.cfg.SendQueueSize, minQueuedReceipts)
}

// finish queues a GoAway as the last frame; the returned channel closes
// once it is written (or the connection ended).
func (l *lane) finish(g *pb.GoAway) <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.finished != nil {
		return l.finished
	}
	l.finished = make(chan struct{})
	f := &pb.Frame{Kind: &pb.Frame_Goaway{Goaway: g}}
	if b, err := AppendFrame(nil, f); err == nil { // our own short reason: never near MaxFrameSize
		l.appendLocked(b)
		l.unwritten.Add(int64(len(b)))
		l.n++
	}
	l.signal()
	return l.finished
}

// chunkSize is the piece in which queued frames are stored and written:
// big enough that a batch takes few Writes, small enough to pool. Queued
// bytes never move once copied in, and an idle lane holds no buffer.
const chunkSize = 64 << 10

var chunks = sync.Pool{New: func() any { b := make([]byte, 0, chunkSize); return &b }}

// appendLocked copies encoded frames into the lane's chunks. l.mu must be held.
func (l *lane) appendLocked(b []byte) {
	l.size += int64(len(b))
	for len(b) > 0 {
		var last *[]byte
		if k := len(l.chunks); k > 0 && len(*l.chunks[k-1]) < chunkSize {
			last = l.chunks[k-1]
		} else {
			last = chunks.Get().(*[]byte)
			*last = (*last)[:0]
			l.chunks = append(l.chunks, last)
		}
		m := min(len(b), chunkSize-len(*last))
		*last = append(*last, b[:m]...)
		b = b[m:]
	}
}

// pack is l.packed: QUIC calls it as it puts up to maxBytes of l's stream
// into a packet, and sends them all.
func (l *lane) pack(maxBytes int) int {
	l.sent.Store(time.Now().UnixNano())
	return maxBytes
}

func (l *lane) signal() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// run is the lane's writer: it drains the queue in batches until the
// connection ends.
func (l *lane) run() {
	c := l.c
	defer c.t.wg.Done()
	var spare []*[]byte
	var spareLarge []span
	for {
		select {
		case <-l.wake:
		case <-c.done:
			l.closeFinished()
			return
		}
		l.mu.Lock()
		out, n, named, large, fin := l.chunks, l.n, l.named, l.large, l.finished
		l.chunks, l.n, l.named, l.large, l.size = spare[:0], 0, 0, spareLarge[:0], 0
		l.mu.Unlock()
		if n > 0 {
			if l.stream == nil {
				s, err := c.qc.OpenUniStreamSync(c.qc.Context())
				if err != nil {
					l.closeFinished()
					c.lost(err)
					return
				}
				l.stream = s
			}
			bytes, began, writers := 0, time.Now(), c.writers.Add(1)
			w := batchWriter{l: l, large: large}
			for i, ch := range out {
				if err := w.write(*ch); err != nil {
					c.writers.Add(-1)
					if w.holding {
						c.large.release(l)
					}
					l.closeFinished()
					if !errors.Is(err, errClosing) {
						c.lost(err)
					}
					return
				}
				bytes += len(*ch)
				c.progress.Store(time.Now().UnixNano())
				// A written chunk leaves the queue at once, not with the
				// rest of the batch: QUIC holds no reference to it, and
				// senders waiting for room get it as it is made.
				if !l.control {
					c.qbytes.Add(-int64(len(*ch)))
					c.noteQueue()
				} else {
					l.unwritten.Add(-int64(len(*ch)))
				}
				chunks.Put(ch)
				out[i] = nil
			}
			c.writers.Add(-1)
			if !l.control {
				c.queued.Add(-int64(n))
				c.noteRate(bytes, time.Since(began)-w.waited, writers)
			}
			c.stats.framesOut.Add(uint64(n + named))
			c.stats.bytesOut.Add(uint64(bytes))
			c.stats.writesOut.Add(uint64(len(out)))
		}
		for i, ch := range out {
			if ch != nil {
				chunks.Put(ch)
				out[i] = nil
			}
		}
		spare, spareLarge = out, large
		if n > 0 {
			// Let the goroutines this write's wake-up queued behind us run
			// before we wait again. A sender's signal makes this goroutine
			// the next to run on its core, so without the yield, callers
			// woken together (the askers one burst of replies releases)
			// alternate with the writer and each frame becomes a write and
			// a QUIC packet of its own; with it, they queue their frames
			// first and the next write takes them all. What was just
			// written is already on its way: a lone sender waits no longer.
			runtime.Gosched()
		}
		if fin != nil {
			l.mu.Lock()
			empty := l.n == 0
			l.mu.Unlock()
			if empty {
				if l.stream != nil {
					_ = l.stream.Close()
				}
				close(fin)
				<-c.done
				return
			}
		}
	}
}

// errClosing: the connection ended while a lane waited for a large-frame
// slot.
var errClosing = errors.New("transport: connection closing")

// batchWriter writes one batch of a lane's queue, a chunk at a time, and
// holds a large-frame slot for each large frame in it, from its first byte
// to its last: a lane whose recipient reads slowly gives its slot to a
// waiting lane between its frames, not only once its whole batch is out.
type batchWriter struct {
	l       *lane
	large   []span        // the batch's large frames, in order
	at      int64         // offset of the next byte to write
	holding bool          // a slot, for large[0]
	waited  time.Duration // waiting for slots, which is not writing (noteRate)
}

// write writes chunk, the batch's next bytes, cut where a large frame
// begins or ends.
func (w *batchWriter) write(chunk []byte) error {
	l, c := w.l, w.l.c
	for len(chunk) > 0 {
		n := len(chunk)
		var limit func(int) int
		if len(w.large) > 0 {
			sp := w.large[0]
			if !w.holding && w.at == sp.from {
				t := time.Now()
				if !c.large.take(l, c.done) {
					return errClosing
				}
				w.waited += time.Since(t)
				w.holding = true
			}
			if w.holding {
				n = min(n, int(sp.to-w.at))
				// A slot holder's bytes are watched as QUIC packs them.
				limit = l.packed
			} else {
				n = min(n, int(sp.from-w.at))
			}
		}
		c.progress.Store(time.Now().UnixNano())
		if _, err := l.stream.WriteWithLimit(chunk[:n], limit); err != nil {
			return err
		}
		chunk = chunk[n:]
		w.at += int64(n)
		if w.holding && w.at == w.large[0].to {
			c.large.release(l)
			w.holding = false
			w.large = w.large[1:]
		}
	}
	return nil
}

// closeFinished releases a Close waiting in finish.
func (l *lane) closeFinished() {
	l.mu.Lock()
	fin := l.finished
	if fin == nil {
		l.finished = make(chan struct{}) // refuse later enqueues
		fin = l.finished
	}
	l.mu.Unlock()
	select {
	case <-fin:
	default:
		close(fin)
	}
}

// cutUTF8 returns s cut to at most n bytes (none below 0) at a rune
// boundary, so it stays valid UTF-8 if s was.
func cutUTF8(s string, n int) string {
	if n >= len(s) {
		return s
	}
	n = max(n, 0)
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
