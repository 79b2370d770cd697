package mesh

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// pipeTransport is an inner transport whose inbound streams are the server
// ends of net.Pipe pairs; the test keeps the client ends.
type pipeTransport struct {
	memberlist.NodeAwareTransport // nil: only StreamCh and Shutdown are used
	streams                       chan net.Conn
}

func (p *pipeTransport) StreamCh() <-chan net.Conn { return p.streams }
func (p *pipeTransport) Shutdown() error           { return nil }

// connect offers one inbound stream and returns the client end. The offer
// blocks while the guard has no free slot, as the kernel's accept queue
// would hold the connection.
func (p *pipeTransport) connect(tb testing.TB, timeout time.Duration) (net.Conn, bool) {
	tb.Helper()
	client, server := net.Pipe()
	select {
	case p.streams <- server:
		return client, true
	case <-time.After(timeout):
		_ = client.Close()
		_ = server.Close()
		return nil, false
	}
}

func newGuardForTest(tb testing.TB, limits streamLimits) (*streamGuard, *pipeTransport) {
	tb.Helper()
	inner := &pipeTransport{streams: make(chan net.Conn)}
	g := newStreamGuard(inner, limits)
	tb.Cleanup(func() { _ = g.Shutdown() })
	return g, inner
}

func TestStreamGuardConcurrency(t *testing.T) {
	g, inner := newGuardForTest(t, streamLimits{streams: 2, bytes: 1 << 10, timeout: 10 * time.Second, rate: 1 << 30})
	var held []net.Conn
	for range 2 {
		if _, ok := inner.connect(t, time.Second); !ok {
			t.Fatal("a stream within the limit was not taken")
		}
		held = append(held, <-g.StreamCh())
	}
	// The third waits: the guard does not take it from the inner transport.
	if _, ok := inner.connect(t, 100*time.Millisecond); ok {
		t.Fatal("a third stream was taken while two were open (limit 2)")
	}
	// Closing one frees its slot, once: a double Close frees nothing more.
	_ = held[0].Close()
	_ = held[0].Close()
	if _, ok := inner.connect(t, time.Second); !ok {
		t.Fatal("no stream taken after a slot was freed")
	}
	held[0] = <-g.StreamCh()
	if _, ok := inner.connect(t, 100*time.Millisecond); ok {
		t.Fatal("a double Close freed two slots")
	}
	for _, c := range held {
		_ = c.Close()
	}
	if got := g.stats().Streams; got != 3 {
		t.Fatalf("Streams = %d, want 3", got)
	}
}

func TestStreamGuardByteLimit(t *testing.T) {
	g, inner := newGuardForTest(t, streamLimits{streams: 1, bytes: 100, timeout: 10 * time.Second, rate: 1 << 30})
	client, ok := inner.connect(t, time.Second)
	if !ok {
		t.Fatal("stream not taken")
	}
	defer client.Close()
	s := <-g.StreamCh()
	defer s.Close()
	go func() { _, _ = client.Write(make([]byte, 1000)) }()
	n, err := io.Copy(io.Discard, s)
	if n != 100 || !errors.Is(err, errStreamTooLarge) {
		t.Fatalf("read %d bytes, err %v; want exactly 100 then errStreamTooLarge", n, err)
	}
	if got := g.stats().StreamsTooLarge; got != 1 {
		t.Fatalf("StreamsTooLarge = %d, want 1", got)
	}
}

func TestStreamGuardDeadlineCannotBeExtended(t *testing.T) {
	const limit = 150 * time.Millisecond
	g, inner := newGuardForTest(t, streamLimits{streams: 1, bytes: 1 << 20, timeout: limit, rate: 1 << 30})
	client, ok := inner.connect(t, time.Second)
	if !ok {
		t.Fatal("stream not taken")
	}
	defer client.Close()
	s := <-g.StreamCh()
	defer s.Close()
	// memberlist asks for a later deadline, and for none at all: both are
	// clamped to accept + limit, so a silent peer is cut after limit.
	_ = s.SetDeadline(time.Now().Add(time.Hour))
	_ = s.SetReadDeadline(time.Time{})
	start := time.Now()
	_, err := s.Read(make([]byte, 1))
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read from a silent peer: %v, want a timeout", err)
	}
	if el := time.Since(start); el > 5*limit {
		t.Fatalf("silent peer held the stream %v, limit %v", el, limit)
	}
	if got := g.stats().StreamsTimedOut; got != 1 {
		t.Fatalf("StreamsTimedOut = %d, want 1", got)
	}
	// A shorter deadline is honoured.
	_ = s.SetReadDeadline(time.Now().Add(-time.Second))
	if _, err := s.Read(make([]byte, 1)); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read past a shorter deadline: %v", err)
	}
}

