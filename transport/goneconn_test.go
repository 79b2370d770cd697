package transport_test

import (
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
