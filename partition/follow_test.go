package partition_test

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/partition"
)

// firstAlone makes the fake's first call wait until the relay decided
// whether to send the stream's next emission before its receipts (it must
// not: the stream has not come back clean yet).
func firstAlone(t *testing.T, rg *rig) {
	decided := make(chan bool, 1)
	var once sync.Once
	rg.relay.OnFollow(func(_ uint64, sent bool) { once.Do(func() { decided <- sent }) })
	rg.fake.set(func(f *fake) {
		hold := f.intercept
		f.intercept = func(ctx context.Context, n int, envs []*pb.Envelope) ([]*pb.Receipt, error, bool) {
			if n == 0 {
				select {
				case sent := <-decided:
					if sent {
						t.Error("the stream's first emission was followed before its receipts")
					}
				case <-ctx.Done():
				}
			}
			if hold == nil {
				return nil, nil, false
			}
			return hold(ctx, n, envs)
		}
	})
}

// laneRig is a rig whose fake says when an emission is queued and takes a
// recipient's emissions in that order, as the transport does. A draining
// stream's first emission goes alone (BatchSize, 4); once it came back
// clean, the relay sends each next emission before the receipts of the
// one in flight, in emissions of half of BatchSize.
func laneRig(t *testing.T) *rig {
	rg := newRig(t, nil, func(c *partition.Config) { c.BatchSize = 4 })
	rg.fake.set(func(f *fake) { f.lane = true })
	return rg
}

// held is the call holdUntilFollowed holds: a drain's second emission,
// the first that another follows early.
const held = 1

