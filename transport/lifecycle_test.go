package transport_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
)

// holder keeps reply callbacks without answering, like a slow handler.
type holder struct {
	mu      sync.Mutex // mu guards the field below
	replies []func(*pb.Receipt)
}

func (h *holder) HandleEnvelope(_ transport.PeerInfo, _ *pb.Envelope, reply func(*pb.Receipt)) {
	h.mu.Lock()
	h.replies = append(h.replies, reply)
	h.mu.Unlock()
}

func (h *holder) n() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.replies)
}

func TestPeerGoneFailsWaiters(t *testing.T) {
	cases := []struct {
		name string
		kill func(b *node, hole *blackhole)
		max  time.Duration // how soon the waiter must fail
	}{
		// Close sends GoAway and CONNECTION_CLOSE: noticed at once.
		{"graceful close", func(b *node, _ *blackhole) { _ = b.Close() }, time.Second},
		// The host vanishes: noticed by the idle timeout (MaxIdleTimeout 2 s here).
		{"crash", func(_ *node, hole *blackhole) { hole.drop.Store(true) }, 4 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ca := newCA(t)
			r := newResolver()
			a := startNode(t, testConfig(t, ca, "a"), r, &recorder{})
			hole := &blackhole{}
			cfgB := testConfig(t, ca, "b")
			cfgB.WrapPacketConn = func(pc net.PacketConn) net.PacketConn { hole.PacketConn = pc; return hole }
			h := &holder{}
			b := startNode(t, cfgB, r, h)
			errc := make(chan error, 1)
			go func() {
				_, err := a.Request(context.Background(), "b", envTo(t, "x@b", pb.Envelope_RECEIPT_PROCESSED))
				errc <- err
			}()
			testutil.WaitFor(t, 5*time.Second, "request reaches b", func() bool { return h.n() == 1 })
			start := time.Now()
			tc.kill(b, hole)
			select {
			case err := <-errc:
				if !errors.Is(err, transport.ErrConnLost) {
					t.Fatalf("err = %v, want ErrConnLost", err)
				}
				t.Logf("waiter failed after %v: %v", time.Since(start), err)
			case <-time.After(tc.max):
				t.Fatalf("waiter not failed within %v", tc.max)
			}
			// Membership now says b is down: no dial, an immediate error.
			r.Down("b")
			start = time.Now()
			err := a.Send(ctxT(t, 10*time.Second), "b", envTo(t, "x@b", pb.Envelope_RECEIPT_NONE))
			if !errors.Is(err, transport.ErrUnreachable) {
				t.Fatalf("send to a down peer: err = %v, want ErrUnreachable", err)
			}
			if d := time.Since(start); d > 500*time.Millisecond {
				t.Fatalf("send to a down peer took %v; it must not dial", d)
			}
			hole.drop.Store(false)
			// A reply after the connection is gone is dropped, never blocks or panics.
			h.mu.Lock()
			h.replies[0](&pb.Receipt{Code: pb.Receipt_PROCESSED})
			h.mu.Unlock()
		})
	}
}

func TestClosePeerFailsWaitersAndRedials(t *testing.T) {
	ca := newCA(t)
	r := newResolver()
	a := startNode(t, testConfig(t, ca, "a"), r, &recorder{})
	h := &holder{}
	startNode(t, testConfig(t, ca, "b"), r, h)
	errc := make(chan error, 1)
	go func() {
		_, err := a.Request(context.Background(), "b", envTo(t, "x@b", pb.Envelope_RECEIPT_PROCESSED))
		errc <- err
	}()
	testutil.WaitFor(t, 5*time.Second, "request reaches b", func() bool { return h.n() == 1 })
	a.ClosePeer("b", "test says so")
	if err := <-errc; !errors.Is(err, transport.ErrConnLost) {
		t.Fatalf("err = %v, want ErrConnLost", err)
	}
	// Re-dial on demand.
	if err := a.Send(ctxT(t, 5*time.Second), "b", envTo(t, "x@b", pb.Envelope_RECEIPT_NONE)); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "tell after redial", func() bool { return h.n() == 2 })
}

func TestRequestContextEnds(t *testing.T) {
	ca := newCA(t)
	r := newResolver()
	a := startNode(t, testConfig(t, ca, "a"), r, &recorder{})
	startNode(t, testConfig(t, ca, "b"), r, &holder{})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	env := envTo(t, "x@b", pb.Envelope_RECEIPT_PROCESSED)
	if _, err := a.Request(ctx, "b", env); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want DeadlineExceeded", err)
	}
	// The waiter was removed: the same msg id can be requested again.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel2()
	if _, err := a.Request(ctx2, "b", env); errors.Is(err, transport.ErrBadEnvelope) {
		t.Fatalf("waiter leaked: %v", err)
	}
}

