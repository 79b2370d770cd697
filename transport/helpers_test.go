package transport_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fakeResolver is a map-based Resolver; Down marks a node unreachable.
type fakeResolver struct {
	mu    sync.Mutex // mu guards the fields below
	addrs map[string]string
}

func newResolver() *fakeResolver { return &fakeResolver{addrs: map[string]string{}} }

func (r *fakeResolver) Resolve(node string) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	a, ok := r.addrs[node]
	if !ok {
		return "", fmt.Errorf("resolve %s: %w", node, transport.ErrUnreachable)
	}
	return a, nil
}

func (r *fakeResolver) Set(node, addr string) {
	r.mu.Lock()
	r.addrs[node] = addr
	r.mu.Unlock()
}

func (r *fakeResolver) Down(node string) {
	r.mu.Lock()
	delete(r.addrs, node)
	r.mu.Unlock()
}

// handlerFunc adapts a function to transport.Handler.
type handlerFunc func(from transport.PeerInfo, env *pb.Envelope, reply func(*pb.Receipt))

func (f handlerFunc) HandleEnvelope(from transport.PeerInfo, env *pb.Envelope, reply func(*pb.Receipt)) {
	f(from, env, reply)
}

// recorder records envelopes and answers receipts with PROCESSED.
type recorder struct {
	mu   sync.Mutex // mu guards the fields below
	envs []*pb.Envelope
	from []transport.PeerInfo

	count atomic.Int64
}

func (r *recorder) HandleEnvelope(from transport.PeerInfo, env *pb.Envelope, reply func(*pb.Receipt)) {
	r.mu.Lock()
	r.envs = append(r.envs, env)
	r.from = append(r.from, from)
	r.mu.Unlock()
	r.count.Add(1)
	if reply != nil {
		reply(&pb.Receipt{Code: pb.Receipt_PROCESSED, Message: env.GetRecipient()})
	}
}

func (r *recorder) snapshot() ([]*pb.Envelope, []transport.PeerInfo) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*pb.Envelope(nil), r.envs...), append([]transport.PeerInfo(nil), r.from...)
}

// syncBuffer collects log output for assertions.
type syncBuffer struct {
	mu  sync.Mutex // mu guards the field below
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// node is one transport under test.
type node struct {
	*transport.Transport
	name string
	logs *syncBuffer
	cfg  transport.Config
}

// testConfig returns a config for name with fast timeouts on loopback.
func testConfig(tb testing.TB, ca *transport.CA, name string) transport.Config {
	tb.Helper()
	id, err := ca.NewIdentity(name)
	if err != nil {
		tb.Fatalf("identity %s: %v", name, err)
	}
	cfg := transport.DefaultConfig(name)
	cfg.ListenAddr = "127.0.0.1:0"
	cfg.Identity = id
	copy(cfg.OutboxID[:], "outbox-of-"+name+"----------")
	cfg.DataDir = tb.TempDir()
	cfg.KeepAlivePeriod = 200 * time.Millisecond
	cfg.MaxIdleTimeout = 2 * time.Second
	cfg.HandshakeTimeout = 2 * time.Second
	return cfg
}

// bulkConfig is testConfig for tests that move tens of MiB both ways at
// once: under the race detector, on a busy machine, a connection's loop can
// go 2 s without reading a packet while it sends, and the idle timeout would
// end a connection the test needs (its fire-and-forget frames then lost).
func bulkConfig(tb testing.TB, ca *transport.CA, name string) transport.Config {
	tb.Helper()
	cfg := testConfig(tb, ca, name)
	cfg.KeepAlivePeriod = time.Second
	cfg.MaxIdleTimeout = 10 * time.Second
	return cfg
}

// startNode starts a transport from cfg, registers it in r, and closes it at cleanup.
func startNode(tb testing.TB, cfg transport.Config, r *fakeResolver, h transport.Handler) *node {
	tb.Helper()
	logs := &syncBuffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	tr, err := transport.New(cfg, r, h)
	if err != nil {
		tb.Fatalf("new %s: %v", cfg.NodeName, err)
	}
	tb.Cleanup(func() { _ = tr.Close() })
	r.Set(cfg.NodeName, tr.LocalAddr().String())
	return &node{Transport: tr, name: cfg.NodeName, logs: logs, cfg: cfg}
}

func newCA(tb testing.TB) *transport.CA {
	tb.Helper()
	ca, err := transport.NewCA("test-ca", time.Hour)
	if err != nil {
		tb.Fatalf("new CA: %v", err)
	}
	return ca
}

func ctxT(tb testing.TB, d time.Duration) context.Context {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	tb.Cleanup(cancel)
	return ctx
}

var msgSeq atomic.Uint64

// envTo builds an envelope for actor@node with a 128-byte body.
func envTo(tb testing.TB, recipient string, mode pb.Envelope_ReceiptMode) *pb.Envelope {
	tb.Helper()
	body, err := anypb.New(wrapperspb.Bytes(make([]byte, 128)))
	if err != nil {
		tb.Fatal(err)
	}
	n := msgSeq.Add(1)
	return &pb.Envelope{
		ProtocolVersion: pb.ProtocolVersion,
		MsgId:           fmt.Sprintf("m-%d", n),
		Sender:          "tester@x",
		Recipient:       recipient,
		Body:            body,
		Receipt:         mode,
		Sequence:        n,
	}
}

// blackhole is a PacketConn that can silently drop everything, like a
// crashed host.
type blackhole struct {
	net.PacketConn
	drop atomic.Bool
}

func (b *blackhole) WriteTo(p []byte, addr net.Addr) (int, error) {
	if b.drop.Load() {
		return len(p), nil
	}
	return b.PacketConn.WriteTo(p, addr)
}

func (b *blackhole) ReadFrom(p []byte) (int, net.Addr, error) {
	for {
		n, a, err := b.PacketConn.ReadFrom(p)
		if err != nil || !b.drop.Load() {
			return n, a, err
		}
	}
}

func (b *syncBuffer) Reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Reset()
}
