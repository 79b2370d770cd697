package transport

import (
	"fmt"
	"sync"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/quic-go/quic-go"
	"google.golang.org/protobuf/proto"
)

// lane is one outgoing unidirectional stream with its bounded queue and
// writer goroutine. Senders encode frames straight into buf under mu; the
// writer swaps buf with its spare buffer and writes the whole batch with one
// Write. So a batch costs one syscall-path call and, once both buffers have
// grown, no allocation.
type lane struct {
	c       *conn
	control bool          // the receipt/GoAway lane; its stream is opened during the handshake
	wake    chan struct{} // capacity 1: "buf has data"

	// stream is owned by run; set before run starts for the control lane.
	stream *quic.SendStream

	// mu guards the fields below.
	mu       sync.Mutex
	buf      []byte        // encoded frames not yet taken by the writer
	n        int           // frames in buf
	finished chan struct{} // set by finish; closed by run after the last write
	frame    pb.Frame
	envKind  pb.Frame_Envelope
	rcKind   pb.Frame_Receipt
}

// enqueueEnvelopes encodes envs contiguously into the lane, or none of them.
func (l *lane) enqueueEnvelopes(envs []*pb.Envelope) error {
	c := l.c
	k := int64(len(envs))
	limit := int64(c.t.cfg.SendQueueSize)
	for {
		cur := c.queued.Load()
		if cur+k > limit {
			return fmt.Errorf("%w: %d envelopes queued for %s", ErrQueueFull, cur, c.peer.Name)
		}
		if c.queued.CompareAndSwap(cur, cur+k) {
			break
		}
	}
	l.mu.Lock()
	if l.finished != nil || c.isClosedFast() {
		l.mu.Unlock()
		c.queued.Add(-k)
		return fmt.Errorf("%w: connection to %s closed", ErrConnLost, c.peer.Name)
	}
	start := len(l.buf)
	l.frame.Kind = &l.envKind
	for _, env := range envs {
		l.envKind.Envelope = env
		err := l.appendLocked()
		if err != nil {
			l.buf = l.buf[:start]
			l.envKind.Envelope = nil
			l.mu.Unlock()
			c.queued.Add(-k)
			return fmt.Errorf("envelope %q: %w", env.GetMsgId(), err)
		}
	}
	l.envKind.Envelope = nil // do not keep the caller's envelope alive
	l.n += len(envs)
	l.mu.Unlock()
	l.signal()
	return nil
}

// enqueueReceipt queues a receipt on the control lane; it never blocks.
func (l *lane) enqueueReceipt(rc *pb.Receipt) error {
	l.mu.Lock()
	if l.finished != nil || l.c.isClosedFast() {
		l.mu.Unlock()
		return fmt.Errorf("%w: connection to %s closed", ErrConnLost, l.c.peer.Name)
	}
	if l.n >= l.c.t.cfg.SendQueueSize {
		l.mu.Unlock()
		return fmt.Errorf("%w: %d receipts queued for %s", ErrQueueFull, l.n, l.c.peer.Name)
	}
	l.rcKind.Receipt = rc
	l.frame.Kind = &l.rcKind
	err := l.appendLocked()
	l.rcKind.Receipt = nil
	if err == nil {
		l.n++
	}
	l.mu.Unlock()
	if err != nil {
		return err
	}
	l.signal()
	return nil
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
	l.frame.Kind = &pb.Frame_Goaway{Goaway: g}
	if err := l.appendLocked(); err == nil {
		l.n++
	}
	l.signal()
	return l.finished
}

// appendLocked encodes l.frame into buf. l.mu must be held.
func (l *lane) appendLocked() error {
	size := proto.Size(&l.frame)
	if size > l.c.t.cfg.MaxFrameSize {
		return fmt.Errorf("%w: %d bytes, limit %d", ErrFrameTooLarge, size, l.c.t.cfg.MaxFrameSize)
	}
	var err error
	l.buf, err = appendFrameSized(l.buf, &l.frame, size)
	return err
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
	var spare []byte
	for {
		select {
		case <-l.wake:
		case <-c.done:
			l.closeFinished()
			return
		}
		l.mu.Lock()
		out, n, fin := l.buf, l.n, l.finished
		l.buf, l.n = spare[:0], 0
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
			if _, err := l.stream.Write(out); err != nil {
				l.closeFinished()
				c.lost(err)
				return
			}
			if !l.control {
				c.queued.Add(-int64(n))
			}
			c.stats.framesOut.Add(uint64(n))
			c.stats.bytesOut.Add(uint64(len(out)))
		}
		if cap(out) > keepBufCap {
			out = nil
		}
		spare = out
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
