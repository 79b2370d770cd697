package transport_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
)

// TestLargeFramesBothWaysOnEveryLane: two nodes send large frames to each
// other on every lane at once; all arrive.
func TestLargeFramesBothWaysOnEveryLane(t *testing.T) {
	ca := newCA(t)
	r := newResolver()
	ra, rb := &recorder{}, &recorder{}
	// Every lane writes at once, so the large-frame slots are always
	// wanted; on a busy machine (the race detector, other packages' tests
	// on 2 cores) a 64 KiB write can take seconds.
	a := startNode(t, bulkConfig(t, ca, "a"), r, ra)
	b := startNode(t, bulkConfig(t, ca, "b"), r, rb)
	// One connection first: how the two settle on one connection is not
	// what this test is about.
	if _, err := a.Request(ctxT(t, 5*time.Second), "b", envTo(t, "x@b", pb.Envelope_RECEIPT_ACCEPTED)); err != nil {
		t.Fatal(err)
	}
	ra.count.Store(0)
	rb.count.Store(0)
	lanes := a.cfg.Lanes
	payload := largeBody(t, 2<<20)
	var wg sync.WaitGroup
	for _, p := range []struct {
		from *node
		to   string
	}{{a, "b"}, {b, "a"}} {
		found := map[int]bool{}
		for i := 0; len(found) < lanes; i++ {
			name := fmt.Sprintf("r%d@%s", i, p.to)
			l := transport.LaneOf(name, lanes)
			if found[l] {
				continue
			}
			found[l] = true
			env := envTo(t, name, pb.Envelope_RECEIPT_NONE)
			env.Body = payload
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := p.from.Send(ctxT(t, 10*time.Second), p.to, env); err != nil {
					t.Errorf("send %s: %v", name, err)
				}
			}()
		}
	}
	wg.Wait()
	start := time.Now()
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		t.Logf("after %v: a got %d, b got %d of %d; a stats %+v; b stats %+v; a logs:\n%s\nb logs:\n%s", time.Since(start), ra.count.Load(), rb.count.Load(), lanes,
			a.PeerStats()["b"], b.PeerStats()["a"], a.logs.String(), b.logs.String())
	})
	// 64 MiB in all: alone it takes about 5 s under the race detector, and
	// several times that beside the other packages' tests on 2 cores.
	testutil.WaitFor(t, 60*time.Second, "all large frames both ways", func() bool {
		return ra.count.Load() == int64(lanes) && rb.count.Load() == int64(lanes)
	})
}

// TestFramesAroundTheLargeThresholdKeepOrder: frames just below, at and above the
// large threshold, mixed with small ones on one lane and with large ones on
// another, arrive complete and in order.
func TestFramesAroundTheLargeThresholdKeepOrder(t *testing.T) {
	ca := newCA(t)
	r := newResolver()
	rec := &recorder{}
	srv := startNode(t, testConfig(t, ca, "srv"), r, rec)
	good := startNode(t, testConfig(t, ca, "good"), r, &recorder{})
	_ = srv
	const to = "order@srv"
	other := otherLaneRecipient(t, "bulk", to, good.cfg.Lanes)
	var want []string
	k := 0
	for round := 0; round < 20; round++ {
		for _, size := range []int{16 << 10, 16<<10 - 30, 16<<10 - 20, 16<<10 - 10, 16<<10 + 1, 100, 200 << 10, 10} {
			env := envTo(t, to, pb.Envelope_RECEIPT_NONE)
			env.Body = largeBody(t, size)
			want = append(want, env.GetMsgId())
			if err := good.Send(ctxT(t, 5*time.Second), "srv", env); err != nil {
				t.Fatal(err)
			}
			k++
			if k%3 == 0 {
				o := envTo(t, other, pb.Envelope_RECEIPT_NONE)
				o.Body = largeBody(t, 300<<10)
				if err := good.Send(ctxT(t, 5*time.Second), "srv", o); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	testutil.WaitFor(t, 15*time.Second, "all frames", func() bool {
		envs, _ := rec.snapshot()
		n := 0
		for _, e := range envs {
			if e.GetRecipient() == to {
				n++
			}
		}
		return n == len(want)
	})
	envs, _ := rec.snapshot()
	var got []string
	for _, e := range envs {
		if e.GetRecipient() == to {
			got = append(got, e.GetMsgId())
		}
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("order broken at %d: got %s want %s", i, got[i], want[i])
		}
	}
}
