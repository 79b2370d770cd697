package partition_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/partition"
	"google.golang.org/protobuf/proto"
)

// roomRig is a lane rig of BatchSize 8 (half: 4) whose receiver says its
// mailbox room in its receipts (room; each receipt saying that nothing
// after its own message had arrived). Each
// call but the first is held until the one after it came, or until the
// relay decided not to send one early, or until every message was sent:
// so each emission is still in flight when the relay decides on the one
// after it.
func roomRig(t *testing.T, room uint32, total int) *rig {
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
		f.lane, f.room = true, room
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

// drainSaying drains n messages through a roomRig saying room, checks
// that each ran once, in order, every emission chained, and that from the
// second on (the first goes before anything was said) no emission, and
// no two in flight together, held more than room when room is under
// BatchSize. It returns the emissions sent early after receipts
// (afters).
func drainSaying(t *testing.T, room uint32, n int) (rg *rig, after, inFlight [][]*pb.Envelope) {
	t.Helper()
	msgs := names("m", n)
	rg = roomRig(t, room, n)
	drain(t, rg, msgs)
	calls := rg.fake.callsSnapshot()
	chained(t, calls)
	for i := 1; i < len(calls) && room < 8; i++ {
		held := len(calls[i].envs)
		if prev := calls[i-1].envs; i > 1 && calls[i].envs[0].GetPrevSequence() == prev[len(prev)-1].GetSequence() {
			held += len(prev) // sent behind it, before its receipts
		}
		if held > int(room) {
			t.Fatalf("emission %d of %d held %d in flight with the one before it; the room said %d", i, len(calls[i].envs), held, room)
		}
	}
	after, inFlight = afters(calls)
	return rg, after, inFlight
}

// A receiver that says its mailbox holds 5 more, none of the emission in
// flight having reached it yet, gets no more early than fits beside that
// emission: the two never hold more than 5 (half of BatchSize each, 8,
// before receivers said their room). Everything runs once, in order.
func TestEarlyEmissionsKeepToTheRoomTheReceiverSays(t *testing.T) {
	_, after, inFlight := drainSaying(t, 5, 60)
	if len(after) == 0 {
		t.Fatal("nothing went early after receipts that said the room")
	}
	for i := range after {
		if n := len(inFlight[i]) + len(after[i]); n > 5 {
			t.Fatalf("an emission of %d went early beside one of %d in flight: %d, the room said 5", len(after[i]), len(inFlight[i]), n)
		}
	}
}

// Room for less than an eighth of BatchSize beside the emission in flight:
// nothing goes early; each emission from the frontier takes the room (3
// of BatchSize 8) and the next waits for its receipts.
func TestNothingEarlyWithoutRoomForIt(t *testing.T) {
	rg, _, _ := drainSaying(t, 3, 40)
	if p := rg.relay.Stats().Pipelined; p > 0 {
		t.Fatalf("%d emissions went early beside one in flight, the room said 3", p)
	}
}

// A receiver whose mailbox holds two batches and more gets full early
// emissions (BatchSize), two in flight: over a long link, twice what half
// ones carry per round trip.
func TestEarlyEmissionsFillALargeMailbox(t *testing.T) {
	_, after, _ := drainSaying(t, 1000, 60)
	full := 0
	for _, a := range after {
		if len(a) == 8 {
			full++
		}
	}
	if full == 0 {
		t.Fatalf("no early emission took BatchSize (8) with room for 1000; early: %d", len(after))
	}
}

// saying is the lane fake behind a receiver that says what it likes in
// its receipts' room and arrived (say), its receipts coming back a little
// later, as over a link.
type saying struct {
	*fake
	mu  sync.Mutex
	rnd *rand.Rand
	say func(rnd *rand.Rand, envs []*pb.Envelope, rc *pb.Receipt)
}

func (d *saying) Deliver(ctx context.Context, node string, envs []*pb.Envelope) ([]*pb.Receipt, error) {
	rcs, err := d.fake.Deliver(ctx, node, envs)
	time.Sleep(300 * time.Microsecond) // the link's delay on the receipts, not a wait for a state
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]*pb.Receipt, len(rcs))
	for i, rc := range rcs {
		if rc != nil {
			out[i] = proto.Clone(rc).(*pb.Receipt)
			d.say(d.rnd, envs, out[i])
		}
	}
	return out, err
}

