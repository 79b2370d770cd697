package transport_test

import (
	"math/rand"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
)

// Every lane has large frames queued for a recipient whose handler is now
// quick, now slower than the stall rule (so its lane's slot is taken over
// mid-frame, again and again), with one slot: every frame arrives, the
// connection is never closed for a frame read timeout, and the gate ends
// with its slot free and no lane waiting.
func TestOneSlotManyLanesHandlersSometimesSlowerThanTheStall(t *testing.T) {
	ca := newCA(t)
	r := newResolver()
	var got atomic.Int64
	h := handlerFunc(func(from transport.PeerInfo, env *pb.Envelope, reply func(*pb.Receipt)) {
		// The recipient's work: its duration is in the envelope.
		time.Sleep(time.Duration(env.GetTtlMs()) * time.Millisecond)
		got.Add(1)
	})
	scfg := bulkConfig(t, ca, "srv")
	scfg.MaxReadBytes = scfg.MaxFrameSize // one slot
	srv := startNode(t, scfg, r, h)
	good := startNode(t, bulkConfig(t, ca, "good"), r, &recorder{})
	if err := good.Send(ctxT(t, 5*time.Second), "srv", envTo(t, "warm@srv", pb.Envelope_RECEIPT_NONE)); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "warm-up", func() bool { return got.Load() == 1 })
	id := transport.ConnID(good.Transport, "srv")
	rng := rand.New(rand.NewSource(7))
	sizes := []int{16<<10 + 1, 40 << 10, 300 << 10, 900 << 10}
	var wg sync.WaitGroup
	want := int64(1)
	for _, to := range oneRecipientPerLane("f", good.cfg.Lanes) {
		var envs []*pb.Envelope
		for i := 0; i < 6; i++ {
			env := envTo(t, to, pb.Envelope_RECEIPT_NONE)
			env.Body = largeBody(t, sizes[rng.Intn(len(sizes))])
			env.TtlMs = []int64{0, 30, 1300}[rng.Intn(3)]
			envs = append(envs, env)
		}
		want += int64(len(envs))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, env := range envs {
				if err := good.Send(ctxT(t, 60*time.Second), "srv", env); err != nil {
					t.Errorf("send to %s: %v", to, err)
				}
			}
		}()
	}
	wg.Wait()
	start := time.Now()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("after %v: got %d of %d; good logs:\n%s\nsrv logs:\n%s", time.Since(start), got.Load(), want, good.logs.String(), srv.logs.String())
		}
	})
	testutil.WaitFor(t, 90*time.Second, "every frame", func() bool { return got.Load() == want })
	if now := transport.ConnID(good.Transport, "srv"); now != id {
		t.Fatalf("the connection was replaced (%x, then %x)", id, now)
	}
	testutil.WaitFor(t, 10*time.Second, "the gate's slot free", func() bool {
		_, free, held, waiting := transport.LargeGate(good.Transport, "srv")
		return free == 1 && held == 0 && waiting == 0
	})
	t.Logf("all %d in %v", want, time.Since(start))
}
