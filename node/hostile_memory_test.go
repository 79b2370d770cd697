package node_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/rawpeer"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestMemoryUnderAttack drives the worst of what a member and a stranger
// can do to one node's memory, at once, while a good peer keeps asking it:
//
//   - the member (a valid certificate, the protocol spoken by hand) fills
//     busy actors' mailboxes with 1 MiB messages past its share (they never
//     release it), fills the buffer of unsolicited ask responses (kept for
//     the whole attack: the victim's EarlyTTL is set to outlast it), then
//     starts a maximal frame on every stream it may open and never ends
//     them (that also fills its connection's flow-control window, which
//     stalls its own streams: the order matters);
//   - the stranger (no key, no certificate) opens gossip streams that
//     announce 20 MB of "encrypted" state, as in mesh's flood test.
//
// The victim's live heap may grow by at most what its limits allow, as
// docs/threat-model.md adds them up (memoryBound); every ask of the good
// peer must succeed.
//
// MESHNODE_HOSTILE=30s runs it for that long at full strength (run it
// without -race) and logs the figures quoted in docs/threat-model.md.
func TestMemoryUnderAttack(t *testing.T) {
	// The small version shrinks the member's share of the mailboxes, so
	// that filling it takes little time under -race; the bound follows.
	hold, strangerStreams := 2*time.Second, 8
	edit := func(c *node.Config) { c.PeerQueuedBytes, c.MailboxBytes = 8<<20, 4<<20 }
	if v := os.Getenv("MESHNODE_HOSTILE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("MESHNODE_HOSTILE=%q: %v", v, err)
		}
		hold, strangerStreams, edit = d, 32, func(*node.Config) {}
	}
	cfg := testConfig(t, "n1", t.TempDir())
	edit(&cfg)
	cfg.Responses.EarlyTTL = hold + time.Minute
	victim, err := node.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = victim.Close() })
	good := startNode(t, "n2", t.TempDir(), victim.GossipAddr())
	waitAlive(t, []*node.Node{victim, good}, 2)
	bound := memoryBound(cfg)

	release := make(chan struct{})
	var once sync.Once
	stop := func() { once.Do(func() { close(release) }) }
	t.Cleanup(stop)
	for i := range 4 {
		if _, err := victim.Spawn(fmt.Sprint("busy", i), func(ctx context.Context, m *node.Message) (proto.Message, error) {
			<-release
			return nil, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	echo, err := victim.Spawn("echo", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		return wrapperspb.String("pong"), nil
	})
	if err != nil {
		t.Fatal(err)
	}

	heap := watchLiveHeap()
	var memberBytes, responseBytes, strangerConns atomic.Int64
	evil := rawpeer.Dial(t, testCA(t), "evil", target(victim))
	// First the member fills the busy actors' mailboxes past its share
	// (they never release it). Large frames of one connection share its
	// read budget, so the frames it holds below come after.
	fill, fillDone := context.WithTimeout(context.Background(), 60*time.Second)
	floodMailboxes(fill, evil, 1<<30, cfg.PeerQueuedBytes+8<<20, &memberBytes)
	floodResponses(fill, evil, 3*cfg.Responses.EarlyBytesPerPeer, &responseBytes)
	fillDone()
	testutil.WaitFor(t, 30*time.Second, "the member's shares are full", func() bool {
		return victim.Stats().RefusedPeerBytes > 0 && victim.ResponseStats().Dropped > 0
	})

	ctx, cancel := context.WithTimeout(context.Background(), hold)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { holdFramesInProgress(ctx, evil) })
	for range strangerStreams {
		wg.Go(func() { floodGossip(ctx, victim.GossipAddr(), "meshnode/test", &strangerConns) })
	}

	var asks, failed atomic.Int64
	var lastErr atomic.Value
	for ctx.Err() == nil {
		actx, acancel := context.WithTimeout(context.Background(), 5*time.Second)
		var reply wrapperspb.StringValue
		err := good.Ask(actx, echo, wrapperspb.String("ping"), &reply)
		acancel()
		asks.Add(1)
		if err != nil || reply.GetValue() != "pong" {
			failed.Add(1)
			lastErr.Store(fmt.Sprint(err))
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
	wg.Wait()
	heap.finish()
	stop()

	st := victim.Stats()
	growth := int64(heap.peak) - int64(heap.base)
	t.Logf("attack %v: the member sent %d MiB of messages and %d MiB of responses; the stranger opened %d gossip streams",
		hold, memberBytes.Load()>>20, responseBytes.Load()>>20, strangerConns.Load())
	rs := victim.ResponseStats()
	t.Logf("victim refused: %d messages over the member's share, %d full mailboxes; holds %d unsolicited responses (%d KiB), dropped %d",
		st.RefusedPeerBytes, st.RefusedFull, rs.Early, rs.EarlyBytes>>10, rs.Dropped)
	t.Logf("live heap: %.1f -> peak %.1f MiB (growth %.1f MiB, bound %.1f MiB); good peer: %d asks, %d failed",
		mb(heap.base), mb(heap.peak), mb(uint64(max(growth, 0))), mb(uint64(bound)), asks.Load(), failed.Load())
	if st.RefusedPeerBytes == 0 {
		t.Error("the member never reached its share of the mailboxes: the attack tested nothing")
	}
	if growth > bound {
		t.Errorf("live heap grew %.1f MiB under attack, bound %.1f MiB", mb(uint64(growth)), mb(uint64(bound)))
	}
	if failed.Load() > 0 || asks.Load() == 0 {
		t.Errorf("the good peer's asks: %d of %d failed (last: %v)", failed.Load(), asks.Load(), lastErr.Load())
	}
}

// memoryBound adds up what cfg lets one member and any number of
// strangers make a node hold (docs/threat-model.md):
//
//   - strangers: 3 x InboundStreams x InboundStreamBytes of gossip streams
//     being read (mesh);
//   - one member's connection: quic-go's receive window, a read buffer per
//     stream it may open, MaxReadBytes of frames in progress;
//   - its messages in mailboxes (PeerQueuedBytes, plus one message over)
//     and its unsolicited responses (Responses.EarlyBytesPerPeer);
//   - 16 MiB for everything else that moves under load (decode garbage
//     between GCs, goroutine stacks, the test's own attackers).
func memoryBound(cfg node.Config) int64 {
	// names: what a stream's named body types, routes and origins hold
	// (transport/names.go): 4 KiB of URLs and 64 string headers; 4 KiB of
	// names and 64 pairs of string headers; 8 KiB of origins and 16
	// Origin messages with their pointers; and on the connection's one
	// control stream, 8 KiB of signers and 16 ReceiptSignature messages.
	const quicWindow, streams, readBuf, names = 15 << 20, 2*256 + 16, 16 << 10, 4<<10 + 64*16 + 4<<10 + 64*32 + 8<<10 + 16*(128+8)
	const signers = 8<<10 + 16*(112+8)
	gossip := int64(3 * cfg.Mesh.InboundStreams * cfg.Mesh.InboundStreamBytes)
	conn := int64(quicWindow + streams*(readBuf+names) + signers + cfg.Transport.MaxReadBytes)
	queued := cfg.PeerQueuedBytes + int64(cfg.Transport.MaxFrameSize) + int64(cfg.Responses.EarlyBytesPerPeer)
	return gossip + conn + queued + 16<<20
}

func mb(b uint64) float64 { return float64(b) / (1 << 20) }

// floodMailboxes sends total bytes of 1 MiB tells to the busy actors at
// rate bytes/s.
func floodMailboxes(ctx context.Context, p *rawpeer.Peer, rate int, total int64, sent *atomic.Int64) {
	lane, err := p.Conn.OpenUniStreamSync(ctx)
	if err != nil {
		return
	}
	body := &anypb.Any{TypeUrl: "type.googleapis.com/google.protobuf.BytesValue", Value: make([]byte, 1<<20)}
	start := time.Now()
	for i := 0; ctx.Err() == nil && int64(i)<<20 < total; i++ {
		env := &pb.Envelope{ProtocolVersion: pb.ProtocolVersion, MsgId: fmt.Sprint("flood", i), Sender: "@evil",
			Recipient: fmt.Sprintf("busy%d@n1", i%4), Rpc: &pb.RpcMeta{Kind: pb.RpcMeta_EVENT}, Body: body}
		if p.TrySend(lane, env) != nil {
			return
		}
		sent.Add(1 << 20)
		if ahead := time.Duration(float64(i+1)*(1<<20)/float64(rate)*float64(time.Second)) - time.Since(start); ahead > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(ahead):
			}
		}
	}
}

