package transport_test

import (
	"errors"
	"net"
	"testing"
	"time"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
)

// RequestBatch to a peer whose handshake times out fails after one dial,
// as a Send does (it learns the peer's frame limit from the connection it
// then uses, and does not dial again when that failed).
func TestRequestBatchToAnUnreachablePeerDialsOnce(t *testing.T) {
	ca := newCA(t)
	r := newResolver()
	cfg := testConfig(t, ca, "a")
	const hs = 400 * time.Millisecond
	cfg.HandshakeTimeout = hs
	a := startNode(t, cfg, r, &recorder{})
	// A UDP socket that never answers: every handshake to it times out.
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	r.Set("ghost", pc.LocalAddr().String())

	start := time.Now()
	if err := a.Send(ctxT(t, 10*time.Second), "ghost", envTo(t, "x@ghost", pb.Envelope_RECEIPT_NONE)); err == nil {
		t.Fatal("Send to ghost succeeded")
	}
	send := time.Since(start)

	start = time.Now()
	if _, err := a.RequestBatch(ctxT(t, 10*time.Second), "ghost", []*pb.Envelope{envTo(t, "x@ghost", pb.Envelope_RECEIPT_PROCESSED)}); err == nil {
		t.Fatal("RequestBatch to ghost succeeded")
	}
	batch := time.Since(start)
	t.Logf("Send failed after %v, RequestBatch after %v (HandshakeTimeout %v)", send, batch, hs)
	if batch > send+hs/2 {
		t.Fatalf("RequestBatch to an unreachable peer took %v, Send %v: it dialed twice", batch, send)
	}
}

// A peer with 256 KiB frames crashes and is restarted at the same address
// with 2 MiB frames. Until a packet on the old connection draws the new
// process's stateless reset, that old connection is the one to use, and a
// 512 KiB envelope is over the limit the dead process announced: it is
// reported with ErrLimitUnconfirmed (the relay counts an attempt and sends
// it again), never as confirmed too large (poison).
func TestPeerRestartedInPlaceLimitIsUnconfirmed(t *testing.T) {
	ca, r := newCA(t), newResolver()
	big := testConfig(t, ca, "big")
	big.MaxFrameSize, big.MaxReadBytes = 2<<20, 16<<20
	big.KeepAlivePeriod, big.MaxIdleTimeout = 2*time.Second, 10*time.Second
	a := startNode(t, big, r, &recorder{})
	hole := &blackhole{}
	small := testConfig(t, ca, "peer")
	small.MaxFrameSize = 256 << 10
	small.WrapPacketConn = func(pc net.PacketConn) net.PacketConn { hole.PacketConn = pc; return hole }
	old := startNode(t, small, r, &recorder{})
	if _, err := a.Request(ctxT(t, 10*time.Second), "peer", envTo(t, "x@peer", pb.Envelope_RECEIPT_PROCESSED)); err != nil {
		t.Fatal(err)
	}
	addr := old.LocalAddr().String()
	hole.drop.Store(true) // it crashes: not a packet more, not even its CONNECTION_CLOSE
	_ = old.Close()
	larger := testConfig(t, ca, "peer")
	larger.ListenAddr = addr
	larger.DataDir = small.DataDir // the same node, the same reset key
	larger.MaxFrameSize, larger.MaxReadBytes, larger.BootID = 2<<20, 16<<20, "restarted"
	startNode(t, larger, r, &recorder{})
	env := withBody(t, envTo(t, "x@peer", pb.Envelope_RECEIPT_PROCESSED), 512<<10)
	rcs, err := a.RequestBatch(ctxT(t, 10*time.Second), "peer", []*pb.Envelope{env})
	var ee *transport.EncodeError
	if errors.As(err, &ee) && !errors.Is(ee.Errs[0], transport.ErrLimitUnconfirmed) {
		t.Fatalf("RequestBatch to the peer restarted in place with 2 MiB frames reports the 512 KiB envelope confirmed too large (the relay's poison): %v", err)
	}
	t.Logf("RequestBatch = %v, %v (a connection error or an unconfirmed limit is fine: the relay sends it again)", rcs, err)
}
