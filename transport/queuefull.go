package transport

import (
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"
)

// A send queue that is full refuses at once (ErrQueueFull) and says when
// to come back. Two things keep senders that retry against it from
// starving the connection that drains it: a refusal costs no encoding
// (enqueueEnvelopes compares sizes before it encodes, and Admit lets a
// caller check before it even marshals the body), and its RetryAfter is
// the time the connection needs to write the excess (longer while nothing
// gets written), so a caller that follows it does not come back a
// thousand times a second.

// Rate limits of RetryAfter.
const (
	minRetry     = time.Millisecond
	maxRetry     = time.Second
	unknownRetry = 5 * time.Millisecond // before the connection has measured its rate
)

// full returns the QueueFullError of a refusal: the queue held queued
// (unit), and excess bytes must be written before the send would fit. The
// wait is the excess at the measured rate, and at least as long as no
// lane has finished a write: a peer that stopped reading stalls every
// write, and its senders are told to come back later the longer it lasts.
func (c *conn) full(queued int64, unit string, excess int64) *QueueFullError {
	ra := unknownRetry
	if rate := c.wrate.Load(); rate > 0 {
		// In float: excess * time.Second overflows int64 above ~9 GB.
		ra = retryWithin(float64(max(excess, 0)) / float64(rate) * float64(time.Second))
	}
	if p := c.progress.Load(); p > 0 {
		ra = max(ra, min(time.Duration(time.Now().UnixNano()-p), maxRetry))
	}
	return &QueueFullError{Peer: c.peer.Name, Queued: queued, Unit: unit, RetryAfter: ra}
}

// retryWithin clamps ns nanoseconds to [minRetry, maxRetry].
func retryWithin(ns float64) time.Duration {
	switch {
	case ns >= float64(maxRetry):
		return maxRetry
	case ns <= float64(minRetry):
		return minRetry
	}
	return time.Duration(ns)
}

// perEnvelope is the mean encoded size of the queued envelopes (at least
// one byte): what the count bound's excess is worth in bytes.
func (c *conn) perEnvelope() int64 {
	if n := c.queued.Load(); n > 0 {
		return max(c.qbytes.Load()/n, 1)
	}
	return 1
}

// noteQueue keeps c.crowded, and the transport's count of crowded
// connections, in step with the queue's bytes: crowded when a frame of
// MaxFrameSize might no longer fit. A stale value for a moment costs
// Admit a lookup or a marshal, never a wrong refusal (the bound itself is
// checked in enqueueEnvelopes).
func (c *conn) noteQueue() {
	want := c.qbytes.Load() > int64(c.t.cfg.SendQueueBytes-c.t.cfg.MaxFrameSize)
	if c.crowded.Load() == want || !c.crowded.CompareAndSwap(!want, want) {
		return
	}
	if !want {
		c.t.crowded.Add(-1)
		return
	}
	c.t.crowded.Add(1)
	select {
	case <-c.done:
		c.uncrowd() // shutdown may have uncrowded before the swap above
	default:
	}
}

// uncrowd drops c from the transport's count when it closes.
func (c *conn) uncrowd() {
	if c.crowded.CompareAndSwap(true, false) {
		c.t.crowded.Add(-1)
	}
}

// noteRate folds a lane's write of n bytes that took d into the
// connection's write rate (bytes/s, a moving average). Only writes of at
// least a chunk count: a smaller one returns as soon as QUIC has copied
// it and says nothing of the rate. Lanes writing at once share the
// connection, so a lane's rate is multiplied by how many were writing.
func (c *conn) noteRate(n int, d time.Duration, writers int32) {
	if n < chunkSize || d <= 0 {
		return
	}
	// In float: n * writers * time.Second overflows int64 for a batch of
	// a few GiB (MaxFrameSize may be 1 GiB).
	sample := int64(min(float64(n)*float64(max(writers, 1))/d.Seconds(), 1<<62))
	for {
		old := c.wrate.Load()
		next := sample
		if old > 0 {
			next = old + (sample-old)/4
		}
		if c.wrate.CompareAndSwap(old, max(next, 1)) {
			return
		}
	}
}

// Admit refuses, as Send would, a message whose body alone no longer fits
// node's send queue, without encoding anything: a caller that retries
// against a full queue of large messages checks before it marshals them.
// It never dials and costs one atomic load unless some connection's queue
// is within MaxFrameSize of its byte bound. nil means Send may still
// refuse (the envelope is larger than its body); an error wraps
// ErrQueueFull and is a *QueueFullError. A body too large for any frame,
// and a connection Send would replace (the peer moved), are left to Send,
// which says so.
func (t *Transport) Admit(node string, body proto.Message) error {
	if t.crowded.Load() == 0 {
		return nil
	}
	var c *conn
	t.mu.Lock()
	if p := t.peers[node]; p != nil {
		c = p.conn
	}
	t.mu.Unlock()
	if c == nil || !c.crowded.Load() {
		return nil
	}
	size := int64(proto.Size(body))
	cur, limit := c.qbytes.Load(), int64(t.cfg.SendQueueBytes)
	if cur == 0 || cur+size <= limit || size > int64(t.cfg.MaxFrameSize) {
		return nil
	}
	if addr, err := t.r.Resolve(node); err != nil || c.staleFor(addr) {
		return nil
	}
	return fmt.Errorf("transport: send to %s: %w", node, c.full(cur, "bytes", cur+size-limit))
}
