package faultnet

import (
	"net"
	"sync"
	"time"
)

// WrapPacketConn returns a wrapper for node name's QUIC socket (it plugs
// into transport.Config.WrapPacketConn). The socket's local address is
// registered under name when it is wrapped.
func (n *Network) WrapPacketConn(name string) func(net.PacketConn) net.PacketConn {
	return func(pc net.PacketConn) net.PacketConn {
		n.Register(name, pc.LocalAddr().String())
		return &packetConn{PacketConn: pc, net: n, name: name, done: make(chan struct{})}
	}
}

// packetConn drops in WriteTo (faults of the link towards the peer) and in
// ReadFrom (so a sender that is not wrapped is still cut), and delays in
// WriteTo. Other methods, deadlines included, pass through.
type packetConn struct {
	net.PacketConn
	net  *Network
	name string

	wg   sync.WaitGroup // delayed writes
	done chan struct{}  // closed by Close: delayed writes are skipped

	// mu guards the field below, so no delayed write is added once Close waits.
	mu     sync.Mutex
	closed bool
}

func (c *packetConn) WriteTo(p []byte, addr net.Addr) (int, error) {
	to, _ := c.net.NameOf(addr.String())
	drop, delay := c.net.verdict(c.name, to)
	if drop {
		return len(p), nil // lost on the wire: the sender cannot tell
	}
	if delay <= 0 {
		return c.PacketConn.WriteTo(p, addr)
	}
	buf := append([]byte(nil), p...)
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return 0, net.ErrClosed
	}
	c.wg.Add(1)
	c.mu.Unlock()
	time.AfterFunc(delay, func() {
		defer c.wg.Done()
		select {
		case <-c.done:
		default:
			_, _ = c.PacketConn.WriteTo(buf, addr)
		}
	})
	return len(p), nil
}

func (c *packetConn) ReadFrom(p []byte) (int, net.Addr, error) {
	for {
		nr, addr, err := c.PacketConn.ReadFrom(p)
		if err != nil {
			return nr, addr, err
		}
		from, _ := c.net.NameOf(addr.String())
		// The sender's wrapper already applied drop and delay; here only a
		// cut matters, for senders that are not wrapped.
		if from != "" && c.net.Blocked(from, c.name) {
			continue
		}
		return nr, addr, nil
	}
}

// Close closes the socket and waits for delayed writes (which are skipped).
func (c *packetConn) Close() error {
	c.mu.Lock()
	if !c.closed {
		c.closed = true
		close(c.done)
	}
	c.mu.Unlock()
	err := c.PacketConn.Close()
	c.wg.Wait()
	return err
}

// SetReadBuffer and SetWriteBuffer pass through, so quic-go can size the
// socket's buffers as it does for a plain *net.UDPConn.
func (c *packetConn) SetReadBuffer(bytes int) error {
	if s, ok := c.PacketConn.(interface{ SetReadBuffer(int) error }); ok {
		return s.SetReadBuffer(bytes)
	}
	return nil
}

func (c *packetConn) SetWriteBuffer(bytes int) error {
	if s, ok := c.PacketConn.(interface{ SetWriteBuffer(int) error }); ok {
		return s.SetWriteBuffer(bytes)
	}
	return nil
}