// Whatever room and arrived a receiver says, at any BatchSize, a drain
// runs every message once and in order and
// dead-letters none; the receiver refuses some (a full mailbox) now and
// then, so that early emissions are refused and sent again.
func TestAnyRoomSaidLosesNothing(t *testing.T) {
	says := map[string]func(rnd *rand.Rand, envs []*pb.Envelope, rc *pb.Receipt){
		"most room, last arrived": func(_ *rand.Rand, _ []*pb.Envelope, rc *pb.Receipt) {
			rc.Room, rc.Arrived = math.MaxUint32, math.MaxUint64
		},
		"most room, none arrived": func(_ *rand.Rand, _ []*pb.Envelope, rc *pb.Receipt) { rc.Room, rc.Arrived = math.MaxUint32, 0 },
		"no room":                 func(_ *rand.Rand, _ []*pb.Envelope, rc *pb.Receipt) { rc.Room, rc.Arrived = 0, 1 },
		"any": func(rnd *rand.Rand, _ []*pb.Envelope, rc *pb.Receipt) {
			rc.Room = []uint32{0, 1, 3, 7, 100, math.MaxUint32, rnd.Uint32()}[rnd.IntN(7)]
			rc.Arrived = []uint64{0, 1, math.MaxUint64, math.MaxUint64 - 1, rnd.Uint64(), rnd.Uint64N(10000)}[rnd.IntN(6)]
		},
		"arrived behind": func(rnd *rand.Rand, envs []*pb.Envelope, rc *pb.Receipt) {
			rc.Room, rc.Arrived = 1+rnd.Uint32N(20), envs[0].GetSequence()-min(envs[0].GetSequence(), 1000)
		},
		"arrived ahead": func(rnd *rand.Rand, envs []*pb.Envelope, rc *pb.Receipt) {
			rc.Room, rc.Arrived = 1+rnd.Uint32N(20), envs[len(envs)-1].GetSequence()+1+rnd.Uint64N(100)
		},
	}
	seed := uint64(0)
	for _, bs := range []int{1, 2, 8, 9, 64} {
		for sn, say := range says {
			for range 2 {
				seed++
				seed := seed
				t.Run(fmt.Sprintf("batch %d/%s", bs, sn), func(t *testing.T) {
					t.Parallel() // each its own store; they mostly wait on retries and fsync
					rg := newRigOver(t, nil, func(c *partition.Config) { c.BatchSize = bs }, func(f *fake) partition.Deliverer {
						return &saying{fake: f, rnd: rand.New(rand.NewPCG(seed, 37)), say: say}
					})
					var n int
					rg.fake.set(func(f *fake) {
						f.lane = true
						f.handlers["a@n1"] = func(e *pb.Envelope) *pb.Receipt {
							if n++; n%97 == 0 {
								return &pb.Receipt{MsgId: e.GetMsgId(), Code: pb.Receipt_CAPACITY, RetryAfterMs: 1}
							}
							return nil
						}
					})
					drain(t, rg, names("m", 150))
					if s := rg.store.Stats(); s.DLQDepth != 0 || s.DeadLettered != 0 {
						t.Fatalf("dead letters: %d", s.DeadLettered)
					}
				})
			}
		}
	}
}

// A receiver that was full for a moment (the receipts of a stream's first
// emission say room 0), then is heard through a path whose receipts say
// nothing of the room (a forwarder carries none; an older receiver): what
// was said is forgotten, and the stream drains in full and early
// emissions again. Remembered, it bounded every later emission to one
// message, none early (631 emissions for 640 messages).
func TestRoomNoLongerSaidIsForgotten(t *testing.T) {
	const bs, n = 64, 640
	var firstTop uint64 // the first emission's last message
	rg := newRigOver(t, nil, func(c *partition.Config) { c.BatchSize = bs }, func(f *fake) partition.Deliverer {
		return &saying{fake: f, rnd: rand.New(rand.NewPCG(1, 2)), say: func(_ *rand.Rand, envs []*pb.Envelope, rc *pb.Receipt) {
			if top := envs[len(envs)-1].GetSequence(); firstTop == 0 || firstTop == top {
				firstTop = top
				rc.Room, rc.Arrived = 0, top // full as its last ran
				return
			}
			rc.Room, rc.Arrived = 0, 0 // says nothing
		}}
	})
	rg.fake.set(func(f *fake) { f.lane = true })
	drain(t, rg, names("m", n))
	calls := rg.fake.callsSnapshot()
	chained(t, calls)
	if len(calls) > 4*n/bs {
		t.Fatalf("%d emissions for %d messages at BatchSize %d: the room said once (0) still bounds the stream", len(calls), n, bs)
	}
}
