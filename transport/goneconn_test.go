package transport_test

import (
	"net"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
)

// Both ends of a connection derive the same id from its TLS handshake, and
// a new connection has another.
func TestConnectionIDSameAtBothEnds(t *testing.T) {
	ca := newCA(t)
	r := newResolver()
	a := startNode(t, testConfig(t, ca, "a"), r, &recorder{})
	b := startNode(t, testConfig(t, ca, "b"), r, &recorder{})
	ctx := ctxT(t, 10*time.Second)
	if _, err := a.Request(ctx, "b", envTo(t, "x@b", pb.Envelope_RECEIPT_PROCESSED)); err != nil {
		t.Fatal(err)
	}
	first := transport.ConnID(a.Transport, "b")
	testutil.WaitFor(t, 5*time.Second, "b registers the connection", func() bool { return transport.ConnID(b.Transport, "a") != 0 })
	if first == 0 || transport.ConnID(b.Transport, "a") != first {
		t.Fatalf("connection id %#x at a, %#x at b: want the same, not 0", first, transport.ConnID(b.Transport, "a"))
	}
	a.ClosePeer("b", "test says so")
	if _, err := a.Request(ctx, "b", envTo(t, "x@b", pb.Envelope_RECEIPT_PROCESSED)); err != nil {
		t.Fatal(err)
	}
	if second := transport.ConnID(a.Transport, "b"); second == 0 || second == first {
		t.Fatalf("the new connection's id is %#x, the old one's %#x: want another, not 0", second, first)
	}
}

// TestDialAfterLostClose: a (the smaller name) dialed the connection; b
// closed it while its packets were dropped both ways (membership declared
// a dead in a partition), so a still holds it as live when the partition
// ends and b dials a at once. b's Hello names the connection as gone, so
// a takes b's dial instead of keeping its own by the simultaneous-dial
// tie-break, which would leave b waiting for a connection it closed.
func TestDialAfterLostClose(t *testing.T) {
	ca := newCA(t)
	r := newResolver()
	cfgA := testConfig(t, ca, "a")
	// a sends nothing on its connection on its own during the test: a
	// keep-alive reaching b would draw b's close (or a stateless reset)
	// and end the connection before b dials, hiding what is tested.
	cfgA.KeepAlivePeriod = 20 * time.Second
	cfgA.MaxIdleTimeout = 30 * time.Second
	a := startNode(t, cfgA, r, &recorder{})
	hole := &blackhole{}
	cfgB := testConfig(t, ca, "b")
	cfgB.WrapPacketConn = func(pc net.PacketConn) net.PacketConn { hole.PacketConn = pc; return hole }
	b := startNode(t, cfgB, r, &recorder{})
	ctx := ctxT(t, 10*time.Second)
	if _, err := a.Request(ctx, "b", envTo(t, "x@b", pb.Envelope_RECEIPT_PROCESSED)); err != nil {
		t.Fatal(err)
	}
	old := transport.ConnID(a.Transport, "b")
	hole.drop.Store(true)
	b.ClosePeer("a", "peer dead") // its CONNECTION_CLOSE is lost
	hole.drop.Store(false)
	if _, err := b.Request(ctx, "a", envTo(t, "x@a", pb.Envelope_RECEIPT_PROCESSED)); err != nil {
		t.Fatalf("b cannot reach a after the partition: %v", err)
	}
	id := transport.ConnID(b.Transport, "a")
	testutil.WaitFor(t, 5*time.Second, "a holds b's connection", func() bool { return transport.ConnID(a.Transport, "b") == id })
	if id == old {
		t.Fatalf("b reached a on the connection it closed (%#x)", old)
	}
	if _, dialed := transport.ConnInfo(a.Transport, "b"); dialed {
		t.Fatal("a kept a connection it dialed: want b's")
	}
}
