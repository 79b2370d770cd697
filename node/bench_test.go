package node_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/node"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

var payload128 = wrapperspb.Bytes(make([]byte, 128))

// counter spawns an actor that closes the returned channel when it has
// handled want messages.
func counter(tb testing.TB, n *node.Node, name string, capacity int, want int64) (<-chan struct{}, node.Address) {
	tb.Helper()
	var c atomic.Int64
	done := make(chan struct{})
	addr, err := n.Spawn(name, func(ctx context.Context, m *node.Message) (proto.Message, error) {
		if c.Add(1) == want {
			close(done)
		}
		return nil, nil
	}, node.WithMailbox(capacity, mailbox.Reject))
	if err != nil {
		tb.Fatal(err)
	}
	return done, addr
}

func tellAll(b *testing.B, n *node.Node, to node.Address, got <-chan struct{}) {
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	refused, cpu0 := 0, cpuTime(b)
	for i := 0; i < b.N; i++ {
		err := n.Tell(ctx, to, payload128)
		for err != nil {
			var ce *node.CapacityError
			if !asCapacity(err, &ce) {
				b.Fatal(err)
			}
			refused++
			time.Sleep(ce.RetryAfter) // back off as the receiver asked: the behaviour measured
			err = n.Tell(ctx, to, payload128)
		}
	}
	select {
	case <-got:
	case <-time.After(time.Minute):
		b.Fatal("not every message arrived: the receiver dropped some (mailbox full)")
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
	b.ReportMetric(float64((cpuTime(b)-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/msg")
	b.ReportMetric(float64(refused)/float64(b.N), "refusals/msg")
}

// cpuTime is the CPU time this process has used (user and system): both
// nodes' work per message, which a shared machine's noise moves less than
// the wall-clock rate.
func cpuTime(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func asCapacity(err error, ce **node.CapacityError) bool { return errors.As(err, ce) }

// BenchmarkLocalTell: one sender, one local actor, 128-byte payload.
func BenchmarkLocalTell(b *testing.B) {
	n := startNode(b, "n1", b.TempDir())
	got, to := counter(b, n, "c", 1<<16, int64(b.N))
	tellAll(b, n, to, got)
}

// BenchmarkLocalAskInterceptor: a local ask's round trip without and with
// one installed no-op client and server interceptor; the difference is
// what they cost on a real send (compare with benchstat -col /interceptors).
func BenchmarkLocalAskInterceptor(b *testing.B) {
	noopClient := func(ctx context.Context, c *node.Call, next node.Invoker) error { return next(ctx, c) }
	noopServer := func(ctx context.Context, m *node.Message, next node.Handler) (proto.Message, error) {
		return next(ctx, m)
	}
	for _, k := range []int{0, 1} {
		b.Run(fmt.Sprintf("interceptors=%d", k), func(b *testing.B) {
			n := startNodeWith(b, "n1", b.TempDir(), func(cfg *node.Config) {
				if k == 1 {
					cfg.ClientInterceptors = []node.ClientInterceptor{noopClient}
					cfg.ServerInterceptors = []node.ServerInterceptor{noopServer}
				}
			})
			to, _ := n.Spawn("echo", func(ctx context.Context, m *node.Message) (proto.Message, error) { return payload128, nil })
			ctx := context.Background()
			var resp wrapperspb.BytesValue
			b.ReportAllocs()
			for b.Loop() {
				if err := n.Ask(ctx, to, payload128, &resp); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkLocalAsk: round trip to a local actor.
func BenchmarkLocalAsk(b *testing.B) {
	n := startNode(b, "n1", b.TempDir())
	to, _ := n.Spawn("echo", func(ctx context.Context, m *node.Message) (proto.Message, error) { return payload128, nil })
	ctx := context.Background()
	var resp wrapperspb.BytesValue
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := n.Ask(ctx, to, payload128, &resp); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRemoteTell: two nodes in one process over QUIC on loopback.
func BenchmarkRemoteTell(b *testing.B) {
	nodes := cluster(b, 2)
	got, to := counter(b, nodes[1], "c", 1<<16, int64(b.N))
	tellAll(b, nodes[0], to, got)
	reportFramesPerWrite(b, nodes)
	reportWakeups(b, nodes[1], "c")
}

// reportWakeups reports how often the actor's mailbox started a runner per
// message: how well its wake-ups were batched.
func reportWakeups(b *testing.B, n *node.Node, name string) {
	for _, as := range n.ActorStats() {
		if as.Name == name && as.Processed > 0 {
			b.ReportMetric(float64(as.Wakeups)/float64(as.Processed), "wakeups/msg")
		}
	}
}

// reportFramesPerWrite reports how many frames each node's stream writes
// carried on average: how well its sends were batched.
func reportFramesPerWrite(b *testing.B, nodes []*node.Node) {
	for i, nd := range nodes {
		var frames, writes uint64
		for _, ps := range nd.PeerStats() {
			frames, writes = frames+ps.FramesOut, writes+ps.WritesOut
		}
		if writes > 0 {
			b.ReportMetric(float64(frames)/float64(writes), fmt.Sprintf("frames/write-n%d", i))
		}
	}
}

// BenchmarkRemoteTellLarge: Tells of large messages from several
// goroutines to one remote actor, each waiting out a full send queue as
// its *CapacityError asks. Reports msgs/s and the refusals per message.
func BenchmarkRemoteTellLarge(b *testing.B) {
	for _, size := range []int{64 << 10, 1 << 20} {
		for _, senders := range []int{1, 8, 64} {
			b.Run(fmt.Sprintf("size=%d,senders=%d", size, senders), func(b *testing.B) {
				nodes := cluster(b, 2)
				got, to := counter(b, nodes[1], "c", 256, int64(b.N))
				msg := wrapperspb.Bytes(make([]byte, size))
				var next, retries atomic.Int64
				errs := make(chan error, senders)
				b.ResetTimer()
				start := time.Now()
				var wg sync.WaitGroup
				for range senders {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for next.Add(1) <= int64(b.N) {
							for {
								err := nodes[0].Tell(context.Background(), to, msg)
								if err == nil {
									break
								}
								var ce *node.CapacityError
								if !asCapacity(err, &ce) {
									errs <- err
									return
								}
								retries.Add(1)
								time.Sleep(ce.RetryAfter)
							}
						}
					}()
				}
				wg.Wait()
				close(errs)
				if err := <-errs; err != nil {
					b.Fatal(err)
				}
				select {
				case <-got:
				case <-time.After(time.Minute):
					b.Fatalf("not every message arrived (receiver %+v)", nodes[1].Stats())
				}
				b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
				b.ReportMetric(float64(retries.Load())/float64(b.N), "refusals/msg")
			})
		}
	}
}

// BenchmarkRemoteAsk: round trip over QUIC; reports p50 and p99.
func BenchmarkRemoteAsk(b *testing.B) {
	nodes := cluster(b, 2)
	to, _ := nodes[1].Spawn("echo", func(ctx context.Context, m *node.Message) (proto.Message, error) { return payload128, nil })
	ctx := context.Background()
	var resp wrapperspb.BytesValue
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if err := nodes[0].Ask(ctx, to, payload128, &resp); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkRemoteAskConcurrent: 64 goroutines asking one remote actor
// at once; reports round trips per second.
func BenchmarkRemoteAskConcurrent(b *testing.B) {
	nodes := cluster(b, 2)
	to, err := nodes[1].Spawn("echo", func(ctx context.Context, m *node.Message) (proto.Message, error) { return payload128, nil })
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	const askers = 64
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, askers)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for range askers {
		wg.Go(func() {
			var resp wrapperspb.BytesValue
			for next.Add(1) <= int64(b.N) {
				if err := nodes[0].Ask(ctx, to, payload128, &resp); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "asks/s")
	reportFramesPerWrite(b, nodes)
}

// BenchmarkTellReliableOffline: durable enqueue to a peer that is down, with
// 1, 8 and 64 concurrent senders.
func BenchmarkTellReliableOffline(b *testing.B) {
	for _, tc := range []struct{ senders, recipients int }{{1, 1}, {8, 1}, {64, 1}, {64, 64}} {
		senders := tc.senders
		name := fmt.Sprintf("senders=%d", senders)
		if tc.recipients > 1 {
			name += fmt.Sprintf(",recipients=%d", tc.recipients)
		}
		b.Run(name, func(b *testing.B) {
			n := startNode(b, "n1", filepath.Join(b.TempDir(), "n1"))
			tos := make([]node.Address, tc.recipients)
			for i := range tos {
				tos[i] = node.Addr(fmt.Sprintf("w%d", i), "offline")
			}
			ctx := context.Background()
			var next atomic.Int64
			var wg sync.WaitGroup
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			for s := 0; s < senders; s++ {
				wg.Add(1)
				to := tos[s%len(tos)]
				go func() {
					defer wg.Done()
					for next.Add(1) <= int64(b.N) {
						if _, err := n.TellReliable(ctx, to, payload128); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
			st := n.Outbox().Stats()
			b.ReportMetric(float64(st.Fsyncs)/float64(b.N), "fsyncs/msg")
		})
	}
}

// BenchmarkTellReliableAsyncOffline: one producer pipelines durable sends
// to a peer that is not in the cluster (to one recipient, or round-robin
// over several), keeping at most window Pendings unresolved; every message
// is fsynced before its Pending resolves.
func BenchmarkTellReliableAsyncOffline(b *testing.B) {
	for _, tc := range []struct{ window, recipients int }{{64, 1}, {1024, 1}, {4096, 1}, {1024, 64}} {
		window := tc.window
		b.Run(fmt.Sprintf("window=%d,recipients=%d", window, tc.recipients), func(b *testing.B) {
			n := startNode(b, "n1", filepath.Join(b.TempDir(), "n1"))
			tos := make([]node.Address, tc.recipients)
			for i := range tos {
				tos[i] = node.Addr(fmt.Sprintf("w%d", i), "offline")
			}
			ctx := context.Background()
			ring := make([]*node.Pending, window)
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				if p := ring[i%window]; p != nil {
					if _, err := p.Outcome(); err != nil {
						b.Fatal(err)
					}
				}
				p, err := n.TellReliableAsync(ctx, tos[i%len(tos)], payload128)
				if err != nil {
					b.Fatal(err)
				}
				ring[i%window] = p
			}
			for _, p := range ring {
				if p != nil {
					if _, err := p.Outcome(); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
			st := n.Outbox().Stats()
			b.ReportMetric(float64(st.Fsyncs)/float64(b.N), "fsyncs/msg")
		})
	}
}
