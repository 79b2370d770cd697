package transport_test

import (
	"testing"
	"time"

	"github.com/meshnode/meshnode/mailbox/pb"
)

// MinRTT is the shortest round trip QUIC measured to a peer: none before
// a connection, some once a batch went there and came back.
func TestMinRTTOfAConnection(t *testing.T) {
	ca := newCA(t)
	r := newResolver()
	startNode(t, testConfig(t, ca, "b"), r, &recorder{})
	a := startNode(t, testConfig(t, ca, "a"), r, &recorder{})
	if d := a.MinRTT("b"); d != 0 {
		t.Fatalf("MinRTT before any connection: %v, want 0", d)
	}
	if _, err := a.RequestBatch(ctxT(t, 10*time.Second), "b", []*pb.Envelope{envTo(t, "sink@b", pb.Envelope_RECEIPT_PROCESSED)}); err != nil {
		t.Fatal(err)
	}
	if d := a.MinRTT("b"); d <= 0 || d > 10*time.Second {
		t.Fatalf("MinRTT after a round trip: %v", d)
	}
	if d := a.MinRTT("nobody"); d != 0 {
		t.Fatalf("MinRTT of a peer never seen: %v, want 0", d)
	}
}
