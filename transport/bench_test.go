package transport_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
	"github.com/quic-go/quic-go"
)

// counter counts envelopes and answers receipts at once.
type counter struct{ n atomic.Int64 }

func (c *counter) HandleEnvelope(_ transport.PeerInfo, _ *pb.Envelope, reply func(*pb.Receipt)) {
	c.n.Add(1)
	if reply != nil {
		reply(&pb.Receipt{Code: pb.Receipt_ACCEPTED})
	}
}

func benchPair(b *testing.B) (*node, *counter) {
	ca := newCA(b)
	r := newResolver()
	cfgA := testConfig(b, ca, "a")
	cfgA.SendQueueSize = 1 << 16
	a := startNode(b, cfgA, r, &counter{})
	c := &counter{}
	startNode(b, testConfig(b, ca, "b"), r, c)
	return a, c
}

// BenchmarkSend measures tell throughput between two transports, until the
// receiver has all b.N envelopes.
func BenchmarkSend(b *testing.B) {
	a, c := benchPair(b)
	ctx := context.Background()
	env := envTo(b, "sink@b", pb.Envelope_RECEIPT_NONE)
	if err := a.Send(ctx, "b", env); err != nil { // connect outside the timing
		b.Fatal(err)
	}
	testutil.WaitFor(b, 5*time.Second, "warm-up", func() bool { return c.n.Load() == 1 })
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		env.Sequence = uint64(i)
		for {
			err := a.Send(ctx, "b", env)
			if err == nil {
				break
			}
			if !errors.Is(err, transport.ErrQueueFull) {
				b.Fatal(err)
			}
			waitProgress(b, &c.n)
		}
	}
	want := int64(b.N) + 1
	for c.n.Load() < want {
		waitProgress(b, &c.n)
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}

// waitProgress blocks until n grows: back-pressure in a benchmark loop.
func waitProgress(tb testing.TB, n *atomic.Int64) {
	seen := n.Load()
	testutil.WaitFor(tb, 10*time.Second, "receiver progress", func() bool { return n.Load() > seen })
}

// BenchmarkRequest measures the round trip of one envelope and its receipt.
func BenchmarkRequest(b *testing.B) {
	a, _ := benchPair(b)
	ctx := context.Background()
	env := envTo(b, "sink@b", pb.Envelope_RECEIPT_ACCEPTED)
	if _, err := a.Request(ctx, "b", env); err != nil {
		b.Fatal(err)
	}
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		env.MsgId = "r" + string(rune('a'+i%26)) // reuse a few ids: one in flight at a time
		t0 := time.Now()
		if _, err := a.Request(ctx, "b", env); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkRawQUICStream is the ceiling: the same varint framing of
// 128-byte payloads on one raw quic-go stream, with TLS but no protobuf,
// lanes or queues.
func BenchmarkRawQUICStream(b *testing.B) {
	ca := newCA(b)
	srvID, _ := ca.NewIdentity("srv")
	cliID, _ := ca.NewIdentity("cli")
	ln, err := quic.ListenAddr("127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{srvID.Cert}, ClientAuth: tls.RequireAndVerifyClientCert,
		ClientCAs: srvID.Roots, NextProtos: []string{"bench"}, MinVersion: tls.VersionTLS13,
	}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	got := make(chan int, 1)
	go func() {
		qc, err := ln.Accept(context.Background())
		if err != nil {
			got <- -1
			return
		}
		defer qc.CloseWithError(0, "")
		rs, err := qc.AcceptUniStream(context.Background())
		if err != nil {
			got <- -1
			return
		}
		br := bufio.NewReaderSize(rs, 64<<10)
		n := 0
		buf := make([]byte, 256)
		for {
			size, err := binary.ReadUvarint(br)
			if err != nil {
				break
			}
			if _, err := io.ReadFull(br, buf[:size]); err != nil {
				break
			}
			n++
		}
		got <- n
	}()
	qc, err := quic.DialAddr(context.Background(), ln.Addr().String(), &tls.Config{
		Certificates: []tls.Certificate{cliID.Cert}, RootCAs: cliID.Roots, ServerName: "srv",
		NextProtos: []string{"bench"}, MinVersion: tls.VersionTLS13,
	}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer qc.CloseWithError(0, "")
	s, err := qc.OpenUniStreamSync(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	payload := make([]byte, 128)
	batch := make([]byte, 0, 64<<10)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		batch = binary.AppendUvarint(batch, uint64(len(payload)))
		batch = append(batch, payload...)
		if len(batch) > 60<<10 || i == b.N-1 {
			if _, err := s.Write(batch); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	_ = s.Close()
	if n := <-got; n != b.N {
		b.Fatalf("received %d of %d", n, b.N)
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}

// BenchmarkAppendFrame measures encoding one envelope frame into a reused buffer.
func BenchmarkAppendFrame(b *testing.B) {
	env := envTo(b, "sink@b", pb.Envelope_RECEIPT_NONE)
	f := &pb.Frame{Kind: &pb.Frame_Envelope{Envelope: env}}
	buf := make([]byte, 0, 1024)
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if buf, err = transport.AppendFrame(buf[:0], f); err != nil {
			b.Fatal(err)
		}
	}
}

// emission sends one relay-sized emission of envelopes asking a PROCESSED
// receipt and checks that every receipt came back, in order.
func emission(tb testing.TB, a *node, envs []*pb.Envelope) {
	rcs, err := a.RequestBatch(context.Background(), "b", envs)
	if err != nil {
		tb.Fatal(err)
	}
	for i, rc := range rcs {
		if rc.GetMsgId() != envs[i].GetMsgId() || rc.GetCode() != pb.Receipt_PROCESSED {
			tb.Fatalf("receipt %d = %v, want PROCESSED for %s", i, rc, envs[i].GetMsgId())
		}
	}
}

// emissionPair is a sender and a receiver that answers every envelope
// PROCESSED with a watermark, as a stream's receiver does.
func emissionPair(tb testing.TB, size int) (*node, []*pb.Envelope) {
	ca := newCA(tb)
	r := newResolver()
	cfgA := testConfig(tb, ca, "a")
	cfgA.SendQueueSize = 1 << 16
	a := startNode(tb, cfgA, r, &counter{})
	startNode(tb, testConfig(tb, ca, "b"), r, handlerFunc(func(_ transport.PeerInfo, env *pb.Envelope, reply func(*pb.Receipt)) {
		reply(&pb.Receipt{MsgId: env.GetMsgId(), Code: pb.Receipt_PROCESSED, Watermark: env.GetSequence()})
	}))
	envs := make([]*pb.Envelope, size)
	for i := range envs {
		envs[i] = envTo(tb, "sink@b", pb.Envelope_RECEIPT_PROCESSED)
		envs[i].Sequence = uint64(i + 1)
	}
	emission(tb, a, envs) // connect outside the measurement
	return a, envs
}

// BenchmarkRequestBatch measures a relay emission at the transport: 1,024
// envelopes sent at once, each answered by a receipt; per message.
func BenchmarkRequestBatch(b *testing.B) {
	const size = 1024
	a, envs := emissionPair(b, size)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		emission(b, a, envs)
	}
	b.ReportMetric(float64(b.N*size)/b.Elapsed().Seconds(), "msgs/s")
}
