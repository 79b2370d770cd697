package mesh

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/memberlist"
)

// bindAttempts bounds the retries of a port-0 bind whose UDP half collided.
// Each collision needs another process or node to take the very port the
// kernel just gave us over TCP, so a handful of tries is plenty.
const bindAttempts = 16

// readBufSize is what one UDP read may return: the largest datagram.
const readBufSize = 65536

// netTransport is meshnode's memberlist.NodeAwareTransport over real sockets:
// one TCP listener and one UDP socket on the same port. It differs from
// memberlist's NetTransport in three ways that matter at fleet size and
// under attack:
//
//   - A port-0 bind cannot fail because another socket already holds the UDP
//     port the kernel picked for TCP: the pair is retried on EADDRINUSE.
//   - A UDP read reuses one 64 KiB buffer and copies out only the bytes
//     received, instead of pinning a fresh 64 KiB per packet; datagrams
//     larger than maxPacket are dropped unread, before memberlist spends a
//     decryption on them.
//   - It hands accepted streams to its channel unbuffered, so a full
//     streamGuard leaves further connections in the kernel's accept queue.
//
// Packets are best-effort and streams reliable, as memberlist.Transport
// promises.
type netTransport struct {
	tcp       *net.TCPListener
	udp       *net.UDPConn
	maxPacket int
	log       *slog.Logger

	packets chan *memberlist.Packet
	streams chan net.Conn
	done    chan struct{}
	wg      sync.WaitGroup // the two listener goroutines

	closeOnce sync.Once
	// dropped counts datagrams larger than maxPacket.
	dropped atomic.Uint64
	// sent and received count gossip bytes, datagrams and streams alike.
	sent, received atomic.Uint64
}

// countedConn counts a gossip stream's bytes into its transport's totals.
type countedConn struct {
	net.Conn
	t *netTransport
}

func (c countedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.t.received.Add(uint64(n))
	return n, err
}

func (c countedConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.t.sent.Add(uint64(n))
	return n, err
}

var _ memberlist.NodeAwareTransport = (*netTransport)(nil)

// newNetTransport binds host:port over TCP and UDP. With port 0 both get the
// same kernel-chosen port; a collision on the UDP side is retried.
func newNetTransport(host string, port, maxPacket int, log *slog.Logger) (*netTransport, error) {
	ip := net.ParseIP(host)
	var lastErr error
	for range bindAttempts {
		tcp, udp, err := bindPair(ip, port)
		if err == nil {
			t := &netTransport{
				tcp: tcp, udp: udp, maxPacket: maxPacket, log: log,
				packets: make(chan *memberlist.Packet),
				streams: make(chan net.Conn),
				done:    make(chan struct{}),
			}
			t.wg.Add(2)
			go t.acceptLoop()
			go t.readLoop()
			return t, nil
		}
		lastErr = err
		if port != 0 || !errors.Is(err, syscall.EADDRINUSE) {
			break // a fixed port in use is the operator's problem, not a race
		}
	}
	return nil, lastErr
}

// bindPair listens on TCP, then on UDP with the port TCP got.
func bindPair(ip net.IP, port int) (*net.TCPListener, *net.UDPConn, error) {
	tcp, err := net.ListenTCP("tcp", &net.TCPAddr{IP: ip, Port: port})
	if err != nil {
		return nil, nil, fmt.Errorf("tcp: %w", err)
	}
	port = tcp.Addr().(*net.TCPAddr).Port
	udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: ip, Port: port})
	if err != nil {
		_ = tcp.Close()
		return nil, nil, fmt.Errorf("udp port %d: %w", port, err)
	}
	// A large receive buffer rides out bursts (a join wave, a GC pause);
	// the kernel caps it at net.core.rmem_max, which is not an error.
	for size := 2 << 20; size > 0; size /= 2 {
		if udp.SetReadBuffer(size) == nil {
			break
		}
	}
	return tcp, udp, nil
}

