package transport_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
)

// silentAddr is a UDP address that takes packets and never answers (a
// stale address: a host that moved away, or a one-way partition).
func silentAddr(t *testing.T) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pc.Close() })
	return pc.LocalAddr().String()
}

// sender is one goroutine of sendAtOnce: from sends to to after delay.
type sender struct {
	from  *node
	to    string
	delay time.Duration
}

// sendAtOnce runs every sender at once, each sending each fire-and-forget
// frames after its delay, and returns the first send's error.
func sendAtOnce(t *testing.T, each int, senders ...sender) error {
	var wg sync.WaitGroup
	errs := make(chan error, len(senders))
	for _, p := range senders {
		wg.Go(func() {
			time.Sleep(p.delay) // the start the round draws, not a wait for a state
			for range each {
				if err := p.from.Send(ctxT(t, 10*time.Second), p.to, envTo(t, "x@"+p.to, pb.Envelope_RECEIPT_NONE)); err != nil {
					errs <- fmt.Errorf("%s -> %s: %w", p.from.name, p.to, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// keepDialing makes from send to peer again and again (a reliable sender
// retrying) until the returned stop is called, and returns once a dial
// to peer is in flight.
func keepDialing(t *testing.T, from *node, peer string) (stop func()) {
	t.Helper()
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_ = from.Send(ctx, peer, envTo(t, "x@"+peer, pb.Envelope_RECEIPT_NONE))
			cancel()
		}
	})
	var once sync.Once
	stop = func() { once.Do(func() { close(done); wg.Wait() }) }
	t.Cleanup(stop)
	testutil.WaitFor(t, 5*time.Second, from.name+" dialing "+peer, func() bool { return transport.Dialing(from.Transport, peer) })
	return stop
}

// TestLargerReachesSmallerWhileTheSmallersDialsGoNowhere: a (the smaller name)
// cannot reach b: its resolver still gives b's old address (b moved; the
// membership update has not come yet), and its dial there is in flight
// (a's outbox sending to b). b can reach a and sends to it: a's dial,
// never past its QUIC handshake, must not make a refuse b's, the only
// connection possible (refused, b waited out the handshake timeout and
// failed, again and again).
func TestLargerReachesSmallerWhileTheSmallersDialsGoNowhere(t *testing.T) {
	ca := newCA(t)
	ra, rb := newResolver(), newResolver()
	recA := &recorder{}
	a := startNode(t, testConfig(t, ca, "a"), ra, recA)
	b := startNode(t, testConfig(t, ca, "b"), rb, &recorder{})
	rb.Set("a", a.LocalAddr().String())
	ra.Set("b", silentAddr(t)) // a's view of b is stale

	// a keeps trying to send to b (a reliable sender retrying), one dial
	// after another.
	defer keepDialing(t, a, "b")()

	// b is a reliable caller: it retries, for four handshake timeouts.
	start := time.Now()
	var err error
	for tries := 1; time.Since(start) < 8*time.Second; tries++ {
		if _, err = b.Request(ctxT(t, 10*time.Second), "a", envTo(t, "x@a", pb.Envelope_RECEIPT_PROCESSED)); err == nil {
			return
		}
		t.Logf("try %d failed after %v", tries, time.Since(start).Round(time.Millisecond))
	}
	t.Fatalf("b -> a (a reachable from b) never got through in %v: %v", time.Since(start).Round(time.Millisecond), err)
}

// TestManyRoundsOfBothSendingFirstAfterRandomDelays: both sides send first at once,
// with random delays, many rounds; every tell must arrive and neither
// side may see a connection closed under it.
func TestManyRoundsOfBothSendingFirstAfterRandomDelays(t *testing.T) {
	ca := newCA(t)
	const rounds, each = 30, 20
	for round := range rounds {
		r := newResolver()
		ra, rb := &recorder{}, &recorder{}
		a := startNode(t, testConfig(t, ca, "a"), r, ra)
		b := startNode(t, testConfig(t, ca, "b"), r, rb)
		da := time.Duration(rand.IntN(3000)) * time.Microsecond
		db := time.Duration(rand.IntN(3000)) * time.Microsecond
		if err := sendAtOnce(t, each, sender{a, "b", da}, sender{b, "a", db}, sender{a, "b", db}, sender{b, "a", da}); err != nil {
			t.Fatalf("round %d (delays %v %v): %v", round, da, db, err)
		}
		testutil.WaitFor(t, 5*time.Second, fmt.Sprintf("round %d (delays %v %v): all %d frames each way", round, da, db, 2*each), func() bool {
			return ra.count.Load() == 2*each && rb.count.Load() == 2*each
		})
		_ = a.Close()
		_ = b.Close()
	}
}

// TestSmallerSendsWhileAnsweringTheLargersDial: b (the larger) dials a and
// sends at once; a starts its own first send exactly while it answers b's
// Hello (between admitIncoming and register). a's dial goroutine must not
// dial a second connection once b's is registered: that one would win the
// tie-break at both ends and close b's connection under what b sent.
func TestSmallerSendsWhileAnsweringTheLargersDial(t *testing.T) {
	ca := newCA(t)
	const rounds, each = 50, 30
	dups := 0
	defer func() { t.Logf("a dialed a second connection in %d of %d rounds", dups, rounds) }()
	for round := range rounds {
		r := newResolver()
		ra, rb := &recorder{}, &recorder{}
		var aNode atomic.Pointer[node]
		var once atomic.Bool
		sent := make(chan error, 1)
		spin := rand.IntN(20000)
		cfgA := testConfig(t, ca, "a")
		transport.SetHelloHook(&cfgA, func(*pb.Hello) {
			if once.Swap(true) {
				return
			}
			go func() {
				sent <- aNode.Load().Send(ctxT(t, 5*time.Second), "b", envTo(t, "x@b", pb.Envelope_RECEIPT_NONE))
			}()
			for i := 0; i < spin; i++ {
				_ = i * i
			}
		})
		a := startNode(t, cfgA, r, ra)
		aNode.Store(a)
		b := startNode(t, testConfig(t, ca, "b"), r, rb)
		for i := range each {
			if err := b.Send(ctxT(t, 5*time.Second), "a", envTo(t, "x@a", pb.Envelope_RECEIPT_NONE)); err != nil {
				t.Fatalf("round %d: b -> a %d: %v", round, i, err)
			}
		}
		if err := <-sent; err != nil {
			t.Fatalf("round %d: a -> b: %v", round, err)
		}
		testutil.WaitFor(t, 5*time.Second, fmt.Sprintf("round %d (spin %d): all of b's %d frames at a and a's one at b", round, spin, each), func() bool {
			return ra.count.Load() == each && rb.count.Load() == 1
		})
		if strings.Contains(a.logs.String(), "dialed=true") {
			dups++
		}
		_ = a.Close()
		_ = b.Close()
	}
}

// TestRestartedLargerReachesSmallerDialingItsOldAddress: b restarts
// on another port (new boot id); a's membership still gives b's old
// address, where a's reliable sender keeps dialing. b's new incarnation
// dials a (whose address it knows) and gets through: a's dial to the old
// address, never past its QUIC handshake, refuses nothing.
func TestRestartedLargerReachesSmallerDialingItsOldAddress(t *testing.T) {
	ca := newCA(t)
	ra, rb := newResolver(), newResolver()
	a := startNode(t, testConfig(t, ca, "a"), ra, &recorder{})
	b1 := startNode(t, testConfig(t, ca, "b"), ra, &recorder{}) // a resolves b to b1
	if _, err := a.Request(ctxT(t, 5*time.Second), "b", envTo(t, "x@b", pb.Envelope_RECEIPT_PROCESSED)); err != nil {
		t.Fatal(err)
	}
	_ = b1.Close()
	testutil.WaitFor(t, 5*time.Second, "a sees b1's connection closed", func() bool { ok, _ := transport.ConnInfo(a.Transport, "b"); return !ok })
	ra.Set("b", silentAddr(t)) // b1's old address: nothing answers there now

	cfgB2 := testConfig(t, ca, "b")
	cfgB2.BootID = "b-second-boot"
	b2 := startNode(t, cfgB2, rb, &recorder{})
	rb.Set("a", a.LocalAddr().String())

	defer keepDialing(t, a, "b")() // to b's old address

	start := time.Now()
	var err error
	for time.Since(start) < 6*time.Second {
		if _, err = b2.Request(ctxT(t, 10*time.Second), "a", envTo(t, "x@a", pb.Envelope_RECEIPT_PROCESSED)); err == nil {
			return
		}
	}
	t.Fatalf("restarted b -> a never got through in %v: %v", time.Since(start).Round(time.Millisecond), err)
}

// TestRedialConnectsWhileTheSmallersDialGoesNowhere: Redial (the relay's probe
// of the direct path) "returns nil once a handshake with node completed".
// b (the larger) probes a while a's own dial to b is in flight to an
// address that leads nowhere: a takes b's connection, so the probe's nil
// is true (refused, Redial would take the CodeDuplicate as success with
// no connection at all).
func TestRedialConnectsWhileTheSmallersDialGoesNowhere(t *testing.T) {
	ca := newCA(t)
	ra, rb := newResolver(), newResolver()
	a := startNode(t, testConfig(t, ca, "a"), ra, &recorder{})
	b := startNode(t, testConfig(t, ca, "b"), rb, &recorder{})
	rb.Set("a", a.LocalAddr().String())
	ra.Set("b", silentAddr(t))
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = a.Send(ctxT(t, 10*time.Second), "b", envTo(t, "x@b", pb.Envelope_RECEIPT_NONE))
	}()
	defer func() { <-done }()
	testutil.WaitFor(t, 5*time.Second, "a dialing b", func() bool { return transport.Dialing(a.Transport, "b") })
	if err := b.Redial(ctxT(t, 5*time.Second), "a"); err != nil {
		t.Fatalf("Redial: %v", err)
	}
	if ok, _ := transport.ConnInfo(b.Transport, "a"); !ok {
		t.Fatal("Redial returned nil (a handshake with a completed), but b has no connection to a")
	}
}