func TestPeerRestart(t *testing.T) {
	for _, samePort := range []bool{false, true} {
		t.Run(fmt.Sprintf("same port %v", samePort), func(t *testing.T) {
			ca := newCA(t)
			r := newResolver()
			a := startNode(t, testConfig(t, ca, "a"), r, &recorder{})
			hole := &blackhole{}
			cfgB := testConfig(t, ca, "b")
			cfgB.WrapPacketConn = func(pc net.PacketConn) net.PacketConn { hole.PacketConn = pc; return hole }
			b := startNode(t, cfgB, r, &recorder{})
			ctx := ctxT(t, 15*time.Second)
			if _, err := a.Request(ctx, "b", envTo(t, "x@b", pb.Envelope_RECEIPT_PROCESSED)); err != nil {
				t.Fatal(err)
			}
			// Crash: b vanishes without a word, a keeps its connection.
			hole.drop.Store(true)
			oldAddr := b.LocalAddr().String()
			_ = b.Close()
			cfgB2 := testConfig(t, ca, "b")
			cfgB2.DataDir = cfgB.DataDir // same reset key
			if samePort {
				cfgB2.ListenAddr = oldAddr
			}
			rec2 := &recorder{}
			b2 := startNode(t, cfgB2, r, rec2)
			start := time.Now()
			testutil.WaitFor(t, 8*time.Second, "request to the restarted peer", func() bool {
				rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
				defer cancel()
				_, err := a.Request(rctx, "b", envTo(t, "x@b", pb.Envelope_RECEIPT_PROCESSED))
				return err == nil
			})
			t.Logf("restarted peer reachable after %v", time.Since(start))
			_, from := rec2.snapshot()
			if len(from) == 0 || from[len(from)-1].Name != "a" {
				t.Fatalf("restarted b got %v", from)
			}
			if b2.cfg.BootID == b.cfg.BootID {
				t.Fatal("test bug: same boot id")
			}
		})
	}
}

