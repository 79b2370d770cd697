package mesh

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// errStreamTooLarge ends a read past InboundStreamBytes. memberlist only
// logs it and closes the stream; it never reaches a caller of the mesh API.
var errStreamTooLarge = errors.New("mesh: inbound gossip stream over the byte limit")

// streamCost is what accepting one stream is charged against the byte
// rate: memberlist's first read buffer. It caps accepted streams per second
// at InboundStreamRate/4 KiB, so a stranger who connects and closes in a
// loop spends the kernel's time, not this process's.
const streamCost = 4 << 10

// streamLimits is what one inbound gossip stream may cost before memberlist
// has authenticated a byte of it (see Config.InboundStreams and below).
type streamLimits struct {
	streams int           // concurrent inbound streams
	bytes   int64         // bytes read from one stream
	timeout time.Duration // life of one stream, from accept
	rate    int           // bytes per second read from all inbound streams together
}

// InboundStats counts what the inbound limits did since New. Strangers
// show up here; members almost never do.
type InboundStats struct {
	// Streams is the number of inbound streams handed to memberlist.
	Streams uint64
	// StreamsTooLarge were cut at InboundStreamBytes.
	StreamsTooLarge uint64
	// StreamsTimedOut were cut by a read deadline (InboundStreamTimeout, or
	// memberlist's own TCPTimeout when shorter).
	StreamsTimedOut uint64
	// PacketsTooLarge are datagrams over InboundPacketBytes, dropped unread.
	PacketsTooLarge uint64
}

// streamGuard wraps a memberlist transport so that an unauthenticated peer
// cannot make memberlist hold much: memberlist reads a whole stream (up to
// 20 MB of announced "encrypted" state) before it can check the key, and
// starts a goroutine per stream with no limit. The guard
//
//   - takes a slot before it takes a stream from the inner transport, so at
//     most limits.streams are open in memberlist; the rest wait where the
//     inner transport keeps them (for netTransport: the kernel's accept
//     queue, which costs this process nothing);
//   - fails any read past limits.bytes (at once when an encrypted message
//     announces more),
//   - paces reads of all inbound streams together to limits.rate bytes/s,
//     which bounds the CPU a stranger makes memberlist spend decrypting
//     garbage, and
//   - sets a deadline limits.timeout after accept that memberlist's own
//     SetDeadline calls can shorten but never extend.
//
// Packets and outbound streams pass through untouched.
type streamGuard struct {
	memberlist.NodeAwareTransport
	limits streamLimits

	rate    *byteRate
	slots   chan struct{} // one token per open inbound stream
	streams chan net.Conn // what memberlist reads
	done    chan struct{}
	wg      sync.WaitGroup // forward
	once    sync.Once

	accepted, tooLarge, timedOut atomic.Uint64
}

func newStreamGuard(inner memberlist.NodeAwareTransport, limits streamLimits) *streamGuard {
	g := &streamGuard{
		NodeAwareTransport: inner,
		limits:             limits,
		rate:               newByteRate(limits.rate, limits.bytes),
		slots:              make(chan struct{}, limits.streams),
		streams:            make(chan net.Conn),
		done:               make(chan struct{}),
	}
	g.wg.Add(1)
	go g.forward()
	return g
}

func (g *streamGuard) StreamCh() <-chan net.Conn { return g.streams }

// forward owns the hand-over of inbound streams: slot first, then stream.
func (g *streamGuard) forward() {
	defer g.wg.Done()
	in := g.NodeAwareTransport.StreamCh()
	for {
		select {
		case g.slots <- struct{}{}:
		case <-g.done:
			return
		}
		if wait := g.rate.reserve(streamCost, time.Now()); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-g.done:
				t.Stop()
				return
			}
		}
		var c net.Conn
		select {
		case c = <-in:
		case <-g.done:
			return
		}
		gc := g.guard(c)
		select {
		case g.streams <- gc:
			g.accepted.Add(1)
		case <-g.done:
			_ = gc.Close()
			return
		}
	}
}

// guard wraps c, whose slot is already taken, with the byte and time limits.
func (g *streamGuard) guard(c net.Conn) *guardedConn {
	deadline := time.Now().Add(g.limits.timeout)
	_ = c.SetDeadline(deadline) // an error here surfaces on the first read
	return &guardedConn{Conn: c, g: g, deadline: deadline, left: g.limits.bytes}
}

// Shutdown shuts the inner transport down first (no new streams), then
// stops forwarding. Streams already with memberlist end at their deadline.
// Idempotent.
func (g *streamGuard) Shutdown() error {
	err := g.NodeAwareTransport.Shutdown()
	g.once.Do(func() { close(g.done) })
	g.wg.Wait()
	if err != nil {
		return fmt.Errorf("mesh: transport shutdown: %w", err)
	}
	return nil
}

func (g *streamGuard) stats() InboundStats {
	return InboundStats{
		Streams:         g.accepted.Load(),
		StreamsTooLarge: g.tooLarge.Load(),
		StreamsTimedOut: g.timedOut.Load(),
	}
}