// holdUntilFollowed makes the fake's call held wait until the next one
// came (sent before its receipts), then runs answer, if set, on it.
func holdUntilFollowed(t *testing.T, rg *rig, answer func(f *fake, envs []*pb.Envelope) []*pb.Receipt) {
	rg.fake.set(func(f *fake) {
		f.intercept = func(_ context.Context, n int, envs []*pb.Envelope) ([]*pb.Receipt, error, bool) {
			if n != held {
				return nil, nil, false
			}
			testutil.WaitFor(t, wait, "the next emission sent before these receipts", func() bool { return f.callCount() > held+1 })
			if answer == nil {
				return nil, nil, false
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			return answer(f, envs), nil, true
		}
	})
}

// also runs intercept on call n before the one already set.
func also(rg *rig, n int, intercept func(ctx context.Context, envs []*pb.Envelope) ([]*pb.Receipt, error)) {
	rg.fake.set(func(f *fake) {
		hold := f.intercept
		f.intercept = func(ctx context.Context, c int, envs []*pb.Envelope) ([]*pb.Receipt, error, bool) {
			if c == n {
				rcs, err := intercept(ctx, envs)
				return rcs, err, true
			}
			return hold(ctx, c, envs)
		}
	})
}

// chained checks that every emission either starts at the frontier or
// names the last message of the one before it.
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

// drain queues msgs for a@n1, starts the relay and checks that each ran
// once, in order.
func drain(t *testing.T, rg *rig, msgs []string) {
	t.Helper()
	rg.queue(t, "a@n1", msgs...)
	rg.relay.Start()
	testutil.WaitFor(t, wait, "drained", func() bool { return rg.store.Stats().Depth == 0 })
	if got := rg.fake.ranTypes("a@n1"); !slices.Equal(got, msgs) {
		t.Fatalf("ran %v, want %v (restores %d)", got, msgs, rg.relay.Stats().Restores)
	}
}

// A draining stream's next emission goes while the one before awaits its
// receipts, chained to its last message; everything runs once, in order.
// The stream's first emission goes alone: a restore shows in it, and a
// watermark of a sequence sent early (its receipts lost) would look like
// one the stream set.
func TestNextEmissionGoesBeforeTheReceipts(t *testing.T) {
	rg := laneRig(t)
	holdUntilFollowed(t, rg, nil)
	firstAlone(t, rg)
	msgs := names("m", 20)
	drain(t, rg, msgs)
	calls := rg.fake.callsSnapshot()
	chained(t, calls)
	if p := calls[1].envs[0].GetPrevSequence(); p != 0 {
		t.Fatalf("the second emission starts after %d, want the first alone and the second at the frontier", p)
	}
	first, next := calls[held].envs, calls[held+1].envs
	if p, last := next[0].GetPrevSequence(), first[len(first)-1].GetSequence(); p != last || len(next) != 2 {
		t.Fatalf("emissions of %d then %d after %d, want 2 then 2 after the first's last %d", len(first), len(next), p, last)
	}
	if st := rg.relay.Stats(); st.Pipelined == 0 || rg.fake.maxFlight["a@n1"] != 2 {
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
	rg := laneRig(t)
	failed := false
	rg.fake.set(func(f *fake) {
		f.handlers["a@n1"] = func(e *pb.Envelope) *pb.Receipt {
			if e.GetType() == "m005" && !failed {
				failed = true
				return &pb.Receipt{MsgId: e.GetMsgId(), Code: pb.Receipt_TRANSIENT, Message: "once"}
			}
			return nil
		}
	})
	holdUntilFollowed(t, rg, nil)
	msgs := names("m", 12)
	drain(t, rg, msgs)
	if dl := rg.store.Stats().DeadLettered; dl != 0 {
		t.Fatalf("%d dead-lettered", dl)
	}
	chained(t, rg.fake.callsSnapshot())
	if c := rg.fake.codes(); c[pb.Receipt_OUT_OF_ORDER] == 0 {
		t.Fatalf("receipts %v: the emission after the failure was not refused", c)
	}
}

// An emission that shows a restore (new epoch) had one after it in
// flight: that one's receipts speak of the old epoch, DUPLICATE ones
// included, and none of it is acked; every message runs in the new epoch.
func TestNextEmissionAfterARestoreIsSentAgain(t *testing.T) {
	rg := laneRig(t)
	holdUntilFollowed(t, rg, func(f *fake, envs []*pb.Envelope) []*pb.Receipt {
		rcs, _ := every(pb.Receipt_DUPLICATE, 0, 1<<60)(context.Background(), envs)
		return rcs
	})
	also(rg, held+1, func(ctx context.Context, envs []*pb.Envelope) ([]*pb.Receipt, error) {
		// The old epoch's receiver had seen these too.
		return every(pb.Receipt_DUPLICATE, 0, int64(envs[len(envs)-1].GetSequence()))(ctx, envs)
	})
	drain(t, rg, names("m", 12))
	if st := rg.relay.Stats(); st.Restores != 1 {
		t.Fatalf("restores %d, want 1", st.Restores)
	}
}

// theNextRan answers the held emission as a receiver that ran it and the
// one after it before it answered: its receipts carry the watermark of the
// second's last message.
func theNextRan(f *fake, envs []*pb.Envelope) []*pb.Receipt {
	next := f.calls[len(f.calls)-1].envs
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
}

// The receipts of an emission may carry a watermark of the one sent after
// it (the receiver ran both before the first's receipts went out): a
// sequence this stream sent, not a restore.
func TestWatermarkOfTheNextEmissionIsNoRestore(t *testing.T) {
	rg := laneRig(t)
	holdUntilFollowed(t, rg, theNextRan)
	drain(t, rg, names("m", 12))
	if st := rg.relay.Stats(); st.Restores != 0 {
		t.Fatalf("restores %d, want 0", st.Restores)
	}
}

// As above, but the next emission's receipts are lost: the first is acked
// (the watermark is still one this stream set), the next goes again in
// the same epoch and the receiver answers DUPLICATE.
func TestWatermarkOfALostNextEmissionIsNoRestore(t *testing.T) {
	rg := laneRig(t)
	holdUntilFollowed(t, rg, theNextRan)
	also(rg, held+1, func(context.Context, []*pb.Envelope) ([]*pb.Receipt, error) {
		return nil, errUnreachable // ran (above), its receipts lost
	})
	drain(t, rg, names("m", 12))
	if st := rg.relay.Stats(); st.Restores != 0 {
		t.Fatalf("restores %d, want 0", st.Restores)
	}
	if c := rg.fake.codes(); c[pb.Receipt_DUPLICATE] == 0 {
		t.Fatalf("receipts %v: nothing was sent again", c)
	}
}

// A restored sender (its outbox and sequence file went back to before it
// sent anything to a@n1) meets a receiver whose watermark, in epoch 0, is
// 5: sequences 1..5 ran there for messages this sender no longer has.
// The receiver answers as package node does: a sequence below the
// watermark is DUPLICATE (taken for a copy), the watermark's own sequence
// with other contents is DIVERGED, and so is everything after it. The
// stream's first emission goes alone, and watermark 5 above it shows the
// restore: every message runs in a new epoch. Had [5,6] gone before
// [1..4]'s receipts and its own receipts been lost, 5 would have looked
// like a sequence this stream set, [1..4]'s DUPLICATEs would have been
// acked and m000..m003 would never have run.
func TestRestoreShowsInTheFirstEmission(t *testing.T) {
	rg := newRig(t, nil, func(c *partition.Config) { c.BatchSize = 4 })
	const w = 5
	rg.fake.set(func(f *fake) {
		f.lane = true
		f.intercept = func(_ context.Context, n int, envs []*pb.Envelope) ([]*pb.Receipt, error, bool) {
			if envs[0].GetStreamEpoch() != 0 {
				return nil, nil, false // a new epoch: the fake's own rules
			}
			if n > 0 {
				return nil, errUnreachable, true // anything sent early: its receipts lost
			}
			rcs := make([]*pb.Receipt, len(envs))
			for i, e := range envs {
				c := pb.Receipt_DUPLICATE
				if e.GetSequence() >= w {
					c = pb.Receipt_DIVERGED
				}
				rcs[i] = &pb.Receipt{MsgId: e.GetMsgId(), Code: c, Watermark: w}
			}
			return rcs, nil, true
		}
	})
	firstAlone(t, rg)
	rg.runToNewEpoch(t, names("m", 8))
}
