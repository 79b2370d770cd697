package transport_test

import (
	"net"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
)

// slowLink paces the datagrams a socket sends to rate bytes a second, as a
// slow radio or WAN link would: QUIC then packs each lane's bytes into the
// packets it may send, and a 64 KiB write takes a long time to return.
type slowLink struct {
	net.PacketConn
	rate float64

	// mu guards next: when the link is free again.
	mu   sync.Mutex
	next time.Time
}

func slowLinkOf(rate float64) func(net.PacketConn) net.PacketConn {
	return func(pc net.PacketConn) net.PacketConn { return &slowLink{PacketConn: pc, rate: rate} }
}

func (s *slowLink) WriteTo(p []byte, addr net.Addr) (int, error) {
	s.mu.Lock()
	now := time.Now()
	if s.next.Before(now) {
		s.next = now
	}
	s.next = s.next.Add(time.Duration(float64(len(p)) / s.rate * float64(time.Second)))
	wait := s.next.Sub(now)
	s.mu.Unlock()
	// The link is busy: this models its speed, it waits for no state.
	time.Sleep(wait)
	return s.PacketConn.WriteTo(p, addr)
}

// overALink is a server and a peer whose datagrams go through a link
// (made from its socket), with the slow-link configuration, and one frame
// of 200 KiB queued on each of the peer's lanes.
type overALink struct {
	good  *node
	rec   *recorder // the server's
	lanes int
	id    uint64 // the connection's
	start time.Time
}

func startOverALink(t *testing.T, link func(net.PacketConn) net.PacketConn) *overALink {
	t.Helper()
	ca := newCA(t)
	r := newResolver()
	o := &overALink{rec: &recorder{}}
	scfg := bulkConfig(t, ca, "srv")
	smallWindows(&scfg)
	startNode(t, scfg, r, o.rec)
	gcfg := bulkConfig(t, ca, "good")
	smallWindows(&gcfg)
	gcfg.WrapPacketConn = link
	o.good = startNode(t, gcfg, r, &recorder{})
	var err error
	for range 5 { // a lossy link may lose the handshake's datagrams too
		if _, err = o.good.Request(ctxT(t, 10*time.Second), "srv", envTo(t, "x@srv", pb.Envelope_RECEIPT_ACCEPTED)); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	o.id = transport.ConnID(o.good.Transport, "srv")
	o.rec.count.Store(0)
	o.lanes = gcfg.Lanes
	payload := largeBody(t, 200<<10)
	for _, name := range oneRecipientPerLane("r", o.lanes) {
		env := envTo(t, name, pb.Envelope_RECEIPT_NONE)
		env.Body = payload
		if err := o.good.Send(ctxT(t, 10*time.Second), "srv", env); err != nil {
			t.Fatalf("send %s: %v", name, err)
		}
	}
	o.start = time.Now()
	return o
}

// waitAll waits for every lane's frame, on the connection they were
// queued on; note says more of the link when it fails.
func (o *overALink) waitAll(t *testing.T, what string, note func() string) {
	t.Helper()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("after %v: srv got %d of %d; %s; conn id %d now %d; good's logs:\n%s", time.Since(o.start), o.rec.count.Load(), o.lanes,
				note(), o.id, transport.ConnID(o.good.Transport, "srv"), o.good.logs.String())
		}
	})
	// 3.2 MiB at 1 MiB/s: about 3.5 s.
	testutil.WaitFor(t, 40*time.Second, "every lane's large frame "+what, func() bool {
		return o.rec.count.Load() == int64(o.lanes)
	})
	if now := transport.ConnID(o.good.Transport, "srv"); now != o.id {
		t.Fatalf("the connection was replaced (%d, now %d)", o.id, now)
	}
}

// TestLargeFramesOverASlowLink: every lane has a large frame to write over
// a link so slow that a 64 KiB write takes longer than the large-frame
// stall rule's limit. The lanes holding the slots are slow, not stalled:
// their bytes go out all the time. Were their slots passed on, more large
// frames would be in progress than the peer's read budget holds; when the
// frames waiting for budget could fill the connection's receive window,
// the frames holding the budget never got their remaining bytes, and the
// connection ended in the frame read timeout, these fire-and-forget
// frames with it.
func TestLargeFramesOverASlowLink(t *testing.T) {
	// Most of its time is the paced link's: it runs beside the others.
	t.Parallel()
	// 1 MiB/s: two lanes writing share it, so each 64 KiB write of theirs
	// takes about 125 ms, longer than the 100 ms stall limit.
	o := startOverALink(t, slowLinkOf(1<<20))
	o.waitAll(t, "over the slow link", func() string { return "a slow link" })
}
