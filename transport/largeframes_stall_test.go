package transport_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
)

// A lane stalled by a slow recipient, while lanes of the same connection
// write frames larger than the peer's stream buffer a few at a time
// (largeGate in lane.go): the other lanes' large frames must not wait for
// the slow handler. Each test runs with the default two slots and with a
// sender whose budget allows one, where the stalled lane holds the only
// slot until a waiting lane takes it over.

// bothSlotCounts runs f with two large-frame slots and with one.
func bothSlotCounts(t *testing.T, f func(t *testing.T, oneSlot bool)) {
	for _, one := range []bool{false, true} {
		name := "two slots"
		if one {
			name = "one slot"
		}
		t.Run(name, func(t *testing.T) { f(t, one) })
	}
}

const slowRecipient = "slow@srv"

// otherLaneRecipient returns a recipient on srv whose lane differs from the lane of not.
func otherLaneRecipient(t *testing.T, prefix, not string, lanes int) string {
	t.Helper()
	for i := 0; ; i++ {
		name := fmt.Sprintf("%s%d@srv", prefix, i)
		if transport.LaneOf(name, lanes) != transport.LaneOf(not, lanes) {
			return name
		}
	}
}

func largeBody(t *testing.T, n int) *anypb.Any {
	t.Helper()
	p, err := anypb.New(wrapperspb.Bytes(make([]byte, n)))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// stalled is a server whose handler is slow for one recipient, and a good
// peer that has queued more large envelopes for it than its stream's
// receive window takes.
type stalled struct {
	srv, good *node
	rec       *recorder // envelopes of every recipient but the slow one
	payload   *anypb.Any
	release   func()
}

// With oneSlot the server's read budget, which it announces, holds one
// frame of the largest size, so the good peer writes one large frame at a
// time: the stalled lane holds the only slot until a waiting lane takes it
// over.
func setupStalled(t *testing.T, oneSlot bool) *stalled {
	t.Helper()
	ca := newCA(t)
	r := newResolver()
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	rec := &recorder{}
	h := handlerFunc(func(from transport.PeerInfo, env *pb.Envelope, reply func(*pb.Receipt)) {
		if env.GetRecipient() == slowRecipient {
			select {
			case entered <- struct{}{}:
			default:
			}
			<-release // a slow recipient
			return
		}
		rec.HandleEnvelope(from, env, reply)
	})
	scfg := testConfig(t, ca, "srv")
	if oneSlot {
		// The reader's budget sizes the writer's slots (it announces it).
		scfg.MaxReadBytes = scfg.MaxFrameSize
	}
	srv := startNode(t, scfg, r, h)
	released := false
	rel := func() {
		if !released {
			released = true
			close(release)
		}
	}
	t.Cleanup(rel) // runs before srv.Close, which waits for handlers
	good := startNode(t, testConfig(t, ca, "good"), r, &recorder{})
	payload := largeBody(t, 1<<20)
	// 12 MiB for the slow recipient: more than its stream's receive window
	// (512 KiB) and less than the send queue's byte bound (64 MiB).
	for i := 0; i < 12; i++ {
		env := envTo(t, slowRecipient, pb.Envelope_RECEIPT_NONE)
		env.Body = payload
		if err := good.Send(ctxT(t, 5*time.Second), "srv", env); err != nil {
			t.Fatalf("send %d to %s: %v", i, slowRecipient, err)
		}
	}
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the slow recipient never got its first envelope")
	}
	return &stalled{srv: srv, good: good, rec: rec, payload: payload, release: rel}
}

// sendLarge sends the 1 MiB payload to a recipient on srv named from
// prefix, on another lane than the slow one, and returns the envelope.
func (s *stalled) sendLarge(t *testing.T, prefix string) *pb.Envelope {
	t.Helper()
	to := otherLaneRecipient(t, prefix, slowRecipient, s.good.cfg.Lanes)
	env := envTo(t, to, pb.Envelope_RECEIPT_NONE)
	env.Body = s.payload
	if err := s.good.Send(ctxT(t, 5*time.Second), "srv", env); err != nil {
		t.Fatalf("send to %s: %v", to, err)
	}
	return env
}

// A handler slow for one recipient stops its lane's stream from being
// read, and the sender's writer for that lane blocks in the middle of a
// large frame, holding a slot. A large message for a recipient on another
// lane still arrives: "a handler that blocks stalls that lane only".
func TestSlowRecipientDoesNotHoldBackLargeFramesOfOtherLanes(t *testing.T) {
	bothSlotCounts(t, slowRecipientDoesNotHoldBackLargeFramesOfOtherLanes)
}

