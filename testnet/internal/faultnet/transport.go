package faultnet

import (
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// WrapTransport returns a wrapper for node name's memberlist transport (it
// plugs into mesh.Config.WrapTransport). The transport's advertised address
// is registered under name when it is wrapped.
func (n *Network) WrapTransport(name string) func(memberlist.NodeAwareTransport) memberlist.NodeAwareTransport {
	return func(inner memberlist.NodeAwareTransport) memberlist.NodeAwareTransport {
		if ip, port, err := inner.FinalAdvertiseAddr("", 0); err == nil {
			n.Register(name, net.JoinHostPort(ip.String(), strconv.Itoa(port)))
			if !ip.IsLoopback() {
				// Bound to 0.0.0.0: peers on loopback see it as 127.0.0.1.
				n.Register(name, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
			}
		}
		t := &transport{
			NodeAwareTransport: inner,
			net:                n,
			name:               name,
			packets:            make(chan *memberlist.Packet),
			done:               make(chan struct{}),
		}
		t.wg.Add(1)
		go t.forward()
		return t
	}
}

// transport filters memberlist's packets and streams through the Network.
type transport struct {
	memberlist.NodeAwareTransport
	net  *Network
	name string

	packets chan *memberlist.Packet // what memberlist reads: inner's packets minus the cut ones
	done    chan struct{}
	wg      sync.WaitGroup // forward and delayed writes

	// mu guards the field below.
	mu     sync.Mutex
	closed bool
}

// forward copies inner packets to memberlist, dropping those from a node
// that is cut from this one (for senders that are not wrapped).
func (t *transport) forward() {
	defer t.wg.Done()
	in := t.NodeAwareTransport.PacketCh()
	for {
		select {
		case p := <-in:
			from, _ := t.net.NameOf(p.From.String())
			if from != "" && t.net.Blocked(from, t.name) {
				continue
			}
			select {
			case t.packets <- p:
			case <-t.done:
				return
			}
		case <-t.done:
			return
		}
	}
}

func (t *transport) PacketCh() <-chan *memberlist.Packet { return t.packets }

func (t *transport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

func (t *transport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	to := t.peerName(a)
	drop, delay := t.net.verdict(t.name, to)
	if drop {
		return time.Now(), nil // lost on the wire
	}
	if delay <= 0 {
		return t.NodeAwareTransport.WriteToAddress(b, a)
	}
	buf := append([]byte(nil), b...)
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return time.Time{}, net.ErrClosed
	}
	t.wg.Add(1)
	t.mu.Unlock()
	time.AfterFunc(delay, func() {
		defer t.wg.Done()
		select {
		case <-t.done:
		default:
			_, _ = t.NodeAwareTransport.WriteToAddress(buf, a)
		}
	})
	return time.Now(), nil
}

func (t *transport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

func (t *transport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	to := t.peerName(a)
	if t.net.streamBlocked(t.name, to) {
		return nil, fmt.Errorf("faultnet: dial %s from %s: %w", a.String(), t.name, ErrCut)
	}
	c, err := t.NodeAwareTransport.DialAddressTimeout(a, timeout)
	if err != nil {
		return nil, err
	}
	return &streamConn{Conn: c, net: t.net, a: t.name, b: to}, nil
}

// peerName names the node at a: the address table first, memberlist's
// node name as a fallback.
func (t *transport) peerName(a memberlist.Address) string {
	if name, ok := t.net.NameOf(a.Addr); ok {
		return name
	}
	return a.Name
}

// Shutdown shuts the inner transport down first (memberlist still drains
// its packets meanwhile), then stops forwarding.
func (t *transport) Shutdown() error {
	err := t.NodeAwareTransport.Shutdown()
	t.mu.Lock()
	if !t.closed {
		t.closed = true
		close(t.done)
	}
	t.mu.Unlock()
	t.wg.Wait()
	return err
}

// streamConn fails reads and writes once its two nodes are cut, as a TCP
// connection across a broken link would (after a timeout, here at once).
type streamConn struct {
	net.Conn
	net  *Network
	a, b string
}

func (c *streamConn) Read(p []byte) (int, error) {
	if c.net.streamBlocked(c.a, c.b) {
		_ = c.Close()
		return 0, fmt.Errorf("faultnet: read %s<->%s: %w", c.a, c.b, ErrCut)
	}
	return c.Conn.Read(p)
}

func (c *streamConn) Write(p []byte) (int, error) {
	if c.net.streamBlocked(c.a, c.b) {
		_ = c.Close()
		return 0, fmt.Errorf("faultnet: write %s<->%s: %w", c.a, c.b, ErrCut)
	}
	return c.Conn.Write(p)
}
