package transport_test

import (
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/rawpeer"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
	"github.com/quic-go/quic-go"
)

// What a member with a valid certificate can send on its streams, and
// what it costs the receiver.

func targetOf(n *node) rawpeer.Target {
	return rawpeer.Target{Addr: n.LocalAddr().String(), Name: n.name, Cluster: n.cfg.Cluster}
}

// hostileSetup starts srv (with edit applied) and a good peer already
// connected to it.
func hostileSetup(t *testing.T, edit func(*transport.Config)) (ca *transport.CA, srv, good *node, rec *recorder) {
	t.Helper()
	ca = newCA(t)
	r := newResolver()
	rec = &recorder{}
	cfg := testConfig(t, ca, "srv")
	if edit != nil {
		edit(&cfg)
	}
	srv = startNode(t, cfg, r, rec)
	good = startNode(t, testConfig(t, ca, "good"), r, &recorder{})
	if _, err := good.Request(ctxT(t, 5*time.Second), "srv", envTo(t, "x@srv", pb.Envelope_RECEIPT_ACCEPTED)); err != nil {
		t.Fatal(err)
	}
	return ca, srv, good, rec
}

func assertGoodPeerWorks(t *testing.T, srv, good *node) {
	t.Helper()
	if _, err := good.Request(ctxT(t, 5*time.Second), "srv", envTo(t, "x@srv", pb.Envelope_RECEIPT_ACCEPTED)); err != nil {
		t.Fatalf("good peer: %v", err)
	}
	if ok, _ := transport.ConnInfo(srv.Transport, "good"); !ok {
		t.Fatal("server lost its connection to the good peer")
	}
}

func assertClosedWith(t *testing.T, p *rawpeer.Peer, want quic.ApplicationErrorCode, within time.Duration) {
	t.Helper()
	code, reason, ok := p.Closed(within)
	if !ok {
		t.Fatalf("the server did not close the connection within %v", within)
	}
	if code != want {
		t.Fatalf("closed with code %d (%q), want %d", code, reason, want)
	}
}

// TestTruncatedFrameThenFIN: a frame cut short by the end of its stream is
// a protocol error of the peer, not a lost connection.
func TestTruncatedFrameThenFIN(t *testing.T) {
	ca, srv, good, _ := hostileSetup(t, nil)
	evil := rawpeer.Dial(t, ca, "evil", targetOf(srv))
	s := evil.Lane(t)
	if _, err := s.Write(append(appendUvarint(nil, 100), make([]byte, 10)...)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil { // FIN after 10 of 100 bytes
		t.Fatal(err)
	}
	assertClosedWith(t, evil, transport.CodeProtocol, 5*time.Second)
	assertGoodPeerWorks(t, srv, good)
}

// TestSlowFrameTimesOut: a frame whose first bytes arrived must be
// complete within FrameReadTimeout; a peer that stops in the middle (a
// slowloris holding a buffer) is disconnected.
func TestSlowFrameTimesOut(t *testing.T) {
	ca, srv, good, _ := hostileSetup(t, func(c *transport.Config) { c.FrameReadTimeout = 300 * time.Millisecond })
	for _, tc := range []struct {
		name  string
		bytes []byte
	}{
		{"in the body of a large frame", append(appendUvarint(nil, 1<<20), make([]byte, 100<<10)...)},
		{"in the body of a small frame", append(appendUvarint(nil, 1000), make([]byte, 10)...)},
		{"in the length prefix", []byte{0x80}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			evil := rawpeer.Dial(t, ca, "evil", targetOf(srv))
			if _, err := evil.Lane(t).Write(tc.bytes); err != nil {
				t.Fatal(err)
			}
			assertClosedWith(t, evil, transport.CodeProtocol, 5*time.Second)
			assertGoodPeerWorks(t, srv, good)
		})
	}
}

// TestFramesInProgressBoundedPerConnection: a member opens many streams
// and sends each all but the last byte of a maximal frame. The receiver
// holds at most MaxReadBytes of them (the rest wait, held back by flow
// control), not streams x MaxFrameSize.
func TestFramesInProgressBoundedPerConnection(t *testing.T) {
	const frame, streams = 1 << 20, 40
	ca, srv, good, _ := hostileSetup(t, func(c *transport.Config) {
		c.MaxFrameSize, c.MaxReadBytes, c.SendQueueBytes = frame, 2*frame, 2*frame
	})
	evil := rawpeer.Dial(t, ca, "evil", targetOf(srv))
	before := heapInUse()
	chunk := append(appendUvarint(nil, frame-16), make([]byte, frame-17)...)
	for i := 0; i < streams; i++ {
		s := evil.Lane(t)
		// Writes block once flow control stops; a goroutine per stream.
		go func() { _, _ = s.Write(chunk) }()
	}
	// Let the server take what it will: its budget is full once two
	// frames are in progress.
	testutil.WaitFor(t, 10*time.Second, "two frames in progress", func() bool {
		return transport.ReadBytesInUse(srv.Transport, "evil") >= 2*(frame-16)
	})
	peak := int64(0)
	for i := 0; i < 20; i++ {
		peak = max(peak, transport.ReadBytesInUse(srv.Transport, "evil"))
		runtime.Gosched()
	}
	if peak > 2*frame {
		t.Fatalf("%d bytes of frames in progress, bound %d", peak, 2*frame)
	}
	// Everything in this process (the attacker's own buffers included)
	// grew by far less than streams x frame = 40 MiB.
	if grown := heapInUse() - before; grown > 24<<20 {
		t.Fatalf("heap grew by %d MiB while %d streams each announced %d bytes", grown>>20, streams, frame)
	}
	assertGoodPeerWorks(t, srv, good)
}

