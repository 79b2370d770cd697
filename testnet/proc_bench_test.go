package testnet

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkProcSend measures keyed reliable sends between two real
// daemons through the admin API (HTTP, JSON, QUIC, the receiver's inbox
// fsync): the path the crash test drives. One request at a time, so the
// figure is latency-bound, not the node's throughput.
func BenchmarkProcSend(b *testing.B) {
	bin := buildMeshnode(b)
	c := NewProcs(b, bin, 2, WithInboxes("box"))
	body := map[string]int{"n": 0}
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		body["n"] = i
		out, err := c.Send(0, "box@n1", body, fmt.Sprintf("b%d-%d", b.N, i))
		if err != nil || out != "Delivered" {
			b.Fatalf("send %d: %q, %v", i, out, err)
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}
