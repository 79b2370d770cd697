package transport_test

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
)

// smallWindows is the slow-link test's configuration: a read budget of two
// frames of the largest size (two slots), receive windows smaller than a
// frame (64 KiB a stream, 34 of them a connection), and a 100 ms stall
// rule, so what takes seconds with the defaults takes a fraction here.
func smallWindows(cfg *transport.Config) {
	cfg.MaxFrameSize = 256 << 10
	cfg.MaxReadBytes = 512 << 10
	cfg.FrameReadTimeout = 10 * time.Second
	cfg.StreamWindow = 64 << 10
	transport.SetLargeStall(cfg, 100*time.Millisecond)
}

// oneRecipientPerLane returns a recipient on srv for each of lanes lanes.
func oneRecipientPerLane(prefix string, lanes int) []string {
	found := map[int]bool{}
	var out []string
	for i := 0; len(found) < lanes; i++ {
		name := fmt.Sprintf("%s%d@srv", prefix, i)
		l := transport.LaneOf(name, lanes)
		if found[l] {
			continue
		}
		found[l] = true
		out = append(out, name)
	}
	return out
}

// TestLargeFramesAfterEveryHandlerPausedAtOnce: the receiver's handler is
// slow for every recipient at once for a moment (a GC pause, a lock, a
// disk stall), while every lane has two large frames queued. Each lane's
// first frame reaches the paused handler, so its stream is not read and the
// lane stops mid-way in its second frame: the stall rule passes its slot,
// rightly, until every lane has written part of its second frame. When the
// handler resumes, every reader comes back, reads its second frame's
// length prefix and asks for read budget at once: sixteen frames for a
// budget of two. Nothing is wrong with the peer but a slow moment: the
// frames waiting for budget must not take the connection's receive window
// from the two holding it (when they could, those never completed and the
// frame read timeout ended the connection).
func TestLargeFramesAfterEveryHandlerPausedAtOnce(t *testing.T) {
	largeFramesAfterEveryHandlerPausedAtOnce(t, 0)
}

// TestLargeFramesAfterEveryHandlerPausedAtOnceFromAPeerWithMoreLanes: the
// same from a peer with twice the server's lanes (a cluster changing its
// Lanes setting, node by node). The server sizes its connection window for
// its own lanes, so the peer's 32 stalled streams could take the whole of
// it; the server's Hello says how many lanes it is sized for, and the peer
// writes to it on no more.
func TestLargeFramesAfterEveryHandlerPausedAtOnceFromAPeerWithMoreLanes(t *testing.T) {
	largeFramesAfterEveryHandlerPausedAtOnce(t, 32)
}

// largeFramesAfterEveryHandlerPausedAtOnce runs the paused-handler test
// with the peer's Lanes set to lanes (0: the default).
func largeFramesAfterEveryHandlerPausedAtOnce(t *testing.T, lanes int) {
	ca := newCA(t)
	r := newResolver()
	rec := &recorder{}
	pause := make(chan struct{})
	var paused sync.Once
	resume := func() { paused.Do(func() { close(pause) }) }
	var entered sync.Map
	var enteredN atomic.Int64
	h := handlerFunc(func(from transport.PeerInfo, env *pb.Envelope, reply func(*pb.Receipt)) {
		if env.GetRecipient() != "x@srv" {
			if _, dup := entered.LoadOrStore(env.GetRecipient(), true); !dup {
				enteredN.Add(1)
			}
			<-pause
		}
		rec.HandleEnvelope(from, env, reply)
	})
	scfg := bulkConfig(t, ca, "srv")
	smallWindows(&scfg)
	startNode(t, scfg, r, h)
	gcfg := bulkConfig(t, ca, "good")
	smallWindows(&gcfg)
	if lanes > 0 {
		gcfg.Lanes = lanes
	}
	good := startNode(t, gcfg, r, &recorder{})
	t.Cleanup(resume) // before the nodes' Close, which waits for handlers
	if _, err := good.Request(ctxT(t, 10*time.Second), "srv", envTo(t, "x@srv", pb.Envelope_RECEIPT_ACCEPTED)); err != nil {
		t.Fatal(err)
	}
	id := transport.ConnID(good.Transport, "srv")
	rec.count.Store(0)
	lanes = gcfg.Lanes
	payload := largeBody(t, 200<<10)
	for _, name := range oneRecipientPerLane("r", lanes) {
		for k := 0; k < 2; k++ {
			env := envTo(t, name, pb.Envelope_RECEIPT_NONE)
			env.Body = payload
			if err := good.Send(ctxT(t, 10*time.Second), "srv", env); err != nil {
				t.Fatalf("send %s: %v", name, err)
			}
		}
	}
	// More lanes' first frames reached the paused handler than there are
	// slots: the slots were passed. The pause lasts two seconds more
	// (twenty times the stall limit), so they go round every lane.
	testutil.WaitFor(t, 30*time.Second, "three lanes' first large frames in the paused handler", func() bool {
		return enteredN.Load() >= 3
	})
	at := time.Now()
	testutil.WaitFor(t, 5*time.Second, "two more seconds of pause", func() bool {
		return time.Since(at) >= 2*time.Second
	})
	t.Logf("%d lanes' first frames in the paused handler", enteredN.Load())
	resume()
	start := time.Now()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("after %v: srv got %d of %d; conn id %d now %d; good's logs:\n%s", time.Since(start), rec.count.Load(), 2*lanes, id, transport.ConnID(good.Transport, "srv"), good.logs.String())
		}
	})
	// 3.2 MiB on loopback: well under a second when the frames flow.
	testutil.WaitFor(t, 20*time.Second, "every lane's second large frame after the handler resumed", func() bool {
		return rec.count.Load() == int64(2*lanes)
	})
	if now := transport.ConnID(good.Transport, "srv"); now != id {
		t.Fatalf("the connection was replaced (%d, now %d)", id, now)
	}
}

