package mesh_test

import (
	"context"
	"encoding/binary"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mesh"
)

// memberlist's wire constants a stranger needs: they are public protocol.
const (
	mlHasLabel = 244 // a label header follows: [244][len][label]
	mlEncrypt  = 10  // encrypted message: [10][uint32 length][ciphertext]
	mlPing     = 0
)

// flood is a stranger on the network who knows the cluster label (it is
// not secret) but not the gossip key, attacking one node's gossip port from
// another loopback address.
type flood struct {
	target, label string
	src           net.IP

	streams, slow, udp int           // attacking goroutines of each kind
	announce           uint32        // "encrypted" length a stream claims, far over the limit
	limit              int           // the node's InboundStreamBytes
	slowEvery          time.Duration // a slowloris sends one byte this often
	pps                int           // datagrams per second per UDP goroutine; 0 = flat out
	bps                int           // bytes per second per stream goroutine; 0 = flat out

	// Counters, for the report.
	conns, streamBytes, packets atomic.Uint64
}

func (f *flood) labelHeader() []byte {
	return append([]byte{mlHasLabel, byte(len(f.label))}, f.label...)
}

// run attacks until ctx ends; every goroutine returns by then.
func (f *flood) run(ctx context.Context) {
	var wg sync.WaitGroup
	for range f.streams {
		wg.Go(func() { f.streamLoop(ctx, 0) })
	}
	for range f.slow {
		wg.Go(func() { f.streamLoop(ctx, f.slowEvery) })
	}
	for range f.udp {
		wg.Go(func() { f.udpLoop(ctx) })
	}
	wg.Wait()
}

// streamLoop opens a stream that announces "encrypted" state and sends it:
// every = 0 sends as fast as the node reads, alternately announcing
// f.announce (far over the limit) and just under the node's byte limit (so
// memberlist reads all of it: the worst case for memory); every > 0 is a
// slowloris that trickles even the header, one byte per every. It
// reconnects whenever the node cuts the stream.
func (f *flood) streamLoop(ctx context.Context, every time.Duration) {
	chunk := make([]byte, 64<<10)
	for i := range chunk {
		chunk[i] = byte(rand.Uint32())
	}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: f.src}, Timeout: time.Second}
	for round := 0; ctx.Err() == nil; round++ {
		announce := f.announce
		if round%2 == 1 {
			announce = uint32(f.limit) - 5 - uint32(len(f.labelHeader()))
		}
		hdr := append(f.labelHeader(), mlEncrypt, 0, 0, 0, 0)
		binary.BigEndian.PutUint32(hdr[len(hdr)-4:], announce)
		c, err := d.DialContext(ctx, "tcp", f.target)
		if err != nil {
			continue // accept queue full or shutting down: try again
		}
		f.conns.Add(1)
		stop := context.AfterFunc(ctx, func() { _ = c.Close() })
		if every > 0 {
			for i := 0; ctx.Err() == nil; i++ {
				p := chunk[:1]
				if i < len(hdr) {
					p = hdr[i : i+1]
				}
				if _, err := c.Write(p); err != nil {
					break
				}
				select {
				case <-ctx.Done():
				case <-time.After(every):
				}
			}
		} else if _, err := c.Write(hdr); err == nil {
			pace := newPacer(f.bps)
			for left := int(announce); left > 0 && ctx.Err() == nil; {
				n, err := c.Write(chunk[:min(left, len(chunk))])
				f.streamBytes.Add(uint64(n))
				left -= n
				if err != nil || !pace.wait(ctx, n) {
					break
				}
			}
			// Sent everything it announced: wait for the node to give up.
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, _ = io.Copy(io.Discard, c)
		}
		stop()
		_ = c.Close()
	}
}