func slowRecipientDoesNotHoldBackLargeFramesOfOtherLanes(t *testing.T, oneSlot bool) {
	s := setupStalled(t, oneSlot)
	fast := s.sendLarge(t, "fast").GetRecipient()
	testutil.WaitFor(t, 8*time.Second, fmt.Sprintf("a 1 MiB message to %s (lane %d, handler idle) delivered while %s (lane %d) is slow",
		fast, transport.LaneOf(fast, s.good.cfg.Lanes), slowRecipient, transport.LaneOf(slowRecipient, s.good.cfg.Lanes)),
		func() bool { return s.rec.count.Load() == 1 })
}

// The same stall does not make Requests to other recipients time out: a
// large one, nor a small one queued behind a large Send on its lane.
func TestSlowRecipientDoesNotFailRequestsOfOtherLanes(t *testing.T) {
	bothSlotCounts(t, slowRecipientDoesNotFailRequestsOfOtherLanes)
}

func slowRecipientDoesNotFailRequestsOfOtherLanes(t *testing.T, oneSlot bool) {
	s := setupStalled(t, oneSlot)
	lanes := s.good.cfg.Lanes
	// A large Request to a recipient on another lane.
	a := otherLaneRecipient(t, "reqa", slowRecipient, lanes)
	big := envTo(t, a, pb.Envelope_RECEIPT_ACCEPTED)
	big.Body = s.payload
	errs := make(chan error, 1)
	go func() {
		_, err := s.good.Request(ctxT(t, 6*time.Second), "srv", big)
		errs <- err
	}()
	// A small Request to a recipient on another lane, queued after a large
	// Send to it (Send returns once the frame is queued).
	b := s.sendLarge(t, "reqb").GetRecipient()
	if _, err := s.good.Request(ctxT(t, 6*time.Second), "srv", envTo(t, b, pb.Envelope_RECEIPT_ACCEPTED)); err != nil {
		t.Errorf("small request to %s (lane %d) while %s (lane %d) is slow: %v", b, transport.LaneOf(b, lanes), slowRecipient, transport.LaneOf(slowRecipient, lanes), err)
	}
	if err := <-errs; err != nil {
		t.Errorf("1 MiB request to %s (lane %d) while %s (lane %d) is slow: %v", a, transport.LaneOf(a, lanes), slowRecipient, transport.LaneOf(slowRecipient, lanes), err)
	}
}

// A large message Send accepted beside the stalled lane is written without
// waiting for the slow handler, so a reconnect (ClosePeer, as the node
// does on a membership change) after it does not drop it.
func TestLargeFrameBesideStalledLaneDeliveredBeforeReconnect(t *testing.T) {
	bothSlotCounts(t, largeFrameBesideStalledLaneDeliveredBeforeReconnect)
}

func largeFrameBesideStalledLaneDeliveredBeforeReconnect(t *testing.T, oneSlot bool) {
	s := setupStalled(t, oneSlot)
	env := s.sendLarge(t, "lost")
	fast := env.GetRecipient()
	// Give it 3 s to be written (milliseconds with a free slot, about
	// largeStall when it must take over the stalled lane's); the check
	// after the reconnect decides.
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(3 * time.Second)
wait:
	for s.rec.count.Load() == 0 {
		select {
		case <-tick.C:
		case <-deadline:
			break wait
		}
	}
	s.good.ClosePeer("srv", "membership says it restarted")
	s.release()
	// The next message reconnects and arrives; so has the accepted one.
	if _, err := s.good.Request(ctxT(t, 5*time.Second), "srv", envTo(t, "after@srv", pb.Envelope_RECEIPT_ACCEPTED)); err != nil {
		t.Fatalf("request after reconnect: %v", err)
	}
	testutil.WaitFor(t, 5*time.Second, fmt.Sprintf("the 1 MiB message Send accepted for %s delivered", fast), func() bool {
		envs, _ := s.rec.snapshot()
		for _, e := range envs {
			if e.GetMsgId() == env.GetMsgId() {
				return true
			}
		}
		return false
	})
}

// Close of the sender ends promptly while a lane holds a slot (blocked in
// Write) and others wait for one; goleak (TestMain) checks that no
// goroutine is left.
func TestCloseWhileLargeSlotsHeldAndAwaited(t *testing.T) {
	bothSlotCounts(t, closeWhileLargeSlotsHeldAndAwaited)
}

func closeWhileLargeSlotsHeldAndAwaited(t *testing.T, oneSlot bool) {
	s := setupStalled(t, oneSlot)
	for i := 0; i < 3; i++ {
		s.sendLarge(t, fmt.Sprintf("w%d-", i))
	}
	done := make(chan struct{})
	start := time.Now()
	go func() { _ = s.good.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close of the sender did not return within 5s")
	}
	t.Logf("Close took %v", time.Since(start))
	if errors.Is(s.good.Send(ctxT(t, time.Second), "srv", envTo(t, "x@srv", pb.Envelope_RECEIPT_NONE)), nil) {
		t.Fatal("send after Close succeeded")
	}
}
