package node_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/outbox"
	"github.com/meshnode/meshnode/partition"
	"github.com/meshnode/meshnode/testnet"
	"github.com/meshnode/meshnode/transport"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// runLog records what the "sink" actors ran: the body (a sequence) and the
// verified sender node, in the order they ran.
type runLog struct {
	mu   sync.Mutex // mu guards the fields below
	seqs []uint64
	from []string
}

func (s *runLog) handler(_ context.Context, m *node.Message) (proto.Message, error) {
	var v wrapperspb.UInt64Value
	if err := m.Decode(&v); err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.seqs = append(s.seqs, v.GetValue())
	s.from = append(s.from, m.From())
	s.mu.Unlock()
	return nil, nil
}

func (s *runLog) snapshot() ([]uint64, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.seqs), slices.Clone(s.from)
}

// forwardCluster starts n nodes whose paths fail and heal in seconds,
// each with a "sink" recording into s and a "warm" actor that does
// nothing (sending to it opens a connection).
func forwardCluster(t *testing.T, n int, s *runLog) *testnet.Cluster {
	t.Helper()
	return testnet.New(t, n,
		testnet.WithConfig(func(_ int, cfg *node.Config) {
			cfg.Transport.HandshakeTimeout = 500 * time.Millisecond
			cfg.Transport.KeepAlivePeriod = 200 * time.Millisecond
			cfg.Transport.MaxIdleTimeout = time.Second
			cfg.Relay.Backoff = partition.BackoffConfig{Base: 20 * time.Millisecond, Cap: 200 * time.Millisecond}
			cfg.Relay.Forward = partition.ForwardConfig{After: 2, Probe: time.Hour}
		}),
		testnet.WithSpawn(func(_ int, nd *node.Node) error {
			if _, err := nd.Spawn("sink", s.handler); err != nil {
				return err
			}
			_, err := nd.Spawn("warm", func(context.Context, *node.Message) (proto.Message, error) { return nil, nil })
			return err
		}))
}

// warm opens connections from each of the forwarders to the recipient, so
// that the first emission a forwarder gets is carried (not answered "no
// connection yet").
func warm(t *testing.T, c *testnet.Cluster, to int, from ...int) {
	t.Helper()
	for _, i := range from {
		if out, err := c.Node(i).TellReliable(ctxT(t), c.Addr("warm", to), wrapperspb.String("hi")); err != nil || out != node.Delivered {
			t.Fatalf("warm %d→%d: %v %v", i, to, out, err)
		}
	}
}