// TestSimultaneousDial has both peers dial each other at once, many times;
// they settle on one connection, the same at both ends.
func TestSimultaneousDial(t *testing.T) {
	ca := newCA(t)
	for round := range 5 {
		r := newResolver()
		a := startNode(t, testConfig(t, ca, "a"), r, &recorder{})
		b := startNode(t, testConfig(t, ca, "b"), r, &recorder{})
		var wg sync.WaitGroup
		errs := make(chan error, 2)
		for _, p := range []struct {
			from *node
			to   string
		}{{a, "b"}, {b, "a"}} {
			wg.Go(func() {
				// A request that loses the tie-break fails with ErrConnLost; the
				// caller retries, as the relay does.
				for try := 0; ; try++ {
					_, err := p.from.Request(ctxT(t, 5*time.Second), p.to, envTo(t, "x@"+p.to, pb.Envelope_RECEIPT_ACCEPTED))
					if err == nil {
						return
					}
					if !errors.Is(err, transport.ErrConnLost) || try == 3 {
						errs <- fmt.Errorf("%s -> %s: %w", p.from.name, p.to, err)
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("round %d: %v", round, err)
		}
		testutil.WaitFor(t, 5*time.Second, "one connection, dialed by one of them", func() bool {
			okA, dialedA := transport.ConnInfo(a.Transport, "b")
			okB, dialedB := transport.ConnInfo(b.Transport, "a")
			return okA && okB && dialedA != dialedB && transport.ConnID(a.Transport, "b") == transport.ConnID(b.Transport, "a")
		})
		_ = a.Close()
		_ = b.Close()
	}
}

// TestLanesIndependent: a recipient whose handler blocks does not stop
// envelopes for a recipient on another lane.
func TestLanesIndependent(t *testing.T) {
	ca := newCA(t)
	r := newResolver()
	release := make(chan struct{})
	var once sync.Once
	rec := &recorder{}
	h := handlerFunc(func(from transport.PeerInfo, env *pb.Envelope, reply func(*pb.Receipt)) {
		if env.GetRecipient() == "slow@b" {
			<-release
			return
		}
		rec.HandleEnvelope(from, env, reply)
	})
	a := startNode(t, testConfig(t, ca, "a"), r, &recorder{})
	cfgB := testConfig(t, ca, "b")
	startNode(t, cfgB, r, h)
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	fast := "fast@b"
	for transport.LaneOf(fast, cfgB.Lanes) == transport.LaneOf("slow@b", cfgB.Lanes) {
		fast += "x"
	}
	ctx := ctxT(t, 5*time.Second)
	if err := a.Send(ctx, "b", envTo(t, "slow@b", pb.Envelope_RECEIPT_NONE)); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Request(ctx, "b", envTo(t, fast, pb.Envelope_RECEIPT_PROCESSED)); err != nil {
		t.Fatalf("fast recipient blocked by slow one: %v", err)
	}
	once.Do(func() { close(release) })
}

func TestCloseIdempotentAndSendAfterClose(t *testing.T) {
	ca := newCA(t)
	r := newResolver()
	a := startNode(t, testConfig(t, ca, "a"), r, &recorder{})
	startNode(t, testConfig(t, ca, "b"), r, &recorder{})
	if err := a.Send(ctxT(t, 5*time.Second), "b", envTo(t, "x@b", pb.Envelope_RECEIPT_NONE)); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Send(ctxT(t, time.Second), "b", envTo(t, "x@b", pb.Envelope_RECEIPT_NONE)); !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("send after close: %v, want ErrClosed", err)
	}
}

// ForgetPeer keeps a connected peer, and one whose connection was closed
// until that connection would have idled out at the peer; then it drops
// it, and a later send makes a new entry.
func TestForgetPeer(t *testing.T) {
	ca := newCA(t)
	r := newResolver()
	a := startNode(t, testConfig(t, ca, "a"), r, &recorder{})
	h := &holder{}
	startNode(t, testConfig(t, ca, "b"), r, h)
	if err := a.Send(ctxT(t, 5*time.Second), "b", envTo(t, "x@b", pb.Envelope_RECEIPT_NONE)); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "tell reaches b", func() bool { return h.n() == 1 })
	if a.ForgetPeer("b") {
		t.Fatal("ForgetPeer dropped a connected peer")
	}
	a.ClosePeer("b", "test says so")
	if a.ForgetPeer("b") {
		t.Fatal("ForgetPeer dropped a peer whose connection left an instant ago")
	}
	testutil.WaitFor(t, 10*time.Second, "ForgetPeer drops b once its connection idled out", func() bool { return a.ForgetPeer("b") })
	if _, ok := a.PeerStats()["b"]; ok {
		t.Fatal("PeerStats still lists a forgotten peer")
	}
	if !a.ForgetPeer("nobody") {
		t.Fatal("ForgetPeer of an unknown peer reported it kept")
	}
	if err := a.Send(ctxT(t, 5*time.Second), "b", envTo(t, "x@b", pb.Envelope_RECEIPT_NONE)); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "tell after the peer was forgotten", func() bool { return h.n() == 2 })
	if _, ok := a.PeerStats()["b"]; !ok {
		t.Fatal("no entry for the peer after it was sent to again")
	}
}

// TestSimultaneousFirstSendsLoseNothing: both peers send to each other at
// once with no connection yet, many frames each. One of the two dials
// loses the tie-break, and it is refused before its dialer hears an
// answer, so nothing is ever sent on a connection that is then closed:
// every frame arrives. (Decided after the answer, the frames sent on the
// losing connection in the meantime were lost.)
func TestSimultaneousFirstSendsLoseNothing(t *testing.T) {
	ca := newCA(t)
	const senders, each = 4, 50
	for round := range 8 {
		r := newResolver()
		ra, rb := &recorder{}, &recorder{}
		a := startNode(t, testConfig(t, ca, "a"), r, ra)
		b := startNode(t, testConfig(t, ca, "b"), r, rb)
		var all []sender
		for range senders {
			all = append(all, sender{from: a, to: "b"}, sender{from: b, to: "a"})
		}
		if err := sendAtOnce(t, each, all...); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		testutil.WaitFor(t, 5*time.Second, fmt.Sprintf("round %d: all %d frames each way", round, senders*each), func() bool {
			return ra.count.Load() == senders*each && rb.count.Load() == senders*each
		})
		_ = a.Close()
		_ = b.Close()
	}
}

// TestOneWayReachabilityWithBothSendingAtOnce: a cannot reach b (behind a
// NAT, say: its packets to b go nowhere), b can reach a, and both send
// first at once. a's dial, still in its QUIC handshake, does not refuse
// b's connection (the smaller name's refusal waits for a dial that has
// reached the peer), and a's sends go out on b's connection once a's own
// dial gives up. Every frame arrives and no send fails.
func TestOneWayReachabilityWithBothSendingAtOnce(t *testing.T) {
	ca := newCA(t)
	const each = 50
	rA, rB := newResolver(), newResolver()
	ra, rb := &recorder{}, &recorder{}
	a := startNode(t, testConfig(t, ca, "a"), rA, ra)
	b := startNode(t, testConfig(t, ca, "b"), rB, rb)
	rA.Set("b", silentAddr(t)) // a's handshake gets no answer
	rB.Set("a", a.LocalAddr().String())
	if err := sendAtOnce(t, each, sender{from: a, to: "b"}, sender{from: b, to: "a"}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, fmt.Sprintf("all %d frames each way", each), func() bool {
		return ra.count.Load() == each && rb.count.Load() == each
	})
}
