package partition_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
	"github.com/meshnode/meshnode/partition"
)

// lossy wraps the fake: after the receiver took an emission, it may lose
// all or the tail of its receipts (they ran, the sender does not learn).
// (Random, seeded: a chaos test of the early emissions.)
type lossy struct {
	f   *fake
	mu  sync.Mutex
	rnd *rand.Rand
}

func (l *lossy) Alive(node string) bool { return l.f.Alive(node) }

func (l *lossy) Deliver(ctx context.Context, node string, envs []*pb.Envelope) ([]*pb.Receipt, error) {
	rcs, err := l.f.Deliver(ctx, node, envs)
	l.mu.Lock()
	x := l.rnd.IntN(10)
	cut := 0
	if len(rcs) > 0 {
		cut = l.rnd.IntN(len(rcs))
	}
	l.mu.Unlock()
	switch x {
	case 0:
		return nil, errUnreachable
	case 1:
		return rcs[:cut], errUnreachable
	}
	return rcs, err
}

// A drain whose emissions go early, through lost receipts (all or the
// tail of them, after the receiver ran the messages), handler failures,
// full mailboxes and direct attempts made meanwhile: each message runs
// once, in order, none is dead-lettered and nothing looks like a restore.
func TestEarlyEmissionsThroughLossAndFailures(t *testing.T) {
	var early uint64
	t.Cleanup(func() {
		if early == 0 && !t.Failed() {
			t.Error("no emission went early in any seed")
		}
	})
	for seed := uint64(1); seed <= 20; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rg := newRig(t, func(c *outbox.Config) { c.MaxAttempts = 1000 }, nil)
			rnd := rand.New(rand.NewPCG(seed, 7))
			var hmu sync.Mutex
			rg.fake.set(func(f *fake) {
				f.lane = true
				f.handlers["a@n1"] = func(e *pb.Envelope) *pb.Receipt {
					hmu.Lock()
					x := rnd.IntN(20)
					hmu.Unlock()
					switch x {
					case 0:
						return &pb.Receipt{MsgId: e.GetMsgId(), Code: pb.Receipt_TRANSIENT, Message: "chaos"}
					case 1:
						return &pb.Receipt{MsgId: e.GetMsgId(), Code: pb.Receipt_CAPACITY, RetryAfterMs: 1}
					}
					return nil
				}
			})
			l := &lossy{f: rg.fake, rnd: rand.New(rand.NewPCG(seed, 9))}
			rcfg := partition.DefaultConfig()
			rcfg.Backoff = fastBackoff
			rcfg.Logger = quiet
			rcfg.BatchSize = 4
			rcfg.DeliverTimeout = time.Second
			r, err := partition.New(rcfg, rg.store, l)
			if err != nil {
				t.Fatal(err)
			}
			_ = rg.relay.Close()
			rg.relay = r
			t.Cleanup(func() { _ = r.Close() })
			msgs := names("m", 60)
			rg.queue(t, "a@n1", msgs[:30]...)
			r.Start()
			// More while it drains, with direct attempts when settled.
			for _, m := range msgs[30:] {
				if _, err := r.Send(context.Background(), rg.msg("a@n1", m), true); err != nil {
					t.Fatal(err)
				}
			}
			testutil.WaitFor(t, wait, "drained", func() bool { return rg.store.Stats().Depth == 0 })
			got := rg.fake.ranTypes("a@n1")
			if !slices.Equal(got, msgs) {
				t.Fatalf("ran %v\nwant %v\n(restores %d, dead %d, pipelined %d)", got, msgs, r.Stats().Restores, rg.store.Stats().DeadLettered, r.Stats().Pipelined)
			}
			if d := rg.store.Stats().DeadLettered; d != 0 {
				t.Fatalf("%d dead-lettered", d)
			}
			if s := r.Stats(); s.Restores != 0 {
				t.Fatalf("restores %d", s.Restores)
			}
			early += r.Stats().Pipelined
		})
	}
}