// dropoutLink is slowLink that also loses every datagram while off is set
// (a radio dropping out).
type dropoutLink struct {
	slowLink
	off     atomic.Bool
	dropped atomic.Int64
}

func (d *dropoutLink) WriteTo(p []byte, addr net.Addr) (int, error) {
	if d.off.Load() {
		d.dropped.Add(1)
		return len(p), nil
	}
	return d.slowLink.WriteTo(p, addr)
}

// TestLargeFramesOverASlowLinkThatDropsOut: the slow-link test, where the
// link drops out for a second (ten times the stall limit) in the middle
// of the transfer and then comes back. Nothing of any lane's stream is
// packed while it is out (QUIC only retransmits, in probes, and the
// limiter is not called for retransmissions), so every holder looks
// stalled, and the waiting lanes take their slots one after another; when
// the link is back, every lane writes its large frame at once, and the
// frames that wait for the read budget must not starve those holding it.
func TestLargeFramesOverASlowLinkThatDropsOut(t *testing.T) {
	// Most of its time is the paced link's: it runs beside the others.
	t.Parallel()
	var link *dropoutLink
	o := startOverALink(t, func(pc net.PacketConn) net.PacketConn {
		link = &dropoutLink{slowLink: slowLink{PacketConn: pc, rate: 1 << 20}}
		return link
	})
	// Some frames through, then the link drops out for a second.
	testutil.WaitFor(t, 20*time.Second, "a first large frame over the slow link", func() bool {
		return o.rec.count.Load() >= 1
	})
	link.off.Store(true)
	out := time.Now()
	testutil.WaitFor(t, 5*time.Second, "a second of dropout", func() bool {
		return time.Since(out) >= time.Second
	})
	link.off.Store(false)
	o.waitAll(t, "after the dropout", func() string { return fmt.Sprintf("%d datagrams dropped", link.dropped.Load()) })
}

// lossyLink is slowLink that loses one datagram in every `every`.
type lossyLink struct {
	slowLink
	every   int64
	n       atomic.Int64
	dropped atomic.Int64
}

func (d *lossyLink) WriteTo(p []byte, addr net.Addr) (int, error) {
	if d.n.Add(1)%d.every == 0 {
		d.dropped.Add(1)
		return len(p), nil
	}
	return d.slowLink.WriteTo(p, addr)
}

// TestLargeFramesOverASlowLossyLink: the slow-link test over a link that
// also loses one datagram in four. Lost bytes are sent again as
// retransmissions, which the limiter does not see; a holder whose lost
// bytes hold back its stream must not look stalled.
func TestLargeFramesOverASlowLossyLink(t *testing.T) {
	// Most of its time is the paced link's: it runs beside the others.
	t.Parallel()
	var link *lossyLink
	o := startOverALink(t, func(pc net.PacketConn) net.PacketConn {
		link = &lossyLink{slowLink: slowLink{PacketConn: pc, rate: 1 << 20}, every: 4}
		return link
	})
	o.waitAll(t, "over the lossy link", func() string { return fmt.Sprintf("%d datagrams dropped", link.dropped.Load()) })
}

