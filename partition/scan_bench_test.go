package partition

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

// BenchmarkDueScan measures what the relay's loop pays to find deliverable
// recipients when most peers are at their AIMD limit: peers nodes with 10
// queued recipients each, all due, every node but 10 holding all its slots.
// One op is a scan of every partition (DefaultConfig's 4); the metric that
// matters is ns/found, the cost per recipient the scans hand to dispatch
// (10 free peers × 10 recipients = 100 per op at every size).
//
//	go test -run '^$' -bench BenchmarkDueScan -count 3 ./partition
func BenchmarkDueScan(b *testing.B) {
	for _, peers := range []int{100, 1_000, 10_000} {
		b.Run(fmt.Sprintf("peers=%d", peers), func(b *testing.B) {
			const perPeer, free = 10, 10
			r := newBenchRelay(b)
			batch := make([]*pb.StoredMessage, 0, 4096)
			flush := func() {
				for _, err := range r.Store(context.Background(), batch) {
					if err != nil {
						b.Fatal(err)
					}
				}
				batch = batch[:0]
			}
			for i := range peers {
				for j := range perPeer {
					rcpt := fmt.Sprintf("a%d@p%05d", j, i)
					batch = append(batch, &pb.StoredMessage{
						Envelope:         &pb.Envelope{Recipient: rcpt, Sender: "app@n0", Type: "x", MsgId: rcpt},
						CreatedElapsedMs: r.store.ElapsedMs(),
					})
					if len(batch) == cap(batch) {
						flush()
					}
				}
			}
			flush()
			for i := free; i < peers; i++ {
				l := r.Limiter(fmt.Sprintf("p%05d", i))
				l.TryAcquire(l.Limit())
			}
			now := r.store.ElapsedMs()
			found := 0
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				for _, p := range r.parts {
					due, _ := r.scan(p, now)
					found += len(due)
				}
			}
			b.StopTimer()
			if want := b.N * free * perPeer; found != want {
				b.Fatalf("found %d recipients, want %d", found, want)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(found), "ns/found")
		})
	}
}

// newBenchRelay is a relay over a real store with DefaultConfig's
// partitions; it is never started.
func newBenchRelay(tb testing.TB) *Relay {
	tb.Helper()
	scfg := outbox.DefaultConfig(filepath.Join(tb.TempDir(), "outbox.db"))
	scfg.Logger = slog.New(slog.DiscardHandler)
	s, err := outbox.Open(scfg)
	if err != nil {
		tb.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Logger = scfg.Logger
	r, err := New(cfg, s, nopDeliverer{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = r.Close()
		_ = s.Close()
	})
	return r
}