// holdFramesInProgress opens as many streams as the node allows and
// starts a maximal frame on each, sending exactly what fills the stream's
// 16 KiB read buffer: the node reads it and waits for the frame's bytes
// from the connection's read budget. (Sending more would leave bytes
// unread in the connection's flow-control window and stall the member's
// other streams: its own streams share it.)
func holdFramesInProgress(ctx context.Context, p *rawpeer.Peer) {
	const frame = 4 << 20
	part := binary.AppendUvarint(nil, frame-64)
	part = append(part, make([]byte, 16<<10-len(part))...)
	var wg sync.WaitGroup
	for range 2*256 + 8 {
		s, err := p.Conn.OpenUniStreamSync(ctx)
		if err != nil {
			break
		}
		wg.Go(func() { _, _ = s.Write(part) }) // blocks on flow control: that is the point
	}
	<-ctx.Done()
	_ = p.Conn.CloseWithError(0, "")
	wg.Wait()
}

// floodResponses sends total bytes of RESPONSEs that no ask waits for.
func floodResponses(ctx context.Context, p *rawpeer.Peer, total int, sent *atomic.Int64) {
	lane, err := p.Conn.OpenUniStreamSync(ctx)
	if err != nil {
		return
	}
	body := &anypb.Any{TypeUrl: "x", Value: make([]byte, 15<<10)}
	for i := 0; ctx.Err() == nil && i*(15<<10) < total; i++ {
		env := &pb.Envelope{ProtocolVersion: pb.ProtocolVersion, MsgId: fmt.Sprint("resp", i), Sender: "x@evil", Recipient: "@n1",
			Rpc: &pb.RpcMeta{Kind: pb.RpcMeta_RESPONSE, CorrelationId: fmt.Sprint(rand.Uint64())}, Body: body}
		if p.TrySend(lane, env) != nil {
			return
		}
		sent.Add(15 << 10)
	}
}