// TestHeaderFloodRefused: an envelope whose header map would be several
// times its frame in memory is refused before it is decoded; an honest
// envelope with a few headers passes.
func TestHeaderFloodRefused(t *testing.T) {
	ca, srv, good, rec := hostileSetup(t, nil)
	evil := rawpeer.Dial(t, ca, "evil", targetOf(srv))
	s := evil.Lane(t)
	honest := envTo(t, "x@srv", pb.Envelope_RECEIPT_NONE)
	honest.Headers = map[string]string{"a": "1", "b": "2"}
	evil.Send(t, s, honest)
	testutil.WaitFor(t, 5*time.Second, "honest envelope delivered", func() bool { return rec.count.Load() == 2 })
	flood := envTo(t, "x@srv", pb.Envelope_RECEIPT_NONE)
	flood.Headers = make(map[string]string, 100000)
	for i := range 100000 {
		flood.Headers[string(rune(0x4e00+i%20000))+string(rune('a'+i/20000))] = ""
	}
	evil.Send(t, s, flood)
	assertClosedWith(t, evil, transport.CodeProtocol, 5*time.Second)
	if rec.count.Load() != 2 {
		t.Fatal("the header flood was delivered")
	}
	assertGoodPeerWorks(t, srv, good)
}

func heapInUse() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse)
}

// TestRefusedHandshakesCountedAndLogged: the refusing node counts every
// stranger it turns away (a certificate of another CA, none at all) and
// logs them at WARN, once a minute per address and kind however often
// they try.
func TestRefusedHandshakesCountedAndLogged(t *testing.T) {
	_, srv, good, _ := hostileSetup(t, nil)
	foreign, err := newCA(t).NewIdentity("stranger")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		id   transport.Identity
		want func(transport.Refusals) uint64
	}{
		{"certificate of another CA", foreign, func(r transport.Refusals) uint64 { return r.UnknownCA }},
		{"no certificate", transport.Identity{}, func(r transport.Refusals) uint64 { return r.NoCertificate }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := tc.id
			id.Roots = good.cfg.Identity.Roots // the client trusts the server: only its own side is wrong
			const tries = 5
			for i := 0; i < tries; i++ {
				ctx := ctxT(t, 5*time.Second)
				qc, err := quic.DialAddr(ctx, srv.LocalAddr().String(), rawpeer.ClientTLS(id, "srv"), &quic.Config{HandshakeIdleTimeout: 2 * time.Second})
				if err == nil {
					<-qc.Context().Done() // TLS 1.3: the server's refusal may come after the client finished
					_ = qc.CloseWithError(0, "")
				}
			}
			testutil.WaitFor(t, 5*time.Second, "refusals counted", func() bool { return tc.want(srv.Refusals()) == tries })
			logs := srv.logs.String()
			if lines := strings.Count(logs, "connection refused: "); lines != 1 || !strings.Contains(logs, "peer=127.0.0.1") {
				t.Fatalf("%d WARN lines for %d refusals from one address, want 1 naming it:\n%s", lines, tries, logs)
			}
		})
		srv.logs.Reset()
	}
	assertGoodPeerWorks(t, srv, good)
}

// TestImpostorAtAMembersAddress: membership says n1 is at an address
// where "mallory", with a valid certificate for mallory, now listens. The
// dialer refuses it, counts an identity mismatch and says so, once.
func TestImpostorAtAMembersAddress(t *testing.T) {
	ca := newCA(t)
	r := newResolver()
	a := startNode(t, testConfig(t, ca, "a"), r, &recorder{})
	mallory := startNode(t, testConfig(t, ca, "mallory"), r, &recorder{})
	r.Set("n1", mallory.LocalAddr().String())
	const tries = 4
	for i := 0; i < tries; i++ {
		err := a.Send(ctxT(t, 5*time.Second), "n1", envTo(t, "x@n1", pb.Envelope_RECEIPT_NONE))
		if !errors.Is(err, transport.ErrUnreachable) {
			t.Fatalf("send to n1 at mallory's address: %v, want ErrUnreachable", err)
		}
	}
	if got := a.Refusals().IdentityMismatch; got != tries {
		t.Fatalf("identity mismatches %d, want %d", got, tries)
	}
	logs := a.logs.String()
	if strings.Count(logs, "connection refused: identity mismatch") != 1 || !strings.Contains(logs, "mallory") {
		t.Fatalf("want one WARN naming the certificate's name:\n%s", logs)
	}
}