// port returns the bound port (the same for TCP and UDP).
func (t *netTransport) port() int { return t.tcp.Addr().(*net.TCPAddr).Port }

// FinalAdvertiseAddr returns ip:port when given, else the bound address; a
// socket bound to an unspecified address advertises the first private
// unicast address of the host.
func (t *netTransport) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	if port == 0 {
		port = t.port()
	}
	if ip != "" {
		parsed := net.ParseIP(ip)
		if parsed == nil {
			return nil, 0, fmt.Errorf("mesh: advertise address %q is not an IP", ip)
		}
		if v4 := parsed.To4(); v4 != nil {
			parsed = v4
		}
		return parsed, port, nil
	}
	bound := t.tcp.Addr().(*net.TCPAddr).IP
	if !bound.IsUnspecified() {
		if v4 := bound.To4(); v4 != nil {
			bound = v4
		}
		return bound, port, nil
	}
	priv, err := privateIP()
	if err != nil {
		return nil, 0, err
	}
	return priv, port, nil
}

// privateIP is the first private unicast IPv4 address of the host, which is
// what a node bound to 0.0.0.0 without AdvertiseAddr tells its peers.
func privateIP() (net.IP, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("mesh: advertise address: %w", err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.IsPrivate() {
			if v4 := n.IP.To4(); v4 != nil {
				return v4, nil
			}
		}
	}
	return nil, fmt.Errorf("mesh: bound to an unspecified address and the host has no private IPv4 address: %w (set AdvertiseAddr)", ErrBadConfig)
}

func (t *netTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return time.Time{}, err
	}
	n, err := t.udp.WriteTo(b, ua)
	t.sent.Add(uint64(n))
	return time.Now(), err
}

func (t *netTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	return t.WriteTo(b, a.Addr)
}

func (t *netTransport) PacketCh() <-chan *memberlist.Packet { return t.packets }

func (t *netTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	return countedConn{Conn: c, t: t}, nil
}

func (t *netTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	return t.DialTimeout(a.Addr, timeout)
}

func (t *netTransport) StreamCh() <-chan net.Conn { return t.streams }

// Shutdown closes both sockets and waits for the listener goroutines.
// Idempotent.
func (t *netTransport) Shutdown() error {
	t.closeOnce.Do(func() {
		close(t.done)
		_ = t.tcp.Close()
		_ = t.udp.Close()
	})
	t.wg.Wait()
	return nil
}

// acceptLoop hands accepted connections to StreamCh; it blocks while nobody
// takes them, which is how a full streamGuard pushes back.
func (t *netTransport) acceptLoop() {
	defer t.wg.Done()
	delay := 5 * time.Millisecond
	for {
		c, err := t.tcp.Accept()
		if err != nil {
			select {
			case <-t.done:
				return
			default:
			}
			// Out of descriptors, most likely: back off instead of spinning.
			t.log.Warn("mesh: gossip accept failed", "err", err)
			select {
			case <-t.done:
				return
			case <-time.After(delay):
			}
			delay = min(2*delay, time.Second)
			continue
		}
		delay = 5 * time.Millisecond
		select {
		case t.streams <- countedConn{Conn: c, t: t}:
		case <-t.done:
			_ = c.Close()
			return
		}
	}
}

// readLoop reads datagrams into one reused buffer and passes a right-sized
// copy of each to PacketCh.
func (t *netTransport) readLoop() {
	defer t.wg.Done()
	buf := make([]byte, readBufSize)
	for {
		n, from, err := t.udp.ReadFrom(buf)
		ts := time.Now()
		if err != nil {
			select {
			case <-t.done:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue // e.g. an ICMP error reported on the socket
		}
		if n < 1 {
			continue
		}
		t.received.Add(uint64(n))
		if n > t.maxPacket {
			t.dropped.Add(1)
			continue
		}
		p := &memberlist.Packet{Buf: append([]byte(nil), buf[:n]...), From: from, Timestamp: ts}
		select {
		case t.packets <- p:
		case <-t.done:
			return
		}
	}
}