// TestSeveralSlowRecipientsDoNotHoldBackOtherLanes: the stalled-handler
// test with three slow recipients on three lanes instead of one, each with
// more queued than its stream's receive window takes. A Request to a
// recipient on a fourth lane, small or large, must still be answered
// within a few seconds: a handler that blocks stalls its lane only (with
// quic-go's default windows, 6 MiB a stream and 15 MiB a connection, two
// such lanes stalled every other).
func TestSeveralSlowRecipientsDoNotHoldBackOtherLanes(t *testing.T) {
	ca := newCA(t)
	r := newResolver()
	release := make(chan struct{})
	var once sync.Once
	rel := func() { once.Do(func() { close(release) }) }
	var entered sync.Map
	var enteredN atomic.Int64
	slow := map[string]bool{}
	scfg := testConfig(t, ca, "srv")
	lanes := scfg.Lanes
	names := oneRecipientPerLane("slow", lanes)[:2]
	for _, n := range names {
		slow[n] = true
	}
	rec := &recorder{}
	h := handlerFunc(func(from transport.PeerInfo, env *pb.Envelope, reply func(*pb.Receipt)) {
		if slow[env.GetRecipient()] {
			if _, dup := entered.LoadOrStore(env.GetRecipient(), true); !dup {
				enteredN.Add(1)
			}
			<-release
			return
		}
		rec.HandleEnvelope(from, env, reply)
	})
	startNode(t, scfg, r, h)
	good := startNode(t, testConfig(t, ca, "good"), r, &recorder{})
	t.Cleanup(rel) // before the nodes' Close, which waits for handlers
	payload := largeBody(t, 1<<20)
	for i := 0; i < 12; i++ {
		for _, n := range names {
			env := envTo(t, n, pb.Envelope_RECEIPT_NONE)
			env.Body = payload
			if err := good.Send(ctxT(t, 5*time.Second), "srv", env); err != nil {
				t.Fatalf("send %d to %s: %v", i, n, err)
			}
		}
	}
	testutil.WaitFor(t, 20*time.Second, "every slow recipient in its handler", func() bool {
		return enteredN.Load() == int64(len(names))
	})
	busy := map[int]bool{}
	for _, n := range names {
		busy[transport.LaneOf(n, lanes)] = true
	}
	var other string
	for i := 0; ; i++ {
		other = fmt.Sprintf("fast%d@srv", i)
		if !busy[transport.LaneOf(other, lanes)] {
			break
		}
	}
	start := time.Now()
	if _, err := good.Request(ctxT(t, 8*time.Second), "srv", envTo(t, other, pb.Envelope_RECEIPT_ACCEPTED)); err != nil {
		t.Errorf("small request to %s while %d lanes are slow, after %v: %v", other, len(names), time.Since(start), err)
	}
	big := envTo(t, other, pb.Envelope_RECEIPT_ACCEPTED)
	big.Body = payload
	start = time.Now()
	if _, err := good.Request(ctxT(t, 8*time.Second), "srv", big); err != nil {
		t.Errorf("1 MiB request to %s while %d lanes are slow, after %v: %v", other, len(names), time.Since(start), err)
	}
}

// TestSteadilySlowRecipientDoesNotHoldTheOnlySlot: the recipient's handler
// is not stopped but slow, 400 ms per 1 MiB message, and its lane has 20
// of them queued in one batch (RequestBatch, as the reliable relay
// pipelines a window). Its reader takes read budget only while it reads a
// frame, a few milliseconds of each 400, but each frame it reads opens
// its stream's window again, so QUIC packs some of the lane's bytes often
// enough that the stall rule (no byte packed for a second) never calls it
// stalled. A large Request on another lane must get the slot after the
// slow lane's current frame, not after its whole batch (8 s; the deadline
// below is 6 s, the answer comes in about 0.4 s).
func TestSteadilySlowRecipientDoesNotHoldTheOnlySlot(t *testing.T) {
	ca := newCA(t)
	r := newResolver()
	rec := &recorder{}
	var slowGot atomic.Int64
	h := handlerFunc(func(from transport.PeerInfo, env *pb.Envelope, reply func(*pb.Receipt)) {
		if env.GetRecipient() == slowRecipient {
			slowGot.Add(1)
			// A slow recipient: this models its work, it waits for no state.
			time.Sleep(400 * time.Millisecond)
			return
		}
		rec.HandleEnvelope(from, env, reply)
	})
	scfg := testConfig(t, ca, "srv")
	scfg.MaxReadBytes = scfg.MaxFrameSize // one slot
	startNode(t, scfg, r, h)
	good := startNode(t, testConfig(t, ca, "good"), r, &recorder{})
	payload := largeBody(t, 1<<20)
	// One batch, contiguous in the lane, as the reliable relay pipelines
	// a window of messages: the writer takes it in one go.
	var batch []*pb.Envelope
	for i := 0; i < 20; i++ {
		env := envTo(t, slowRecipient, pb.Envelope_RECEIPT_ACCEPTED)
		env.Body = payload
		batch = append(batch, env)
	}
	batchDone := make(chan struct{})
	go func() {
		defer close(batchDone)
		_, _ = good.RequestBatch(ctxT(t, 30*time.Second), "srv", batch)
	}()
	t.Cleanup(func() { _ = good.Close(); <-batchDone })
	testutil.WaitFor(t, 10*time.Second, "the slow recipient's first message", func() bool { return slowGot.Load() >= 1 })
	to := otherLaneRecipient(t, "fast", slowRecipient, good.cfg.Lanes)
	big := envTo(t, to, pb.Envelope_RECEIPT_ACCEPTED)
	big.Body = payload
	start := time.Now()
	if _, err := good.Request(ctxT(t, 6*time.Second), "srv", big); err != nil {
		t.Fatalf("1 MiB request to %s while %s is slow (it got %d of 20), after %v: %v", to, slowRecipient, slowGot.Load(), time.Since(start), err)
	}
	t.Logf("answered after %v; the slow recipient got %d of 20", time.Since(start), slowGot.Load())
}