// floodGossip is a stranger that knows the cluster label (it is not
// secret) but not the gossip key: streams announcing 20 MB of
// "encrypted" state, sent at 2 MiB/s, reconnecting whenever cut.
func floodGossip(ctx context.Context, target, label string, conns *atomic.Int64) {
	chunk := make([]byte, 64<<10)
	for i := range chunk {
		chunk[i] = byte(rand.Uint32())
	}
	hdr := append([]byte{244, byte(len(label))}, label...) // memberlist's label header
	hdr = append(hdr, 10, 0, 0, 0, 0)                      // an "encrypted" message of ...
	binary.BigEndian.PutUint32(hdr[len(hdr)-4:], 20_000_000)
	d := net.Dialer{Timeout: time.Second}
	for ctx.Err() == nil {
		c, err := d.DialContext(ctx, "tcp", target)
		if err != nil {
			continue
		}
		conns.Add(1)
		done := context.AfterFunc(ctx, func() { _ = c.Close() })
		if _, err := c.Write(hdr); err == nil {
			start, sent := time.Now(), 0
			for ctx.Err() == nil {
				n, err := c.Write(chunk)
				if err != nil {
					break
				}
				sent += n
				if ahead := time.Duration(float64(sent)/float64(2<<20)*float64(time.Second)) - time.Since(start); ahead > 10*time.Millisecond {
					select {
					case <-ctx.Done():
					case <-time.After(ahead):
					}
				}
			}
		}
		done()
		_ = c.Close()
	}
}

// liveHeap samples the live heap (as of each GC) until finish.
type liveHeap struct {
	stop, done chan struct{}
	base, peak uint64
}

func watchLiveHeap() *liveHeap {
	runtime.GC()
	h := &liveHeap{stop: make(chan struct{}), done: make(chan struct{})}
	h.base = liveBytes()
	go func() {
		defer close(h.done)
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			h.peak = max(h.peak, liveBytes())
			select {
			case <-h.stop:
				return
			case <-t.C:
			}
		}
	}()
	return h
}

func liveBytes() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

func (h *liveHeap) finish() { close(h.stop); <-h.done }
