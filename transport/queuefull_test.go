package transport_test

import (
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// A send the full queue refuses costs no encoding, Admit refuses a large
// body before anyone marshals it, and both say when to come back. A
// sender retrying large messages against a full queue used to spend a
// copy of each on every attempt, which starved the connection draining it.
func TestQueueFullRefusesBeforeEncoding(t *testing.T) {
	const pad = 200 << 10
	p := stalledPair(t, nil)
	a := p.a
	big := bigEnv(t, pad)
	ctx := ctxT(t, 20*time.Second)
	fillQueue(t, a, big)

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
	p.release()
	waitCond(t, 15*time.Second, "Admit letting the body through once the peer reads", func() bool { return a.Admit("b", body) == nil })
	if err := a.Send(ctx, "b", big); err != nil {
		t.Fatalf("Send after the queue drained: %v", err)
	}
}

// blockedPair is a pair of transports: a, whose send queue holds 512 KiB and
// frames up to 256 KiB, and b, whose handler blocks (while stall says so)
// until release.
type blockedPair struct {
	a       *node
	ca      *transport.CA
	r       *fakeResolver
	release func() // idempotent; also runs at cleanup, before the nodes close
}

func stalledPair(t *testing.T, stall func() bool) blockedPair {
	t.Helper()
	p := blockedPair{ca: newCA(t), r: newResolver()}
	ch := make(chan struct{})
	var once sync.Once
	p.release = func() { once.Do(func() { close(ch) }) }
	h := handlerFunc(func(transport.PeerInfo, *pb.Envelope, func(*pb.Receipt)) {
		if stall == nil || stall() {
			<-ch
		}
	})
	cfgA := testConfig(t, p.ca, "a")
	cfgA.MaxFrameSize, cfgA.SendQueueBytes = 256<<10, 512<<10
	p.a = startNode(t, cfgA, p.r, &recorder{})
	startNode(t, testConfig(t, p.ca, "b"), p.r, h)
	t.Cleanup(p.release)
	return p
}
