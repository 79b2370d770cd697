package partition_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/partition"
)

// roomRig is a lane rig of BatchSize 8 (half: 4) whose receiver says its
// mailbox room in its receipts (room; each receipt saying that nothing
// after its own message had arrived) over a link of round trip rtt. Each
// call but the first is held until the one after it came, or until the
// relay decided not to send one early, or until every message was sent:
// so each emission is still in flight when the relay decides on the one
// after it.
func roomRig(t *testing.T, room uint32, rtt time.Duration, total int) *rig {
	rg := newRig(t, nil, func(c *partition.Config) { c.BatchSize = 8 })
	var mu sync.Mutex
	notSent := map[uint64]bool{} // the tops of emissions nothing went behind
	rg.relay.OnFollow(func(top uint64, sent bool) {
		mu.Lock()
		defer mu.Unlock()
		if !sent {
			notSent[top] = true
		}
	})
	sent := func(f *fake) int {
		seen := map[uint64]bool{}
		for _, c := range f.calls {
			for _, e := range c.envs {
				seen[e.GetSequence()] = true
			}
		}
		return len(seen)
	}
	rg.fake.set(func(f *fake) {
		f.lane, f.room, f.minRTT = true, room, rtt
		f.intercept = func(_ context.Context, n int, envs []*pb.Envelope) ([]*pb.Receipt, error, bool) {
			if n == 0 {
				return nil, nil, false
			}
			top := envs[len(envs)-1].GetSequence()
			testutil.WaitFor(t, wait, "the next emission, or the relay's word that none goes early", func() bool {
				mu.Lock()
				none := notSent[top]
				mu.Unlock()
				f.mu.Lock()
				defer f.mu.Unlock()
				return len(f.calls) > n+1 || none || sent(f) == total
			})
			return nil, nil, false
		}
	})
	return rg
}

// afters returns the calls that the relay sent early after reading the
// receipts of the emission before the one in flight: each is chained to a
// call itself chained to the one before it. With them, the call in
// flight when each went.
func afters(calls []call) (after, inFlight [][]*pb.Envelope) {
	chainedTo := func(i int) bool {
		prev := calls[i-1].envs
		return i > 0 && calls[i].envs[0].GetPrevSequence() == prev[len(prev)-1].GetSequence()
	}
	for i := 2; i < len(calls); i++ {
		if chainedTo(i) && chainedTo(i-1) {
			after, inFlight = append(after, calls[i].envs), append(inFlight, calls[i-1].envs)
		}
	}
	return after, inFlight
}

// A receiver that says its mailbox holds 5 more, none of the emission in
// flight having reached it yet, gets no more early than fits beside that
// emission: the two never hold more than 5 (half of BatchSize each, 8,
// before receivers said their room). Everything runs once, in order.
func TestEarlyEmissionsKeepToTheRoomTheReceiverSays(t *testing.T) {
	msgs := names("m", 60)
	rg := roomRig(t, 5, 0, len(msgs))
	drain(t, rg, msgs)
	calls := rg.fake.callsSnapshot()
	chained(t, calls)
	after, inFlight := afters(calls)
	if len(after) == 0 {
		t.Fatalf("nothing went early after receipts that said the room (%d emissions)", len(calls))
	}
	for i := range after {
		if n := len(inFlight[i]) + len(after[i]); n > 5 {
			t.Fatalf("an emission of %d went early beside one of %d in flight: %d, the room said 5", len(after[i]), len(inFlight[i]), n)
		}
	}
}

// Room for less than an eighth of BatchSize beside the emission in flight:
// nothing goes early; the stream's next emission waits for the receipts.
func TestNothingEarlyWithoutRoomForIt(t *testing.T) {
	msgs := names("m", 40)
	rg := roomRig(t, 3, 0, len(msgs))
	drain(t, rg, msgs)
	calls := rg.fake.callsSnapshot()
	chained(t, calls)
	if after, inFlight := afters(calls); len(after) > 0 {
		t.Fatalf("an emission of %d went early beside one of %d in flight, the room said 3", len(after[0]), len(inFlight[0]))
	}
	if rg.relay.Stats().Pipelined == 0 {
		t.Fatal("no emission went early at all: the rig held nothing in flight")
	}
}

// Over a link whose round trip is long against the pace the receiver
// answers at, what the receiver takes while an emission travels counts as
// room too: early emissions take BatchSize.
func TestEarlyEmissionsFillALongRoundTrip(t *testing.T) {
	msgs := names("m", 60)
	rg := roomRig(t, 1000, time.Hour, len(msgs))
	drain(t, rg, msgs)
	calls := rg.fake.callsSnapshot()
	chained(t, calls)
	after, _ := afters(calls)
	full := 0
	for _, a := range after {
		if len(a) == 8 {
			full++
		}
	}
	if full == 0 {
		t.Fatalf("no early emission took BatchSize (8) over a long round trip; early: %d", len(after))
	}
}
