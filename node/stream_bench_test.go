package node_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/transport"
	"google.golang.org/protobuf/proto"
)

// BenchmarkStreamMessage measures one stream message at a receiver, from
// arrival to its PROCESSED receipt (which waits for the watermark's
// group commit), one at a time.
func BenchmarkStreamMessage(b *testing.B) {
	n := startNode(b, "n1", b.TempDir())
	if _, err := n.Spawn("a", func(context.Context, *node.Message) (proto.Message, error) { return nil, nil }); err != nil {
		b.Fatal(err)
	}
	ch := make(chan *pb.Receipt, 1)
	b.ResetTimer()
	for i := range b.N {
		env := streamEnv("a", "n1", uint64(i+1), uint64(i))
		n.DeliverIncoming(peerP, env, func(rc *pb.Receipt) { ch <- rc })
		if rc := <-ch; rc.GetCode() != pb.Receipt_PROCESSED {
			b.Fatalf("receipt %v", rc)
		}
	}
}

// feedStream plays the relay for peer p's stream to a@n1: emissions of
// batch chained messages, the next one when every receipt is back, from
// sequence from+1 to to. It fails b on any receipt but PROCESSED.
func feedStream(b *testing.B, n *node.Node, from, to uint64, batch int) {
	b.Helper()
	rcs := make(chan *pb.Receipt, batch)
	for next := from + 1; next <= to; {
		k := 0
		var prev uint64
		for s := next; s <= to && k < batch; s++ {
			n.DeliverIncoming(peerP, streamEnv("a", "n1", s, prev), func(rc *pb.Receipt) { rcs <- rc })
			prev = s
			k++
		}
		for range k {
			if rc := <-rcs; rc.GetCode() != pb.Receipt_PROCESSED {
				b.Fatalf("receipt %v", rc)
			}
		}
		next += uint64(k)
	}
}

func heapAfterGC() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// BenchmarkReceiverHeapFlat: a receiver's memory does not grow with the
// messages of a stream (no key is kept for a message sent without one):
// the heap after M messages is compared with the heap after M/10.
// MESHNODE_BENCH_MESSAGES sets M (default 10,000,000); run it once:
//
//	go test -run '^$' -bench BenchmarkReceiverHeapFlat -benchtime 1x ./node
func BenchmarkReceiverHeapFlat(b *testing.B) {
	total := uint64(10_000_000)
	if s := os.Getenv("MESHNODE_BENCH_MESSAGES"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			b.Fatal(err)
		}
		total = v
	}
	n := startNode(b, "n1", b.TempDir())
	if _, err := n.Spawn("a", func(context.Context, *node.Message) (proto.Message, error) { return nil, nil },
		node.WithMailbox(1024, mailbox.Reject)); err != nil {
		b.Fatal(err)
	}
	for range b.N {
		feedStream(b, n, 0, total/10, 512)
		h1 := heapAfterGC()
		feedStream(b, n, total/10, total, 512)
		h2 := heapAfterGC()
		b.ReportMetric(float64(h1)/(1<<20), "MiB-heap-after-1/10")
		b.ReportMetric(float64(h2)/(1<<20), "MiB-heap-after-all")
		b.ReportMetric(float64(h2)/float64(h1), "ratio")
		if float64(h2) > 1.1*float64(h1) {
			b.Errorf("heap grew from %d to %d bytes between %d and %d messages", h1, h2, total/10, total)
		}
	}
}

// BenchmarkReceiverStreamState measures the memory a receiver holds per
// stream in use: 10,000 streams from 100 peers (each peer's streams are its
// outboxes: a peer that started over with an empty outbox begins new
// ones), sender and actor names of 32 bytes. What the node holds per peer
// (the bytes it has queued, for its budget: about 150 B) is paid once per
// peer, not per stream.
//
//	go test -run '^$' -bench BenchmarkReceiverStreamState -benchtime 1x ./node
func BenchmarkReceiverStreamState(b *testing.B) {
	const streams = 10000
	n := startNode(b, "n1", b.TempDir())
	actor := strings.Repeat("a", 32)
	if _, err := n.Spawn(actor, func(context.Context, *node.Message) (proto.Message, error) { return nil, nil },
		node.WithMailbox(streams, mailbox.Reject)); err != nil {
		b.Fatal(err)
	}
	for range b.N {
		before := heapAfterGC()
		rcs := make(chan *pb.Receipt, streams)
		for i := range streams {
			from := transport.PeerInfo{Name: fmt.Sprintf("%032d", i%100), OutboxID: [16]byte{byte(i), byte(i >> 8), 7}}
			env := streamEnv(actor, "n1", 1, 0)
			env.Sender = "@" + from.Name
			n.DeliverIncoming(from, env, func(rc *pb.Receipt) { rcs <- rc })
		}
		for range streams {
			if rc := <-rcs; rc.GetCode() != pb.Receipt_PROCESSED {
				b.Fatalf("receipt %v", rc)
			}
		}
		after := heapAfterGC()
		per := float64(after-before) / streams
		b.ReportMetric(per, "B/stream")
		if per >= 256 {
			b.Errorf("%.0f bytes per stream, want < 256", per)
		}
		if got := n.Stats().Streams; got < streams {
			b.Fatalf("%d streams cached, want %d", got, streams)
		}
	}
}

// BenchmarkReceiverEmission measures a receiver taking emissions of 1,024
// chained stream messages into a batch actor whose handler does nothing:
// the post, the decisions, the watermark's commit and the receipts, the
// receiver's whole share of a drain but the transport and the handler.
//
//	go test -run '^$' -bench BenchmarkReceiverEmission -benchtime 200000x -benchmem ./node
func BenchmarkReceiverEmission(b *testing.B) {
	n := startNode(b, "n1", b.TempDir())
	nop := func(_ context.Context, msgs []*node.Message) (int, error) { return len(msgs), nil }
	if _, err := n.Spawn("a", func(context.Context, *node.Message) (proto.Message, error) { return nil, nil },
		node.WithBatch(nop, 1024)); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	feedStream(b, n, 0, uint64(b.N), 1024)
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}