// guardedConn is one inbound stream under the limits. memberlist reads a
// stream from one goroutine (its handleConn), so left and the flags need no
// lock; Close may come from anywhere and is guarded by closeOnce.
type guardedConn struct {
	net.Conn
	g        *streamGuard
	deadline time.Time

	// Owned by the reading goroutine.
	left              int64 // bytes this stream may still deliver
	cut, slowReported bool
	pre               preamble

	closeOnce sync.Once
}

func (c *guardedConn) Read(p []byte) (int, error) {
	if c.left <= 0 {
		if !c.cut {
			c.cut = true
			c.g.tooLarge.Add(1)
		}
		return 0, errStreamTooLarge
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.Conn.Read(p)
	c.left -= int64(n)
	if n > 0 && err == nil {
		err = c.pace(n)
	}
	if announced, ok := c.pre.scan(p[:n]); ok && announced > c.g.limits.bytes {
		// The stream says up front it is larger than the limit: cut it
		// now instead of reading what it sends.
		c.left = 0
		c.cut = true
		c.g.tooLarge.Add(1)
		return 0, errStreamTooLarge
	}
	var ne net.Error
	if err != nil && !c.slowReported && errors.As(err, &ne) && ne.Timeout() {
		c.slowReported = true
		c.g.timedOut.Add(1)
	}
	return n, err
}

// pace waits until n more bytes fit the shared rate. A wait that would end
// past the stream's deadline ends the stream now, as the deadline would.
func (c *guardedConn) pace(n int) error {
	wait := c.g.rate.reserve(n, time.Now())
	if wait <= 0 {
		return nil
	}
	if time.Now().Add(wait).After(c.deadline) {
		if !c.slowReported {
			c.slowReported = true
			c.g.timedOut.Add(1)
		}
		return os.ErrDeadlineExceeded
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-c.g.done:
		return net.ErrClosed
	}
}

// clamp keeps a deadline memberlist asks for within the guard's.
func (c *guardedConn) clamp(t time.Time) time.Time {
	if t.IsZero() || t.After(c.deadline) {
		return c.deadline
	}
	return t
}

func (c *guardedConn) SetDeadline(t time.Time) error { return c.Conn.SetDeadline(c.clamp(t)) }
func (c *guardedConn) SetReadDeadline(t time.Time) error {
	return c.Conn.SetReadDeadline(c.clamp(t))
}
func (c *guardedConn) SetWriteDeadline(t time.Time) error {
	return c.Conn.SetWriteDeadline(c.clamp(t))
}

// Close closes the stream and frees its slot, once.
func (c *guardedConn) Close() error {
	err := net.ErrClosed
	c.closeOnce.Do(func() {
		err = c.Conn.Close()
		<-c.g.slots
	})
	return err
}

// byteRate is a token bucket over bytes shared by all inbound streams:
// reserve books n bytes and says how long to wait before using them.
type byteRate struct {
	perF  float64       // nanoseconds per byte
	burst time.Duration // the bucket's depth, in time

	// mu guards the field below.
	mu   sync.Mutex
	next time.Time // when the bytes booked so far are paid for
}

func newByteRate(rate int, burst int64) *byteRate {
	per := float64(time.Second) / float64(rate)
	return &byteRate{perF: per, burst: time.Duration(per * float64(burst))}
}

func (r *byteRate) reserve(n int, now time.Time) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if earliest := now.Add(-r.burst); r.next.Before(earliest) {
		r.next = earliest // idle time refills at most one burst
	}
	r.next = r.next.Add(time.Duration(float64(n) * r.perF))
	return r.next.Sub(now)
}

// memberlist's stream framing, as far as the guard reads it: an optional
// label header [labelMsg][len][label], then a message type; an encrypted
// message carries its length as a big-endian uint32 right after the type.
const (
	labelMsg   = 244
	encryptMsg = 10
)

// preamble follows the first bytes of a stream to find the length an
// encrypted message announces, so an oversized one is refused before its
// body is read. Owned by the reading goroutine.
type preamble struct {
	state     int // 0 type, 1 label length, 2 label, 3 length, 4 done
	labelLeft int
	length    uint32
	lenBytes  int
}

// scan consumes b and returns the announced length once all four bytes of
// it were seen; a stream that is not encrypted has none.
func (p *preamble) scan(b []byte) (announced int64, ok bool) {
	for _, x := range b {
		switch p.state {
		case 0:
			switch x {
			case labelMsg:
				p.state = 1
			case encryptMsg:
				p.state = 3
			default:
				p.state = 4
			}
		case 1:
			p.labelLeft = int(x)
			p.state = 2
			if p.labelLeft == 0 {
				p.state = 0
			}
		case 2:
			p.labelLeft--
			if p.labelLeft == 0 {
				p.state = 0
			}
		case 3:
			p.length = p.length<<8 | uint32(x)
			p.lenBytes++
			if p.lenBytes == 4 {
				p.state = 4
				return int64(p.length), true
			}
		default:
			return 0, false
		}
	}
	return 0, false
}