func TestStreamGuardShutdownClosesPending(t *testing.T) {
	inner := &pipeTransport{streams: make(chan net.Conn)}
	g := newStreamGuard(inner, streamLimits{streams: 1, bytes: 10, timeout: time.Second, rate: 1 << 30})
	client, ok := inner.connect(t, time.Second)
	if !ok {
		t.Fatal("stream not taken")
	}
	defer client.Close()
	// Nobody reads StreamCh: Shutdown must not hang on the hand-over, and
	// the stream it could not hand over is closed.
	done := make(chan struct{})
	go func() { _ = g.Shutdown(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown hung with a stream nobody took")
	}
	_ = client.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := client.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrClosedPipe) {
		t.Fatalf("pending stream after Shutdown: read err %v, want closed", err)
	}
}

// TestPortZeroBindAvoidsUDPCollision holds UDP sockets on many ephemeral
// ports (as QUIC endpoints of other nodes do), then binds many gossip
// transports on port 0. memberlist's NetTransport takes the TCP port and
// fails when the same UDP port is taken; ours retries.
func TestPortZeroBindAvoidsUDPCollision(t *testing.T) {
	const held, binds = 1500, 150
	var udps []net.PacketConn
	defer func() {
		for _, u := range udps {
			_ = u.Close()
		}
	}()
	heldPorts := map[int]bool{}
	for range held {
		u, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		udps = append(udps, u)
		heldPorts[u.LocalAddr().(*net.UDPAddr).Port] = true
	}
	var (
		mu  sync.Mutex
		trs []*netTransport
	)
	defer func() {
		for _, tr := range trs {
			_ = tr.Shutdown()
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, binds)
	for range binds {
		wg.Go(func() {
			tr, err := newNetTransport("127.0.0.1", 0, 8<<10, discardLogger())
			if err != nil {
				errs <- err
				return
			}
			mu.Lock()
			trs = append(trs, tr)
			mu.Unlock()
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("port-0 bind failed: %v", err)
	}
	for _, tr := range trs {
		if heldPorts[tr.port()] {
			t.Errorf("transport on port %d, which another socket holds over UDP", tr.port())
		}
	}
	// A fixed port in use is not retried: it is an error at once.
	busy := udps[0].LocalAddr().(*net.UDPAddr).Port
	if tr, err := newNetTransport("127.0.0.1", busy, 8<<10, discardLogger()); err == nil {
		_ = tr.Shutdown()
		t.Fatalf("bind on a port held over UDP succeeded")
	} else if !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("bind on a busy port: %v, want EADDRINUSE", err)
	}
}

func TestNetTransportDropsLargePackets(t *testing.T) {
	tr, err := newNetTransport("127.0.0.1", 0, 2048, discardLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Shutdown()
	c, err := net.Dial("udp", tr.udp.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, size := range []int{4096, 60000, 2049} {
		if _, err := c.Write(make([]byte, size)); err != nil {
			t.Fatal(err)
		}
	}
	small := []byte("hello")
	if _, err := c.Write(small); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-tr.PacketCh():
		if string(p.Buf) != "hello" || cap(p.Buf) > 64 {
			t.Fatalf("first packet through = %q (cap %d), want the small one, right-sized", p.Buf, cap(p.Buf))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("small packet never arrived")
	}
	if got := tr.dropped.Load(); got != 3 {
		t.Fatalf("dropped = %d, want 3", got)
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

func TestPreamble(t *testing.T) {
	label := append([]byte{labelMsg, 4}, "test"...)
	for _, tc := range []struct {
		name string
		in   []byte
		want int64
		ok   bool
	}{
		{"encrypted", []byte{encryptMsg, 0, 0, 1, 0, 9, 9}, 256, true},
		{"labelled encrypted", append(append([]byte{}, label...), encryptMsg, 1, 49, 45, 0), 20_000_000, true},
		{"plain push/pull", []byte{6, 1, 2, 3, 4, 5}, 0, false},
		{"labelled plain", append(append([]byte{}, label...), 8, 0, 0, 0, 0), 0, false},
		{"short", []byte{encryptMsg, 0, 0}, 0, false},
		{"empty label", []byte{labelMsg, 0, encryptMsg, 0, 0, 0, 7}, 7, true},
		{"empty", nil, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Any split of the bytes over reads gives the same answer.
			for cut := 0; cut <= len(tc.in); cut++ {
				var p preamble
				got, ok := p.scan(tc.in[:cut])
				if !ok {
					got, ok = p.scan(tc.in[cut:])
				}
				if got != tc.want || ok != tc.ok {
					t.Fatalf("split at %d: scan = %d, %v; want %d, %v", cut, got, ok, tc.want, tc.ok)
				}
			}
		})
	}
}

// FuzzPreamble: arbitrary first bytes of a stream never panic, and the
// answer does not depend on how the bytes were split into reads.
func FuzzPreamble(f *testing.F) {
	f.Add([]byte{labelMsg, 2, 'a', 'b', encryptMsg, 0, 0, 0, 1}, 3)
	f.Add([]byte{encryptMsg, 255, 255, 255, 255}, 1)
	f.Add([]byte{labelMsg, 255}, 0)
	f.Fuzz(func(t *testing.T, b []byte, cut int) {
		var whole preamble
		w, wok := whole.scan(b)
		if cut < 0 || cut > len(b) {
			cut = len(b) / 2
		}
		var split preamble
		s, sok := split.scan(b[:cut])
		if !sok {
			s, sok = split.scan(b[cut:])
		}
		if w != s || wok != sok {
			t.Fatalf("whole = %d,%v; split at %d = %d,%v", w, wok, cut, s, sok)
		}
	})
}

func TestStreamGuardRefusesAnnouncedOversize(t *testing.T) {
	g, inner := newGuardForTest(t, streamLimits{streams: 1, bytes: 1000, timeout: 10 * time.Second, rate: 1 << 30})
	client, ok := inner.connect(t, time.Second)
	if !ok {
		t.Fatal("stream not taken")
	}
	defer client.Close()
	s := <-g.StreamCh()
	defer s.Close()
	go func() {
		_, _ = client.Write([]byte{labelMsg, 1, 'x', encryptMsg, 0, 0, 4, 0}) // announces 1,024 bytes
	}()
	if _, err := s.Read(make([]byte, 4096)); !errors.Is(err, errStreamTooLarge) {
		t.Fatalf("first read of a stream announcing 1,024 bytes (limit 1,000): %v, want errStreamTooLarge", err)
	}
}

func TestByteRate(t *testing.T) {
	r := newByteRate(1000, 500) // 1,000 bytes/s, bursts of 500
	now := time.Unix(100, 0)
	if w := r.reserve(500, now); w > 0 {
		t.Fatalf("first burst waits %v, want 0", w)
	}
	if w := r.reserve(1000, now); w != time.Second {
		t.Fatalf("1,000 bytes past the burst wait %v, want 1s", w)
	}
	// A long idle refills one burst, not more.
	later := now.Add(time.Hour)
	if w := r.reserve(500, later); w > 0 {
		t.Fatalf("burst after idle waits %v, want 0", w)
	}
	if w := r.reserve(100, later); w != 100*time.Millisecond {
		t.Fatalf("past the refilled burst: wait %v, want 100ms", w)
	}
}

func TestStreamGuardRateCutsAtDeadline(t *testing.T) {
	// 1 KiB/s, and others have used the burst: 64 KiB cannot arrive
	// within 200 ms, so the first read ends the stream.
	g, inner := newGuardForTest(t, streamLimits{streams: 1, bytes: 1 << 20, timeout: 200 * time.Millisecond, rate: 1 << 10})
	client, ok := inner.connect(t, time.Second)
	if !ok {
		t.Fatal("stream not taken")
	}
	defer client.Close()
	s := <-g.StreamCh()
	defer s.Close()
	g.rate.reserve(1<<20, time.Now())
	go func() { _, _ = client.Write(make([]byte, 64<<10)) }()
	start := time.Now()
	n, err := io.Copy(io.Discard, s)
	if !errors.Is(err, os.ErrDeadlineExceeded) || n > 32<<10 {
		t.Fatalf("read %d bytes, err %v; want one read then the deadline", n, err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("rate-limited stream held %v", el)
	}
}
