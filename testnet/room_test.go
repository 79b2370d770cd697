package testnet

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/outbox"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// drainShape is a drain into a receiver that works for its messages:
// node 0 queues total messages for the sink on node 1 while it is down,
// the link gets delay each way, the sink comes back and drains (each
// message taking work in its handler, or batch messages at a time in a
// batch handler).
type drainShape struct {
	batchSize int
	total     int
	delay     time.Duration
	mailbox   int
	batch     int // WithBatch max (0: a plain handler)
	work      time.Duration
}

// drainInto runs the drain s and checks that every message ran once, in
// order, none was dead-lettered, and the receiver refused none (CAPACITY,
// or OUT_OF_ORDER behind a refusal): early emissions never hold more than
// its mailbox.
func drainInto(t *testing.T, s drainShape) {
	t.Helper()
	var mu sync.Mutex
	var ran []int64
	take := func(m *node.Message) error {
		var v wrapperspb.Int64Value
		if err := m.Decode(&v); err != nil {
			return err
		}
		mu.Lock()
		ran = append(ran, v.GetValue())
		mu.Unlock()
		return nil
	}
	cl := New(t, 2,
		WithConfig(func(_ int, cfg *node.Config) { cfg.Relay.BatchSize = s.batchSize }),
		WithSpawn(func(i int, n *node.Node) error {
			if i != 1 {
				return nil
			}
			opts := []node.SpawnOption{node.WithMailbox(s.mailbox, mailbox.Reject)}
			if s.batch > 0 {
				opts = append(opts, node.WithBatch(func(_ context.Context, msgs []*node.Message) (int, error) {
					for _, m := range msgs {
						if err := take(m); err != nil {
							return 0, err
						}
					}
					time.Sleep(time.Duration(len(msgs)) * s.work) // the batch's work, not a wait for a state
					return len(msgs), nil
				}, s.batch))
			}
			_, err := n.Spawn("sink", func(_ context.Context, m *node.Message) (proto.Message, error) {
				if err := take(m); err != nil {
					return nil, err
				}
				time.Sleep(s.work) // the handler's work, not a wait for a state
				return nil, nil
			}, opts...)
			return err
		}))
	if err := cl.Stop(1); err != nil {
		t.Fatal(err)
	}
	if err := cl.WaitDown(1, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	queueReliable(t, cl, cl.Addr("sink", 1), s.total, func(i int) proto.Message { return wrapperspb.Int64(int64(i)) })
	delayBothWays(t, cl, s.delay)
	if err := cl.Restart(1); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 180*time.Second, "the drain", func() bool { return cl.Node(0).Outbox().Stats().Depth == 0 })
	mu.Lock()
	defer mu.Unlock()
	if len(ran) != s.total {
		t.Errorf("ran %d of %d", len(ran), s.total)
	}
	for i, v := range ran {
		if v != int64(i) {
			t.Errorf("ran %d at %d", v, i)
			break
		}
	}
	if dl, err := cl.Node(0).Outbox().DeadLetters(outbox.DLQFilter{}); err != nil || len(dl) > 0 {
		t.Errorf("dead letters %d (%v)", len(dl), err)
	}
	if st := cl.Node(1).Stats(); st.RefusedFull > 0 || st.OutOfOrder > 0 {
		t.Errorf("the drain was refused: %d messages CAPACITY (mailbox full), %d OUT_OF_ORDER", st.RefusedFull, st.OutOfOrder)
	}
}

// An actor taking about 200 µs a message over a link of 5 ms each way,
// through a mailbox of one emission (BatchSize; the defaults pair them
// too). Counting what the receiver takes in a round trip as room made each
// early emission fill the mailbox exactly at its pace, and every wavering
// of that pace overran it.
func TestBusyReceiverOverALinkIsNotOverrun(t *testing.T) {
	drainInto(t, drainShape{batchSize: 64, total: 2000, delay: 5 * time.Millisecond, mailbox: 64, work: 200 * time.Microsecond})
}

// A fast actor (about 50 µs a message) over a link of 10 ms each way: it
// waits for the link most of each round trip, and an early emission sized
// by the pace its receipts came at (several thousand a second, times the
// round trip) landed a few ms behind a full one, before the receiver was
// through it.
func TestFastReceiverOverALongLinkIsNotOverrun(t *testing.T) {
	drainInto(t, drainShape{batchSize: 64, total: 2000, delay: 10 * time.Millisecond, mailbox: 64, work: 50 * time.Microsecond})
}

// A batch actor (up to 32 a call, about 500 µs a message) over a link of
// 20 ms each way: a batch takes the tail of one emission and the head of
// the next together, so their receipts come moments apart, which read as
// a pace several times the receiver's.
func TestBatchReceiverOverALongLinkIsNotOverrun(t *testing.T) {
	drainInto(t, drainShape{batchSize: 64, total: 1000, delay: 20 * time.Millisecond, mailbox: 64, batch: 32, work: 500 * time.Microsecond})
}

// queueReliable has node 0 of c queue n reliable messages for to (msg(i)
// the i-th) and waits until each is stored.
func queueReliable(tb testing.TB, c *Cluster, to node.Address, n int, msg func(i int) proto.Message) {
	tb.Helper()
	ctx := context.Background()
	ps := make([]*node.Pending, 0, n)
	for i := range n {
		p, err := c.Node(0).TellReliableAsync(ctx, to, msg(i))
		if err != nil {
			tb.Fatal(err)
		}
		ps = append(ps, p)
	}
	for _, p := range ps {
		if _, err := p.Wait(ctx); err != nil {
			tb.Fatal(err)
		}
	}
}

// delayBothWays delays the link between nodes 0 and 1 of c by d each way.
func delayBothWays(tb testing.TB, c *Cluster, d time.Duration) {
	tb.Helper()
	for _, l := range [][2]int{{0, 1}, {1, 0}} {
		if err := c.Delay(l[0], l[1], d); err != nil {
			tb.Fatal(err)
		}
	}
}