// A forwarder that alters what it carries, or lies about the receipts, is
// found out: the recipient refuses an altered envelope (counted, nothing
// runs, no verdict), the sender ignores a receipt the recipient did not
// sign, and neither ever dead-letters the message or runs it twice; the
// sender moves to the next forwarder and the messages run there, in
// order, once, as the sender's.
func TestTamperingForwarderIsFoundOut(t *testing.T) {
	t.Parallel() // mostly waits on real time: runs beside the other such tests

	const a, liar, cc, honest = 0, 1, 2, 3 // the forwarders in the order the sender tries them: n1, n3
	cases := []struct {
		name    string
		hook    func(c *testnet.Cluster) func(env *pb.Envelope) *pb.Receipt
		refused bool // C refuses what it got (the envelope was altered)
		badSig  bool // A sees a signature that does not verify
	}{
		{"altered body", func(*testnet.Cluster) func(env *pb.Envelope) *pb.Receipt {
			return func(env *pb.Envelope) *pb.Receipt {
				env.Body, _ = anypb.New(wrapperspb.UInt64(999999))
				return nil
			}
		}, true, false},
		{"altered origin", func(*testnet.Cluster) func(env *pb.Envelope) *pb.Receipt {
			return func(env *pb.Envelope) *pb.Receipt {
				env.Origin.Node = "n1" // its own name over the sender's certificate and signature
				return nil
			}
		}, true, false},
		{"forged PROCESSED", func(*testnet.Cluster) func(env *pb.Envelope) *pb.Receipt {
			return func(env *pb.Envelope) *pb.Receipt {
				return &pb.Receipt{MsgId: env.GetMsgId(), Code: pb.Receipt_PROCESSED, Watermark: env.GetSequence()}
			}
		}, false, false},
		{"forged REJECTED signed by the forwarder", func(c *testnet.Cluster) func(env *pb.Envelope) *pb.Receipt {
			id, err := c.CA().NewIdentity("n1")
			if err != nil {
				t.Fatal(err)
			}
			return func(env *pb.Envelope) *pb.Receipt {
				rc := &pb.Receipt{MsgId: env.GetMsgId(), Code: pb.Receipt_REJECTED, Message: "poison"}
				dg, _ := transport.EnvelopeDigest(env)
				if err := transport.SignReceipt(&id.Cert, "n2", rc, dg); err != nil {
					panic(err)
				}
				return rc
			}
		}, false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := &runLog{}
			c := forwardCluster(t, 4, s)
			warm(t, c, cc, liar, honest)
			var lied, carried sync.Map
			hook := tc.hook(c)
			node.SetCarryHook(c.Node(liar), func(env *pb.Envelope) *pb.Receipt {
				lied.Store(env.GetMsgId(), true)
				return hook(env)
			})
			node.SetCarryHook(c.Node(honest), func(env *pb.Envelope) *pb.Receipt {
				carried.Store(env.GetMsgId(), true)
				return nil
			})
			c.Cut(a, cc)
			const msgs = 20
			for i := range msgs {
				if _, err := c.Node(a).TellReliable(ctxT(t), c.Addr("sink", cc), wrapperspb.UInt64(uint64(i+1))); err != nil {
					t.Fatal(err)
				}
			}
			testutil.WaitFor(t, 30*time.Second, "every message run at C", func() bool {
				seqs, _ := s.snapshot()
				return len(seqs) >= msgs
			})
			if err := c.WaitDrained(10 * time.Second); err != nil {
				t.Fatal(err)
			}
			seqs, from := s.snapshot()
			want := make([]uint64, msgs)
			for i := range want {
				want[i] = uint64(i + 1)
			}
			if !slices.Equal(seqs, want) {
				t.Fatalf("C ran %v, want 1..%d in order, once each (and never 999999)", seqs, msgs)
			}
			for i, f := range from {
				if f != c.Name(a) {
					t.Fatalf("message %d ran as from %q, want the sender %s", i, f, c.Name(a))
				}
			}
			if n := count(&lied); n == 0 || count(&carried) == 0 {
				t.Fatalf("the liar saw %d envelopes, the honest forwarder %d: want both used", n, count(&carried))
			}
			if dl, err := c.Node(a).Outbox().DeadLetters(outbox.DLQFilter{}); err != nil || len(dl) != 0 {
				t.Fatalf("A dead-lettered %v (%v)", dl, err)
			}
			sa, sc := c.Node(a).Stats().Forward, c.Node(cc).Stats().Forward
			t.Logf("A %+v; C %+v; route %+v", sa, sc, c.Node(a).Routes())
			if tc.refused != (sc.Refused > 0) {
				t.Fatalf("C refused %d forwarded envelopes; want refusals: %v", sc.Refused, tc.refused)
			}
			if tc.badSig != (sa.BadReceipts > 0) || sa.Unsigned+sa.BadReceipts == 0 {
				t.Fatalf("A ignored %d unsigned and %d badly signed receipts; want bad signatures: %v", sa.Unsigned, sa.BadReceipts, tc.badSig)
			}
			if r := c.Node(a).Routes()[c.Name(cc)]; r.Via != c.Name(honest) {
				t.Fatalf("route %+v, want via the honest %s", r, c.Name(honest))
			}
		})
	}
}

func count(m *sync.Map) int {
	n := 0
	m.Range(func(any, any) bool { n++; return true })
	return n
}

