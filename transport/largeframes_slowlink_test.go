package transport_test

import (
	"fmt"
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

// TestLargeFramesOverASlowLink: every lane has a large frame to write over
// a link so slow that a 64 KiB write takes longer than the large-frame
// stall rule's limit. The lanes holding the slots are slow, not stalled:
// their bytes go out all the time. Were their slots passed on, more large
// frames would be in progress than the peer's read budget holds, the
// frames waiting for budget would fill the connection's receive window,
// and the frames holding the budget would never get their remaining
// bytes: the connection would end in the frame read timeout, and these
// fire-and-forget frames with it.
func TestLargeFramesOverASlowLink(t *testing.T) {
	// Most of its time is the paced link's: it runs beside the others.
	t.Parallel()
	ca := newCA(t)
	r := newResolver()
	rec := &recorder{}
	scfg := bulkConfig(t, ca, "srv")
	smallWindows(&scfg)
	startNode(t, scfg, r, rec)
	gcfg := bulkConfig(t, ca, "good")
	smallWindows(&gcfg)
	// 1 MiB/s: two lanes writing share it, so each 64 KiB write of theirs
	// takes about 125 ms, longer than the 100 ms stall limit above.
	gcfg.WrapPacketConn = slowLinkOf(1 << 20)
	good := startNode(t, gcfg, r, &recorder{})
	if _, err := good.Request(ctxT(t, 10*time.Second), "srv", envTo(t, "x@srv", pb.Envelope_RECEIPT_ACCEPTED)); err != nil {
		t.Fatal(err)
	}
	rec.count.Store(0)
	lanes := gcfg.Lanes
	payload := largeBody(t, 200<<10)
	found := map[int]bool{}
	for i := 0; len(found) < lanes; i++ {
		name := fmt.Sprintf("r%d@srv", i)
		l := transport.LaneOf(name, lanes)
		if found[l] {
			continue
		}
		found[l] = true
		env := envTo(t, name, pb.Envelope_RECEIPT_NONE)
		env.Body = payload
		if err := good.Send(ctxT(t, 10*time.Second), "srv", env); err != nil {
			t.Fatalf("send %s: %v", name, err)
		}
	}
	start := time.Now()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("after %v: srv got %d of %d; good's stats %+v; logs:\n%s", time.Since(start), rec.count.Load(), lanes, good.PeerStats()["srv"], good.logs.String())
		}
	})
	// 3.2 MiB at 1 MiB/s: about 3.5 s.
	testutil.WaitFor(t, 40*time.Second, "every lane's large frame over the slow link", func() bool {
		return rec.count.Load() == int64(lanes)
	})
}
