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

// A stalled lane's slot is taken over, the stall ends and every queued
// frame (sizes at, around and far above the threshold, many lanes) is
// delivered: the gate then has all its slots free again, none held, no
// lane waiting. A slot counted twice (the taken-over holder's release) or
// lost would show here, and large frames would stop (or overrun the
// peer's budget) for the rest of the connection.
func TestLargeGateSlotsAllFreeAfterStallTakeoversAndDrain(t *testing.T) {
	bothSlotCounts(t, largeGateSlotsAllFreeAfterStallTakeoversAndDrain)
}

func largeGateSlotsAllFreeAfterStallTakeoversAndDrain(t *testing.T, oneSlot bool) {
	s := setupStalled(t, oneSlot)
	ok, free0, held0, _ := transport.LargeGate(s.good.Transport, "srv")
	if !ok {
		t.Fatal("no connection")
	}
	slots := free0 + held0
	t.Logf("slots %d (free %d, held %d) while the slow lane is stalled", slots, free0, held0)
	lanes := s.good.cfg.Lanes
	sizes := []int{16<<10 - 40, 16<<10 - 8, 16 << 10, 16<<10 + 1, 64<<10 - 3, 64 << 10, 64<<10 + 5, 300 << 10, 10}
	var wg sync.WaitGroup
	want := 0
	seen := map[int]bool{}
	for i := 0; len(seen) < lanes-1; i++ {
		to := fmt.Sprintf("g%d@srv", i)
		l := transport.LaneOf(to, lanes)
		if seen[l] || l == transport.LaneOf(slowRecipient, lanes) {
			continue
		}
		seen[l] = true
		var batch []*pb.Envelope
		for _, sz := range sizes {
			env := envTo(t, to, pb.Envelope_RECEIPT_NONE)
			env.Body = largeBody(t, sz)
			batch = append(batch, env)
		}
		want += len(batch)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, env := range batch {
				if err := s.good.Send(ctxT(t, 10*time.Second), "srv", env); err != nil {
					t.Errorf("send to %s: %v", to, err)
				}
			}
		}()
	}
	wg.Wait()
	testutil.WaitFor(t, 30*time.Second, "every other lane's frames", func() bool { return s.rec.count.Load() == int64(want) })
	s.release()
	testutil.WaitFor(t, 30*time.Second, "the queue drained", func() bool {
		f, b := transport.Queued(s.good.Transport, "srv")
		return f == 0 && b == 0
	})
	testutil.WaitFor(t, 10*time.Second, "all slots free", func() bool {
		_, free, held, waiting := transport.LargeGate(s.good.Transport, "srv")
		return free == slots && held == 0 && waiting == 0
	})
	// And large frames still flow on every lane afterwards.
	env := s.sendLarge(t, "after")
	testutil.WaitFor(t, 10*time.Second, "a large frame after the drain", func() bool {
		envs, _ := s.rec.snapshot()
		for _, e := range envs {
			if e.GetMsgId() == env.GetMsgId() {
				return true
			}
		}
		return false
	})
	if _, free, held, waiting := transport.LargeGate(s.good.Transport, "srv"); free != slots || held != 0 || waiting != 0 {
		t.Fatalf("gate after: free %d held %d waiting %d, want %d 0 0", free, held, waiting, slots)
	}
}
