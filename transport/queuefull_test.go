package transport_test

import (
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// A send the full queue refuses costs no encoding, Admit refuses a large
// body before anyone marshals it, and both say when to come back. A
// sender retrying large messages against a full queue used to spend a
// copy of each on every attempt, which starved the connection draining it.
func TestQueueFullRefusesBeforeEncoding(t *testing.T) {
	const pad = 200 << 10
	ca := newCA(t)
	r := newResolver()
	release := make(chan struct{})
	var once sync.Once
	h := handlerFunc(func(transport.PeerInfo, *pb.Envelope, func(*pb.Receipt)) { <-release })
	cfgA := testConfig(t, ca, "a")
	cfgA.MaxFrameSize, cfgA.SendQueueBytes = 256<<10, 512<<10
	a := startNode(t, cfgA, r, &recorder{})
	startNode(t, testConfig(t, ca, "b"), r, h)
	t.Cleanup(func() { once.Do(func() { close(release) }) }) // before the Close cleanups

	big := envTo(t, "slow@b", pb.Envelope_RECEIPT_NONE)
	var err error
	if big.Body, err = anypb.New(wrapperspb.Bytes(make([]byte, pad))); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 20*time.Second)
	// Fill the queue, until it has stayed full for 10 ticks: QUIC's
	// flow-control windows take some frames before the writer blocks.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for full := 0; full < 10; {
		switch err := a.Send(ctx, "b", big); {
		case errors.Is(err, transport.ErrQueueFull):
			full++
			select {
			case <-tick.C:
			case <-ctx.Done():
				t.Fatal("the queue did not stay full")
			}
		case err != nil:
			t.Fatalf("filling the queue: %v", err)
		default:
			full = 0
		}
	}

	// The receiver reads nothing, so the queue stays full: every attempt
	// is refused, and none encodes its 200 KiB frame.
	const attempts = 20
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := range attempts {
		err := a.Send(ctx, "b", big)
		var qf *transport.QueueFullError
		if !errors.As(err, &qf) || qf.Unit != "bytes" {
			t.Fatalf("attempt %d: err = %v, want a *QueueFullError by bytes", i, err)
		}
		if qf.RetryAfter < time.Millisecond || qf.RetryAfter > time.Second {
			t.Fatalf("attempt %d: RetryAfter = %v, want within [1ms, 1s]", i, qf.RetryAfter)
		}
	}
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > attempts*pad/4 {
		t.Fatalf("%d refused sends allocated %d bytes: they encoded their frames", attempts, got)
	}

	body := wrapperspb.Bytes(make([]byte, pad))
	if err := a.Admit("b", body); !errors.Is(err, transport.ErrQueueFull) {
		t.Fatalf("Admit(200 KiB) to the full queue = %v, want ErrQueueFull", err)
	}
	var qf *transport.QueueFullError
	if err := a.Admit("b", body); !errors.As(err, &qf) || qf.Peer != "b" {
		t.Fatalf("Admit = %v, want a *QueueFullError for b", err)
	}
	if err := a.Admit("c", body); err != nil {
		t.Fatalf("Admit to a node without a connection = %v, want nil (it never dials)", err)
	}

	// Once the peer reads again the queue drains and Admit lets the same
	// body through.
	once.Do(func() { close(release) })
	deadline := time.After(15 * time.Second)
	for a.Admit("b", body) != nil {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatal("Admit still refuses 15 s after the peer started reading")
		}
	}
	if err := a.Send(ctx, "b", big); err != nil {
		t.Fatalf("Send after the queue drained: %v", err)
	}
}
