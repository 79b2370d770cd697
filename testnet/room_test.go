package testnet

import (
	"context"
	"fmt"
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
// nodes 0..senders-1 queue total messages each for the sink on the last
// node while it is down, the link gets delay each way, the sink comes
// back and drains (each message taking work(i) in its handler).
type drainShape struct {
	batchSize int
	total     int
	senders   int
	delay     time.Duration
	mailbox   int
	bytes     int64 // WithMailboxBytes (0: the default)
	batch     int   // WithBatch max (0: a plain handler)
	work      func(i int64) time.Duration
	body      func(i int) proto.Message
}

// drainInto runs the drain s and checks that every message ran once, in
// order, none was dead-lettered, and the receiver refused none (CAPACITY,
// or OUT_OF_ORDER behind a refusal): early emissions never hold more than
// its mailbox.
func drainInto(t *testing.T, s drainShape) {
	t.Helper()
	if s.senders == 0 {
		s.senders = 1
	}
	if s.body == nil {
		s.body = func(i int) proto.Message { return wrapperspb.Int64(int64(i)) }
	}
	recv := s.senders
	var mu sync.Mutex
	ran := make(map[string][]int64)
	dec := func(m *node.Message) (int64, error) {
		var v wrapperspb.Int64Value
		if err := m.Decode(&v); err == nil {
			return v.GetValue(), nil
		}
		var b wrapperspb.BytesValue
		if err := m.Decode(&b); err != nil {
			return 0, err
		}
		var x int64
		_, err := fmt.Sscanf(string(b.GetValue()[:12]), "%012d", &x)
		return x, err
	}
	cl := New(t, s.senders+1,
		WithConfig(func(_ int, cfg *node.Config) { cfg.Relay.BatchSize = s.batchSize }),
		WithSpawn(func(i int, n *node.Node) error {
			if i != recv {
				return nil
			}
			opts := []node.SpawnOption{node.WithMailbox(s.mailbox, mailbox.Reject)}
			if s.bytes > 0 {
				opts = append(opts, node.WithMailboxBytes(s.bytes))
			}
			if s.batch > 0 {
				opts = append(opts, node.WithBatch(func(_ context.Context, msgs []*node.Message) (int, error) {
					var d time.Duration
					for _, m := range msgs {
						v, err := dec(m)
						if err != nil {
							return 0, err
						}
						mu.Lock()
						ran[m.From()] = append(ran[m.From()], v)
						mu.Unlock()
						d += s.work(v)
					}
					time.Sleep(d) // the batch's work, not a wait for a state
					return len(msgs), nil
				}, s.batch))
			}
			_, err := n.Spawn("sink", func(_ context.Context, m *node.Message) (proto.Message, error) {
				v, err := dec(m)
				if err != nil {
					return nil, err
				}
				mu.Lock()
				ran[m.From()] = append(ran[m.From()], v)
				mu.Unlock()
				time.Sleep(s.work(v)) // the handler's work, not a wait for a state
				return nil, nil
			}, opts...)
			return err
		}))
	if err := cl.Stop(recv); err != nil {
		t.Fatal(err)
	}
	if err := cl.WaitDown(recv, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	to := cl.Addr("sink", recv)
	for snd := range s.senders {
		ps := make([]*node.Pending, 0, s.total)
		for i := range s.total {
			p, err := cl.Node(snd).TellReliableAsync(ctx, to, s.body(i))
			if err != nil {
				t.Fatal(err)
			}
			ps = append(ps, p)
		}
		for _, p := range ps {
			if _, err := p.Wait(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if s.delay > 0 {
		for snd := range s.senders {
			for _, l := range [][2]int{{snd, recv}, {recv, snd}} {
				if err := cl.Delay(l[0], l[1], s.delay); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if err := cl.Restart(recv); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 180*time.Second, "the drain", func() bool {
		for snd := range s.senders {
			if cl.Node(snd).Outbox().Stats().Depth != 0 {
				return false
			}
		}
		return true
	})
	mu.Lock()
	defer mu.Unlock()
	st := cl.Node(recv).Stats()
	for snd := range s.senders {
		got := ran[cl.Name(snd)]
		if len(got) != s.total {
			t.Errorf("sender %d: ran %d of %d", snd, len(got), s.total)
		}
		for i, v := range got {
			if v != int64(i) {
				t.Errorf("sender %d: ran %d at %d", snd, v, i)
				break
			}
		}
		if dl, err := cl.Node(snd).Outbox().DeadLetters(outbox.DLQFilter{}); err != nil || len(dl) > 0 {
			t.Errorf("sender %d: dead letters %d (%v)", snd, len(dl), err)
		}
	}
	if st.RefusedFull > 0 || st.OutOfOrder > 0 {
		t.Errorf("the drain was refused: %d messages CAPACITY (mailbox full), %d OUT_OF_ORDER", st.RefusedFull, st.OutOfOrder)
	}
}

func taking(d time.Duration) func(int64) time.Duration {
	return func(int64) time.Duration { return d }
}

// An actor taking about 200 µs a message over a link of 5 ms each way,
// through a mailbox of one emission (BatchSize; the defaults pair them
// too). Counting what the receiver takes in a round trip as room made each
// early emission fill the mailbox exactly at its pace, and every wavering
// of that pace overran it.
func TestBusyReceiverOverALinkIsNotOverrun(t *testing.T) {
	drainInto(t, drainShape{batchSize: 64, total: 2000, delay: 5 * time.Millisecond, mailbox: 64, work: taking(200 * time.Microsecond)})
}

// A fast actor (about 50 µs a message) over a link of 10 ms each way: it
// waits for the link most of each round trip, and an early emission sized
// by the pace its receipts came at (several thousand a second, times the
// round trip) landed a few ms behind a full one, before the receiver was
// through it.
func TestFastReceiverOverALongLinkIsNotOverrun(t *testing.T) {
	drainInto(t, drainShape{batchSize: 64, total: 2000, delay: 10 * time.Millisecond, mailbox: 64, work: taking(50 * time.Microsecond)})
}

// A batch actor (up to 32 a call, about 500 µs a message) over a link of
// 20 ms each way: a batch takes the tail of one emission and the head of
// the next together, so their receipts come moments apart, which read as
// a pace several times the receiver's.
func TestBatchReceiverOverALongLinkIsNotOverrun(t *testing.T) {
	drainInto(t, drainShape{batchSize: 64, total: 1000, delay: 20 * time.Millisecond, mailbox: 64, batch: 32, work: taking(500 * time.Microsecond)})
}
