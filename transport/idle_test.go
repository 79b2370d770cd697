package transport_test

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
)

// A connection that carries nothing for IdleConnTimeout is closed on both
// sides, and the next send opens a new one; neither side logs a lost
// connection for it.
func TestIdleConnectionClosedAndReopened(t *testing.T) {
	ca := newCA(t)
	r := newResolver()
	ca1, ca2 := testConfig(t, ca, "n1"), testConfig(t, ca, "n2")
	ca1.IdleConnTimeout = 200 * time.Millisecond
	ca2.IdleConnTimeout = 0 // only n1 closes: n2 learns it from the GoAway
	rec := &recorder{}
	n1 := startNode(t, ca1, r, &recorder{})
	n2 := startNode(t, ca2, r, rec)
	ctx := ctxT(t, 10*time.Second)
	for round := 1; round <= 2; round++ {
		if _, err := n1.Request(ctx, "n2", envTo(t, "a@n2", pb.Envelope_RECEIPT_PROCESSED)); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if !n1.PeerStats()["n2"].Connected {
			t.Fatalf("round %d: not connected after a request", round)
		}
		testutil.WaitFor(t, 5*time.Second, "idle connection closed on both sides", func() bool {
			return !n1.PeerStats()["n2"].Connected && !n2.PeerStats()["n1"].Connected
		})
		if got := n1.IdleClosed(); got != uint64(round) {
			t.Fatalf("round %d: IdleClosed %d", round, got)
		}
	}
	if got := rec.count.Load(); got != 2 {
		t.Fatalf("n2 received %d envelopes, want 2", got)
	}
	for _, n := range []*node{n1, n2} {
		if l := n.logs.String(); strings.Contains(l, "connection lost") || strings.Contains(l, "going away") {
			t.Errorf("%s logged an idle close as a loss:\n%s", n.name, l)
		}
	}
}

// A connection with a request waiting for its receipt is not idle, however
// long the handler takes.
func TestIdleCloseWaitsForReceipts(t *testing.T) {
	ca := newCA(t)
	r := newResolver()
	cfg := testConfig(t, ca, "n1")
	cfg.IdleConnTimeout = 50 * time.Millisecond
	release := make(chan struct{})
	var held atomic.Bool
	n1 := startNode(t, cfg, r, &recorder{})
	startNode(t, testConfig(t, ca, "n2"), r, handlerFunc(func(_ transport.PeerInfo, env *pb.Envelope, reply func(*pb.Receipt)) {
		go func() {
			held.Store(true)
			<-release
			reply(&pb.Receipt{MsgId: env.GetMsgId(), Code: pb.Receipt_PROCESSED})
		}()
	}))
	ctx := ctxT(t, 10*time.Second)
	done := make(chan error, 1)
	go func() {
		_, err := n1.Request(ctx, "n2", envTo(t, "a@n2", pb.Envelope_RECEIPT_PROCESSED))
		done <- err
	}()
	testutil.WaitFor(t, 5*time.Second, "handler holds the receipt", held.Load)
	// Many idle periods pass while the receipt is held: the check runs
	// every quarter period, so wait for at least ten of them.
	deadline := time.Now().Add(10 * cfg.IdleConnTimeout)
	testutil.WaitFor(t, 5*time.Second, "ten idle periods", func() bool { return time.Now().After(deadline) })
	if n1.IdleClosed() != 0 || !n1.PeerStats()["n2"].Connected {
		t.Fatalf("closed while a receipt was awaited (idle closes %d)", n1.IdleClosed())
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("request: %v", err)
	}
	testutil.WaitFor(t, 5*time.Second, "closed once idle", func() bool { return n1.IdleClosed() == 1 })
}

func TestIdleConnTimeoutValidated(t *testing.T) {
	cfg := testConfig(t, newCA(t), "n1")
	cfg.IdleConnTimeout = -time.Second
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "IdleConnTimeout") {
		t.Fatalf("Validate: %v", err)
	}
}
