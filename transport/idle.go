package transport

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/quic-go/quic-go"
)

// Idle connections. A fleet member talks to a few peers often and to most
// rarely; every open connection costs a keep-alive PING per
// KeepAlivePeriod both ways, its stream buffers and its goroutines. So a
// connection that carried no frame in either direction for
// IdleConnTimeout (QUIC's own PINGs do not count) is closed, and the next
// send to that peer dials again, as after any lost connection.
//
// The closing side takes the connection out of its table first (a send
// from then on dials a new one), then sends GoAway with CodeIdle as the
// last frame of its control stream and closes. A connection is never
// closed while a request waits for a receipt on it or envelopes are
// queued on it. What can still meet the close is a frame the peer wrote in
// the same instant: a reliable message then comes back as a lost
// connection and is sent again (not charged), an Ask fails with
// ErrConnLost, and a Tell, which promises nothing, may be lost, as with
// any connection that ends. The side that owes a receipt does not know it
// is owed: a handler that runs longer than IdleConnTimeout with nothing
// else on the connection (the node's HandlerTimeout, 30 s, is far below
// the default 2 min) loses its receipt with the connection, and the
// message is sent again and answered DUPLICATE.

// idleCheckEvery is how often, as a fraction of IdleConnTimeout, the
// connections are looked at: a connection is closed between 1 and 1.25
// IdleConnTimeout after its last frame.
const idleCheckEvery = 4

// idleWatch notes, for one peer, the frame count its connection had when
// it was last seen to change.
type idleWatch struct {
	c      *conn     // the connection watched; another one restarts the watch
	frames uint64    // framesIn + framesOut when last changed
	since  time.Time // when they last changed
}

// closeIdleLoop runs while the transport is open when IdleConnTimeout > 0.
func (t *Transport) closeIdleLoop() {
	defer t.wg.Done()
	tick := time.NewTicker(max(t.cfg.IdleConnTimeout/idleCheckEvery, time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-t.ctx.Done():
			return
		case now := <-tick.C:
			for _, c := range t.idleConns(now) {
				t.wg.Add(1)
				go t.closeIdle(c)
			}
		}
	}
}

// idleConns returns the connections idle for IdleConnTimeout at now, taken
// out of the peer table.
func (t *Transport) idleConns(now time.Time) []*conn {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	var out []*conn
	for _, p := range t.peers {
		c := p.conn
		if c == nil {
			p.idle = idleWatch{}
			continue
		}
		frames := p.framesIn.Load() + p.framesOut.Load()
		if p.idle.c != c || p.idle.frames != frames {
			p.idle = idleWatch{c: c, frames: frames, since: now}
			continue
		}
		if now.Sub(p.idle.since) < t.cfg.IdleConnTimeout || c.queued.Load() > 0 || c.waiting() > 0 {
			continue
		}
		p.setConn(nil) // sends from now on dial a new connection
		c.idle.Store(true)
		p.idle = idleWatch{}
		out = append(out, c)
	}
	return out
}

// closeIdle says GoAway (CodeIdle) and closes c.
func (t *Transport) closeIdle(c *conn) {
	defer t.wg.Done()
	t.log.Debug("closing idle connection", "peer", c.peer.Name, "idle_for", t.cfg.IdleConnTimeout)
	t.idleClosed.Add(1)
	wait, stop := context.WithTimeout(t.ctx, goAwayWait)
	select {
	case <-c.lanes[len(c.lanes)-1].finish(&pb.GoAway{Code: uint32(CodeIdle), Reason: "idle"}):
	case <-wait.Done():
	}
	stop()
	c.shutdown(CodeIdle, "idle", fmt.Errorf("%w: closed after %v without a frame", ErrConnLost, t.cfg.IdleConnTimeout))
}

// IdleClosed is the number of connections this transport closed because
// they carried nothing for IdleConnTimeout.
func (t *Transport) IdleClosed() uint64 { return t.idleClosed.Load() }

// closedIdle reports whether err is the peer closing the connection for
// idleness (a *CloseError, or quic-go's error before the connection's
// cause is set).
func closedIdle(err error) bool {
	if ce := (*CloseError)(nil); errors.As(err, &ce) {
		return ce.Remote && ce.Code == CodeIdle
	}
	ae := (*quic.ApplicationError)(nil)
	return errors.As(err, &ae) && ae.Remote && ae.ErrorCode == CodeIdle
}

// waiting is the number of requests waiting for a receipt on c.
func (c *conn) waiting() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.waiters)
}
