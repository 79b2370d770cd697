package outbox_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

// payload128 is the DESIGN benchmark payload size.
var payload128 = string(make([]byte, 128))

// BenchmarkEnqueue measures fsynced enqueues with 1, 8 and 64 concurrent
// callers (group commit shares fsyncs among them).
// Linger 0 is the committer without CommitLinger, for comparison.
func BenchmarkEnqueue(b *testing.B) {
	def := outbox.DefaultConfig("")
	for _, tc := range []struct {
		callers int
		linger  time.Duration
	}{{1, 0}, {1, def.CommitLinger}, {8, 0}, {8, def.CommitLinger}, {64, 0}, {64, def.CommitLinger}} {
		callers := tc.callers
		b.Run(fmt.Sprintf("callers=%d/linger=%v", callers, tc.linger), func(b *testing.B) {
			s, _ := openTemp(b, func(c *outbox.Config) { c.CommitLinger = tc.linger })
			b.ReportAllocs()
			before := s.Stats().Fsyncs
			b.ResetTimer()
			var wg sync.WaitGroup
			per := (b.N + callers - 1) / callers
			for c := range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := fmt.Sprintf("a%d@n1", c%16)
					for range per {
						if err := s.Enqueue(context.Background(), &pb.Envelope{Recipient: r, Type: payload128}); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			n := float64(per * callers)
			b.ReportMetric(n/b.Elapsed().Seconds(), "msgs/s")
			b.ReportMetric(float64(s.Stats().Fsyncs-before)/n, "fsyncs/msg")
		})
	}
}

// BenchmarkAckDrain measures Head + Ack of a preloaded backlog in batches
// of 128, the store side of a relay drain.
func BenchmarkAckDrain(b *testing.B) {
	s, _ := openTemp(b, nil)
	const recipients = 16
	envs := make([]*pb.Envelope, 0, 4096)
	for i := 0; i < b.N; i++ {
		envs = append(envs, &pb.Envelope{Recipient: fmt.Sprintf("a%d@n1", i%recipients), Type: payload128})
		if len(envs) == cap(envs) || i == b.N-1 {
			for _, err := range s.EnqueueBatch(context.Background(), envs) {
				if err != nil {
					b.Fatal(err)
				}
			}
			envs = envs[:0]
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	for i := range recipients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := fmt.Sprintf("a%d@n1", i)
			for {
				msgs, err := s.Head(r, 128)
				if err != nil || len(msgs) == 0 {
					return
				}
				sq := make([]uint64, len(msgs))
				for j, m := range msgs {
					sq[j] = m.GetEnvelope().GetSequence()
				}
				if err := s.Ack(r, sq); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	if d := s.Stats().Depth; d != 0 {
		b.Fatalf("depth %d after drain", d)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}
