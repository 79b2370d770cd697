package transport_test

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func waitCond(t *testing.T, d time.Duration, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", d, what)
		}
		<-tick.C
	}
}

// Many senders on many lanes push frames around the crowded threshold to a
// peer that reads; once all is written, the queue's counters must be 0 and
// nothing crowded. Then a stalled, crowded connection is closed in the
// ways a connection ends (ClosePeer, the peer closing): the transport's
// crowded count must return to 0.
func TestQueueCountersSettle(t *testing.T) {
	ca := newCA(t)
	r := newResolver()
	release := make(chan struct{})
	var once sync.Once
	var stall atomic.Bool
	var got atomic.Int64
	h := handlerFunc(func(transport.PeerInfo, *pb.Envelope, func(*pb.Receipt)) {
		got.Add(1)
		if stall.Load() {
			<-release
		}
	})
	cfgA := testConfig(t, ca, "a")
	cfgA.MaxFrameSize, cfgA.SendQueueBytes = 64<<10, 192<<10
	a := startNode(t, cfgA, r, &recorder{})
	b := startNode(t, testConfig(t, ca, "b"), r, h)
	t.Cleanup(func() { once.Do(func() { close(release) }) })

	ctx := ctxT(t, 25*time.Second)
	const senders, each = 16, 150
	var wg sync.WaitGroup
	var sent atomic.Int64
	for s := range senders {
		wg.Go(func() {
			for i := range each {
				e := envTo(t, fmt.Sprintf("r%d@b", s), pb.Envelope_RECEIPT_NONE)
				body, _ := anypb.New(wrapperspb.Bytes(make([]byte, 8<<10+(i*977)%(48<<10))))
				e.Body = body
				for {
					err := a.Send(ctx, "b", e)
					var qf *transport.QueueFullError
					if err == nil {
						sent.Add(1)
						break
					}
					if !errors.As(err, &qf) {
						t.Errorf("send: %v", err)
						return
					}
					if qf.RetryAfter < time.Millisecond || qf.RetryAfter > time.Second {
						t.Errorf("RetryAfter %v", qf.RetryAfter)
					}
					time.Sleep(qf.RetryAfter)
				}
			}
		})
	}
	wg.Wait()
	waitCond(t, 15*time.Second, "not all delivered", func() bool { return got.Load() == sent.Load() })
	waitCond(t, 5*time.Second, "queue counters did not settle", func() bool {
		ok, q, qb, cr, _ := transport.QueueState(a.Transport, "b")
		return ok && q == 0 && qb == 0 && !cr && transport.CrowdedConns(a.Transport) == 0
	})

	// Stall and crowd, then ClosePeer.
	stall.Store(true)
	fillQueue(t, a, bigEnv(t, 40<<10))
	if n := transport.CrowdedConns(a.Transport); n != 1 {
		t.Fatalf("crowded conns %d, want 1", n)
	}
	a.ClosePeer("b", "test")
	waitCond(t, 5*time.Second, "crowded count after ClosePeer", func() bool { return transport.CrowdedConns(a.Transport) == 0 })

	// Reconnect, crowd again, and let b go away.
	fillQueue(t, a, bigEnv(t, 40<<10))
	if n := transport.CrowdedConns(a.Transport); n != 1 {
		t.Fatalf("crowded conns %d, want 1", n)
	}
	once.Do(func() { close(release) })
	stall.Store(false)
	_ = b.Close()
	waitCond(t, 10*time.Second, "crowded count after b closed", func() bool { return transport.CrowdedConns(a.Transport) == 0 })
}
