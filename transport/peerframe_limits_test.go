package transport_test

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
)

// A receipt whose text (a handler's error) is longer than the frame limit
// its peer announced has the text cut to fit: its verdict arrives, and the
// peer does not close the connection for a frame over its limit.
func TestReceiptTextIsCutToThePeersFrameLimit(t *testing.T) {
	ca, r := newCA(t), newResolver()
	small := testConfig(t, ca, "small")
	small.MaxFrameSize = 4 << 10
	small.MaxReadBytes = 64 << 10
	small.SendQueueBytes = 64 << 10
	a := startNode(t, small, r, &recorder{})
	long := strings.Repeat("handler failed: ", 512) // 8 KiB
	b := startNode(t, testConfig(t, ca, "big"), r, handlerFunc(func(_ transport.PeerInfo, env *pb.Envelope, reply func(*pb.Receipt)) {
		if reply != nil {
			reply(&pb.Receipt{Code: pb.Receipt_TRANSIENT, Message: long})
		}
	}))
	_ = b
	rc, err := a.Request(ctxT(t, 5*time.Second), "big", envTo(t, "x@big", pb.Envelope_RECEIPT_PROCESSED))
	if err != nil || rc.GetCode() != pb.Receipt_TRANSIENT {
		t.Fatalf("Request = %v, %v; want the TRANSIENT receipt (logs of the asker:\n%s)", rc, err, a.logs.String())
	}
	if m := rc.GetMessage(); len(m) == 0 || len(m) >= len(long) || !strings.HasPrefix(long, m) {
		t.Fatalf("receipt text of %d bytes, want a prefix of the %d-byte text", len(m), len(long))
	}
}

// A peer with 256 KiB frames crashes (its host goes silent) and comes back
// at another address with 2 MiB frames, before the connection to the old
// one is closed (the idle timeout): a 512 KiB envelope is checked against
// the connection it takes, the new one, and delivered.
func TestPeerBackElsewhereWithLargerFramesGetsThem(t *testing.T) {
	ca, r := newCA(t), newResolver()
	big := testConfig(t, ca, "big")
	big.MaxFrameSize, big.MaxReadBytes = 2<<20, 16<<20
	a := startNode(t, big, r, &recorder{})
	hole := &blackhole{}
	small := testConfig(t, ca, "peer")
	small.MaxFrameSize = 256 << 10
	small.WrapPacketConn = func(pc net.PacketConn) net.PacketConn { hole.PacketConn = pc; return hole }
	startNode(t, small, r, &recorder{})
	if _, err := a.Request(ctxT(t, 10*time.Second), "peer", envTo(t, "x@peer", pb.Envelope_RECEIPT_PROCESSED)); err != nil {
		t.Fatal(err)
	}
	hole.drop.Store(true) // the old host vanishes
	larger := testConfig(t, ca, "peer")
	larger.MaxFrameSize, larger.MaxReadBytes, larger.BootID = 2<<20, 16<<20, "restarted"
	rec := &recorder{}
	startNode(t, larger, r, rec) // the resolver now gives its new address
	env := withBody(t, envTo(t, "x@peer", pb.Envelope_RECEIPT_PROCESSED), 512<<10)
	rcs, err := a.RequestBatch(ctxT(t, 10*time.Second), "peer", []*pb.Envelope{env})
	if err != nil || rcs[0].GetCode() != pb.Receipt_PROCESSED {
		t.Fatalf("RequestBatch to the restarted peer = %v, %v; want PROCESSED", rcs, err)
	}
}