// udpLoop sends labelled garbage of every size up to the largest datagram,
// with a valid-looking ping header now and then.
func (f *flood) udpLoop(ctx context.Context) {
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: f.src})
	if err != nil {
		return
	}
	defer c.Close()
	to, err := net.ResolveUDPAddr("udp", f.target)
	if err != nil {
		return
	}
	hdr := f.labelHeader()
	buf := make([]byte, 60000)
	for i := range buf {
		buf[i] = byte(rand.Uint32())
	}
	copy(buf, hdr)
	sizes := []int{100, 1400, 1400, 1400, 9000, 60000}
	pace := newPacer(f.pps)
	for i := 0; ctx.Err() == nil && pace.wait(ctx, 1); i++ {
		p := buf[:sizes[i%len(sizes)]]
		p[len(hdr)] = byte(i % 2 * mlEncrypt) // mlPing (0) or "encrypted"
		if _, err := c.WriteTo(p, to); err == nil {
			f.packets.Add(1)
		}
		if i%64 == 0 {
			runtime.Gosched() // let the victim's reader run on two cores
		}
	}
}

// pacer keeps a sender at rate units per second (0 = unpaced), sleeping
// in steps of at least 10 ms.
type pacer struct {
	rate  int
	start time.Time
	sent  int
}

func newPacer(rate int) *pacer { return &pacer{rate: rate, start: time.Now()} }

// wait accounts n units and sleeps while ahead of schedule; false once ctx
// ends.
func (p *pacer) wait(ctx context.Context, n int) bool {
	p.sent += n
	if p.rate <= 0 {
		return ctx.Err() == nil
	}
	ahead := time.Duration(float64(p.sent)/float64(p.rate)*float64(time.Second)) - time.Since(p.start)
	if ahead < 10*time.Millisecond {
		return ctx.Err() == nil
	}
	select {
	case <-ctx.Done():
		return false
	case <-time.After(ahead):
		return true
	}
}

// heapWatch samples the process heap until stopped and keeps the peaks.
type heapWatch struct {
	stop           chan struct{}
	done           chan struct{}
	peakAlloc      uint64 // runtime.MemStats.HeapAlloc: live plus not yet collected
	peakLive       uint64 // live heap as of the last GC (/gc/heap/live:bytes)
	baseAlloc, bLv uint64
}

func watchHeap() *heapWatch {
	runtime.GC()
	h := &heapWatch{stop: make(chan struct{}), done: make(chan struct{})}
	h.baseAlloc, h.bLv = h.sample()
	go func() {
		defer close(h.done)
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			a, l := h.sample()
			h.peakAlloc, h.peakLive = max(h.peakAlloc, a), max(h.peakLive, l)
			select {
			case <-h.stop:
				return
			case <-t.C:
			}
		}
	}()
	return h
}

func (h *heapWatch) sample() (alloc, live uint64) {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return ms.HeapAlloc, s[0].Value.Uint64()
}

func (h *heapWatch) finish() { close(h.stop); <-h.done }

const mib = 1 << 20

