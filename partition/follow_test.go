package partition_test

import (
	"context"
	"slices"
	"testing"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/partition"
)

// laneRig is a rig whose fake says when an emission is queued and takes a
// recipient's emissions in that order, as the transport does: the relay
// sends a draining stream's next emission before the receipts of the one
// in flight. Emissions of a drain are then half of BatchSize (4).
func laneRig(t *testing.T, rmut func(*partition.Config)) *rig {
	rg := newRig(t, nil, func(c *partition.Config) {
		c.BatchSize = 4
		if rmut != nil {
			rmut(c)
		}
	})
	rg.fake.set(func(f *fake) { f.lane = true })
	return rg
}

// holdUntilFollowed makes the fake's first Deliver wait until a second one
// came (sent before the first's receipts), then runs answer, if set, on it.
func holdUntilFollowed(t *testing.T, rg *rig, answer func(f *fake, envs []*pb.Envelope) []*pb.Receipt) {
	rg.fake.set(func(f *fake) {
		f.intercept = func(_ context.Context, n int, envs []*pb.Envelope) ([]*pb.Receipt, error, bool) {
			if n != 0 {
				return nil, nil, false
			}
			testutil.WaitFor(t, wait, "the next emission sent before these receipts", func() bool { return f.callCount() >= 2 })
			if answer == nil {
				return nil, nil, false
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			return answer(f, envs), nil, true
		}
	})
}

// chained checks that every emission after the first either starts at the
// frontier or names the last message of the one before it.
func chained(t *testing.T, calls []call) {
	t.Helper()
	for i, c := range calls {
		for j, e := range c.envs {
			if j > 0 && e.GetPrevSequence() != c.envs[j-1].GetSequence() {
				t.Fatalf("call %d message %d: prev_sequence %d, want %d", i, j, e.GetPrevSequence(), c.envs[j-1].GetSequence())
			}
		}
		if p := c.envs[0].GetPrevSequence(); p != 0 && (i == 0 || p != calls[i-1].envs[len(calls[i-1].envs)-1].GetSequence()) {
			t.Fatalf("call %d starts after %d, not at the frontier nor after the call before it", i, p)
		}
	}
}

// A draining stream's next emission goes while the one before awaits its
// receipts, chained to its last message; everything runs once, in order.
func TestNextEmissionGoesBeforeTheReceipts(t *testing.T) {
	rg := laneRig(t, nil)
	holdUntilFollowed(t, rg, nil)
	msgs := names("m", 20)
	rg.queue(t, "a@n1", msgs...)
	rg.relay.Start()
	testutil.WaitFor(t, wait, "drained", func() bool { return rg.store.Stats().Depth == 0 })
	if got := rg.fake.ranTypes("a@n1"); !slices.Equal(got, msgs) {
		t.Fatalf("ran %v, want %v", got, msgs)
	}
	calls := rg.fake.callsSnapshot()
	chained(t, calls)
	// The first emission is sent before the relay knows its Deliverer
	// queues in order; from then on a drain's emissions are of 2.
	if p, last := calls[1].envs[0].GetPrevSequence(), calls[0].envs[len(calls[0].envs)-1].GetSequence(); p != last || len(calls[1].envs) != 2 {
		t.Fatalf("second emission of %d after %d, want 2 after the first's last %d", len(calls[1].envs), p, last)
	}
	st := rg.relay.Stats()
	if st.Pipelined == 0 || rg.fake.maxFlight["a@n1"] != 2 {
		t.Fatalf("pipelined %d, at most %d emissions at once: want two", st.Pipelined, rg.fake.maxFlight["a@n1"])
	}
	if c := rg.fake.codes(); c[pb.Receipt_OUT_OF_ORDER] != 0 || c[pb.Receipt_DUPLICATE] != 0 {
		t.Fatalf("receipts %v: an emission overtook the one before it, or was sent twice", c)
	}
}

// When an emission fails, the one sent after it is refused by the
// receiver (its predecessor did not run) and nothing of it is charged: it
// is sent again from the frontier, and each message runs once, in order.
func TestNextEmissionAfterAFailureIsSentAgain(t *testing.T) {
	rg := laneRig(t, nil)
	failed := false
	rg.fake.set(func(f *fake) {
		f.handlers["a@n1"] = func(e *pb.Envelope) *pb.Receipt {
			if e.GetType() == "m001" && !failed {
				failed = true
				return &pb.Receipt{MsgId: e.GetMsgId(), Code: pb.Receipt_TRANSIENT, Message: "once"}
			}
			return nil
		}
	})
	holdUntilFollowed(t, rg, nil)
	msgs := names("m", 12)
	rg.queue(t, "a@n1", msgs...)
	rg.relay.Start()
	testutil.WaitFor(t, wait, "drained", func() bool { return rg.store.Stats().Depth == 0 })
	if got := rg.fake.ranTypes("a@n1"); !slices.Equal(got, msgs) {
		t.Fatalf("ran %v, want %v", got, msgs)
	}
	if dl := rg.store.Stats().DeadLettered; dl != 0 {
		t.Fatalf("%d dead-lettered", dl)
	}
	calls := rg.fake.callsSnapshot()
	chained(t, calls)
	if c := rg.fake.codes(); c[pb.Receipt_OUT_OF_ORDER] == 0 {
		t.Fatalf("receipts %v: the emission after the failure was not refused", c)
	}
}

// An emission that shows a restore (new epoch) had one after it in
// flight: that one's receipts speak of the old epoch, DUPLICATE ones
// included, and none of it is acked; every message runs in the new epoch.
func TestNextEmissionAfterARestoreIsSentAgain(t *testing.T) {
	rg := laneRig(t, nil)
	holdUntilFollowed(t, rg, func(f *fake, envs []*pb.Envelope) []*pb.Receipt {
		rcs, _ := every(pb.Receipt_DUPLICATE, 0, 1<<40)(context.Background(), envs)
		return rcs
	})
	rg.fake.set(func(f *fake) {
		hold := f.intercept
		f.intercept = func(ctx context.Context, n int, envs []*pb.Envelope) ([]*pb.Receipt, error, bool) {
			if n == 1 {
				// The old epoch's receiver had seen these too.
				rcs, _ := every(pb.Receipt_DUPLICATE, 0, int64(envs[len(envs)-1].GetSequence()))(ctx, envs)
				return rcs, nil, true
			}
			return hold(ctx, n, envs)
		}
	})
	msgs := names("m", 8)
	rg.runToNewEpoch(t, msgs)
}

// The receipts of an emission may carry a watermark of the one sent after
// it (the receiver ran both before the first's receipts went out): a
// sequence this stream sent, not a restore.
func TestWatermarkOfTheNextEmissionIsNoRestore(t *testing.T) {
	rg := laneRig(t, nil)
	holdUntilFollowed(t, rg, func(f *fake, envs []*pb.Envelope) []*pb.Receipt {
		next := f.calls[1].envs
		rcs := make([]*pb.Receipt, len(envs))
		for i, e := range envs {
			rcs[i] = f.receive(e)
		}
		for _, e := range next {
			f.receive(e)
		}
		for _, rc := range rcs {
			rc.Watermark = next[len(next)-1].GetSequence()
		}
		return rcs
	})
	msgs := names("m", 8)
	rg.queue(t, "a@n1", msgs...)
	rg.relay.Start()
	rg.noRestore(t, msgs)
}