// BenchmarkForwarded measures reliable throughput through a forwarder: a
// backlog stored at A while A↔C is cut is drained through B; one op is
// one message run at C. The direct cases drain the same backlog with the
// link up; streams is the number of recipient actors the backlog is
// spread over (each a stream with one emission in flight at a time).
//
//	go test -run '^$' -bench Forwarded -benchtime 2000x ./node
func BenchmarkForwarded(b *testing.B) {
	for _, streams := range []int{1, 8} {
		for _, cut := range []bool{true, false} {
			path := "direct"
			if cut {
				path = "forwarder"
			}
			b.Run(fmt.Sprintf("%s/streams=%d", path, streams), func(b *testing.B) { benchForwarded(b, cut, streams) })
		}
	}
}

func benchForwarded(b *testing.B, cut bool, streams int) {
	s := &runLog{}
	c := testnet.New(b, 3,
		testnet.WithConfig(func(_ int, cfg *node.Config) {
			cfg.Transport.HandshakeTimeout = 800 * time.Millisecond
			cfg.Transport.KeepAlivePeriod = 200 * time.Millisecond
			cfg.Transport.MaxIdleTimeout = time.Second
			cfg.Relay.Backoff = partition.BackoffConfig{Base: 20 * time.Millisecond, Cap: 300 * time.Millisecond}
			cfg.Relay.Forward = partition.ForwardConfig{After: 2, Probe: time.Hour}
		}),
		testnet.WithSpawn(func(_ int, nd *node.Node) error {
			for i := range streams {
				if _, err := nd.Spawn(fmt.Sprintf("sink%d", i), s.handler); err != nil {
					return err
				}
			}
			return nil
		}))
	const a, fwd, cc = 0, 1, 2
	ctx := context.Background()
	// Warm the paths, and with the cut wait until A sends through B.
	if _, err := c.Node(fwd).TellReliable(ctx, c.Addr("sink0", cc), wrapperspb.UInt64(0)); err != nil {
		b.Fatal(err)
	}
	if cut {
		c.Cut(a, cc)
		testutil.WaitFor(b, 30*time.Second, "A forwards through B", func() bool {
			if _, err := c.Node(a).TellReliable(ctx, c.Addr("sink0", cc), wrapperspb.UInt64(0)); err != nil {
				b.Fatal(err)
			}
			return c.Node(a).Routes()[c.Name(cc)].Via == c.Name(fwd)
		})
	}
	if err := c.WaitDrained(30 * time.Second); err != nil {
		b.Fatal(err)
	}
	// Hold the backlog at B (it answers "not now", unsigned: A waits),
	// store it at A in one Dispatch, then let it go and time the drain.
	var hold atomic.Bool
	hold.Store(true)
	if cut {
		node.SetCarryHook(c.Node(fwd), func(env *pb.Envelope) *pb.Receipt {
			if hold.Load() {
				return &pb.Receipt{MsgId: env.GetMsgId(), Message: "held"}
			}
			return nil
		})
	}
	base, _ := s.snapshot()
	targets := make([]node.Address, b.N)
	for i := range targets {
		targets[i] = c.Addr(fmt.Sprintf("sink%d", i%streams), cc)
	}
	res, err := c.Node(a).Dispatch(ctx, targets, wrapperspb.UInt64(1))
	if err != nil || res.Accepted != b.N {
		b.Fatalf("dispatch: %+v %v", res, err)
	}
	carried0 := c.Node(fwd).Stats().Forward.Carried
	b.ResetTimer()
	hold.Store(false)
	testutil.WaitFor(b, 5*time.Minute, "the backlog run at C", func() bool {
		seqs, _ := s.snapshot()
		return len(seqs)-len(base) >= b.N
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msg/s")
	if carried := c.Node(fwd).Stats().Forward.Carried - carried0; cut && carried < uint64(b.N) {
		b.Fatalf("B carried %d of %d", carried, b.N)
	}
}