// TestGossipFloodCannotMoveMembership attacks one node of a 3-node cluster
// as a stranger would: many TCP streams to the gossip port, each announcing
// 20 MB of "encrypted" state, slowloris streams, and UDP noise of every
// size. Nobody may be suspected, and the live heap may not grow by more
// than the documented bound, 3 x InboundStreams x InboundStreamBytes.
//
// MESH_FLOOD=30s runs the big version (64 streams at 4 MiB/s, 128
// slowloris, 10,000 datagrams/s, for the given time; run it without -race)
// and logs the figures quoted in docs/fleet-scale.md. Flat-out in-process
// attackers with hundreds of goroutines are a contest for the two CPUs the
// victim shares with them, and UDP beyond the socket buffer loses honest
// packets in the kernel: volumetric floods need a limit in the network.
func TestGossipFloodCannotMoveMembership(t *testing.T) {
	// The attackers are paced (2 MiB/s per stream, 5,000 datagrams/s per
	// UDP sender): on two shared cores an in-process attacker flat out takes
	// the CPU the victim needs, which tests the CPUs, not the gossip port.
	hold, streams, slow, udp, pps, bps := 4*time.Second, 16, 8, 2, 5_000, 2<<20
	if v := os.Getenv("MESH_FLOOD"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("MESH_FLOOD=%q: %v", v, err)
		}
		hold, streams, slow, udp, pps, bps = d, 64, 128, 2, 5_000, 4<<20
	}
	nodes := startCluster(t, 3, nil)
	waitConverged(t, nodes, 5*time.Second)
	victim := nodes[0]
	cfg := mesh.DefaultConfig("x")
	bound := uint64(3 * cfg.InboundStreams * cfg.InboundStreamBytes)

	before := make([]int, len(nodes))
	// moved counts suspect, dead and left events about the three members.
	// The joiner started under the attack in a CPU-starved process may be
	// suspected for a moment; that is start-up, not the stranger's doing.
	// The normal run, under -race on two cores shared with other work, only
	// logs membership changes (load alone causes them there) and asserts the
	// heap bound, the limits and that everyone is alive afterwards;
	// MESH_FLOOD (no -race) fails on any suspicion.
	strict := os.Getenv("MESH_FLOOD") != ""
	moved := func(n *testNode) int {
		skip := []mesh.EventKind{mesh.EventJoin, mesh.EventAlive, mesh.EventUpdate, mesh.EventRestart}
		if !strict {
			skip = append(skip, mesh.EventSuspect)
		}
		c := 0
		for _, o := range nodes {
			c += len(n.events.kinds(o.LocalName(), skip...))
		}
		return c
	}
	for i, n := range nodes {
		before[i] = moved(n)
	}
	heap := watchHeap()
	f := &flood{
		target: victim.GossipAddr(), label: "meshnode/test", src: net.IPv4(127, 0, 0, 2),
		streams: streams, slow: slow, udp: udp, announce: 20_000_000, limit: cfg.InboundStreamBytes,
		slowEvery: 100 * time.Millisecond, pps: pps, bps: bps,
	}
	ctx, cancel := context.WithTimeout(context.Background(), hold)
	defer cancel()
	attackDone := make(chan struct{})
	go func() { f.run(ctx); close(attackDone) }()

	// Membership must not move while the attack lasts, and a node may still
	// join through the victim (its stream waits for a slot, not forever).
	joiner := testConfig(t, "joiner")
	joiner.Join = []string{victim.GossipAddr()}
	j := start(t, joiner)
	all := append(nodes[:len(nodes):len(nodes)], j)
	testutil.WaitFor(t, hold+10*time.Second, "attack over", func() bool {
		for i, n := range nodes {
			if c := moved(n) - before[i]; c > 0 {
				n.events.mu.Lock()
				for _, ev := range n.events.evs {
					t.Logf("%s: %s %s", n.LocalName(), ev.Kind, ev.Member.Name)
				}
				n.events.mu.Unlock()
				if strict {
					t.Fatalf("%s saw %d suspect/dead/left events under a stranger's flood", n.LocalName(), c)
				}
			}
		}
		select {
		case <-attackDone:
			return true
		default:
			return false
		}
	})
	heap.finish()
	waitConverged(t, all, 10*time.Second) // the joiner got in, during or right after
	st := victim.InboundStats()
	growth := int64(heap.peakLive) - int64(heap.bLv)
	t.Logf("attack %v: %d stream connections, %d MiB written into them, %d datagrams", hold,
		f.conns.Load(), f.streamBytes.Load()/mib, f.packets.Load())
	t.Logf("victim inbound: %+v", st)
	t.Logf("heap: live %.1f -> peak %.1f MiB (growth %.1f MiB, bound %d MiB); HeapAlloc %.1f -> peak %.1f MiB",
		float64(heap.bLv)/mib, float64(heap.peakLive)/mib, float64(growth)/mib, bound/mib,
		float64(heap.baseAlloc)/mib, float64(heap.peakAlloc)/mib)
	if st.StreamsTooLarge == 0 || st.PacketsTooLarge == 0 {
		t.Errorf("the attack never reached a limit (%+v): it tested nothing", st)
	}
	if growth > int64(bound) {
		t.Errorf("live heap grew %d MiB under the flood, bound %d MiB", growth/mib, bound/mib)
	}
	for _, n := range nodes {
		if n.NumAlive() != len(all) {
			t.Errorf("%s sees %d alive, want %d", n.LocalName(), n.NumAlive(), len(all))
		}
	}
}
