package mesh

import (
	"fmt"
	"io"
	"log"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/meshnode/meshnode/internal/ident"
	"github.com/meshnode/meshnode/internal/plot"
	"github.com/meshnode/meshnode/mailbox/pb"
)

// simNet is an in-memory network for memberlist: packets are delivered at
// once into a bounded queue (dropped when full, as UDP would be), streams
// are net.Pipe pairs. It counts the bytes members send.
type simNet struct {
	// mu guards the field below.
	mu    sync.RWMutex
	nodes map[string]*simTransport

	bytes     atomic.Uint64 // gossip bytes sent, packets and streams
	delivered atomic.Uint64 // packets queued at their receiver
}

func newSimNet() *simNet { return &simNet{nodes: map[string]*simTransport{}} }

// simTransport is one member's endpoint on a simNet.
type simTransport struct {
	net     *simNet
	addr    *net.UDPAddr
	packets chan *memberlist.Packet
	streams chan net.Conn
	done    chan struct{}
	once    sync.Once
}

var _ memberlist.NodeAwareTransport = (*simTransport)(nil)

func (n *simNet) add(i int) *simTransport {
	ip := net.IPv4(10, byte(i>>16), byte(i>>8), byte(i)).To4()
	t := &simTransport{
		net:     n,
		addr:    &net.UDPAddr{IP: ip, Port: 7946},
		packets: make(chan *memberlist.Packet, 1024),
		streams: make(chan net.Conn),
		done:    make(chan struct{}),
	}
	n.mu.Lock()
	n.nodes[t.addr.String()] = t
	n.mu.Unlock()
	return t
}

func (n *simNet) lookup(addr string) *simTransport {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.nodes[addr]
}

func (t *simTransport) FinalAdvertiseAddr(string, int) (net.IP, int, error) {
	return t.addr.IP, t.addr.Port, nil
}

func (t *simTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	t.net.bytes.Add(uint64(len(b)))
	dst := t.net.lookup(addr)
	if dst == nil {
		return time.Now(), nil // nobody there: lost
	}
	p := &memberlist.Packet{Buf: append([]byte(nil), b...), From: t.addr, Timestamp: time.Now()}
	select {
	case dst.packets <- p:
		t.net.delivered.Add(1)
	case <-dst.done:
	default: // receive queue full: lost, as a UDP socket buffer would
	}
	return time.Now(), nil
}

func (t *simTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	return t.WriteTo(b, a.Addr)
}

func (t *simTransport) PacketCh() <-chan *memberlist.Packet { return t.packets }
func (t *simTransport) StreamCh() <-chan net.Conn           { return t.streams }

func (t *simTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	dst := t.net.lookup(addr)
	if dst == nil {
		return nil, fmt.Errorf("sim: dial %s: no such member", addr)
	}
	a, b := net.Pipe()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case dst.streams <- &simConn{Conn: b, local: dst.addr, remote: t.addr, bytes: &t.net.bytes}:
		return &simConn{Conn: a, local: t.addr, remote: dst.addr, bytes: &t.net.bytes}, nil
	case <-dst.done:
	case <-t.done:
	case <-timer.C:
	}
	_, _ = a.Close(), b.Close()
	return nil, fmt.Errorf("sim: dial %s: refused", addr)
}

func (t *simTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	return t.DialTimeout(a.Addr, timeout)
}

func (t *simTransport) Shutdown() error {
	t.once.Do(func() {
		t.net.mu.Lock()
		delete(t.net.nodes, t.addr.String())
		t.net.mu.Unlock()
		close(t.done)
	})
	return nil
}

// simConn gives a pipe end real addresses and counts the bytes written on
// it (both ends: a push/pull's request and its answer).
type simConn struct {
	net.Conn
	local, remote net.Addr
	bytes         *atomic.Uint64
}

func (c *simConn) LocalAddr() net.Addr  { return c.local }
func (c *simConn) RemoteAddr() net.Addr { return c.remote }
func (c *simConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.bytes.Add(uint64(n))
	return n, err
}

// simMember is one memberlist with counters the simulation reads without
// walking memberlist's node list (O(n) per call, O(n^2) per poll).
type simMember struct {
	ml    *memberlist.Memberlist
	meta  []byte
	alive atomic.Int64 // members this one holds alive, itself included
	sim   *simCluster
	// seenDead, when set, reports NotifyLeave (the measurement of a death).
	seenDead func(name string)
}

func (m *simMember) NodeMeta(int) []byte             { return m.meta }
func (m *simMember) NotifyMsg([]byte)                {}
func (m *simMember) GetBroadcasts(int, int) [][]byte { return nil }
func (m *simMember) LocalState(bool) []byte          { return nil }
func (m *simMember) MergeRemoteState([]byte, bool)   {}
func (m *simMember) NotifyUpdate(*memberlist.Node)   {}
func (m *simMember) NotifyJoin(*memberlist.Node) {
	if m.alive.Add(1) == int64(m.sim.size) {
		m.sim.converged.Add(1)
	}
}
func (m *simMember) NotifyLeave(n *memberlist.Node) {
	if m.alive.Add(-1) == int64(m.sim.size)-1 {
		m.sim.converged.Add(-1)
	}
	if f := m.seenDead; f != nil {
		f(n.Name)
	}
}

// simCluster is size members on one simNet, all with PresetFor(size).
type simCluster struct {
	size      int
	net       *simNet
	members   []*simMember
	converged atomic.Int64 // members that hold all size members alive
	cfg       Config
}

func newSimCluster(tb testing.TB, size int) *simCluster {
	tb.Helper()
	c := &simCluster{size: size, net: newSimNet(), cfg: PresetFor("sim", size)}
	c.cfg.Cluster = "sim"
	quiet := log.New(io.Discard, "", 0)
	for i := range size {
		name := fmt.Sprintf("m%05d", i)
		meta, err := encodeMeta(fillMeta(&pb.NodeMeta{
			QuicAddr: fmt.Sprintf("10.%d.%d.%d:7947", byte(i>>16), byte(i>>8), byte(i)), BootId: ident.NewBootID(),
		}, c.cfg.Cluster))
		if err != nil {
			tb.Fatal(err)
		}
		m := &simMember{meta: meta, sim: c}
		cfg := c.cfg
		cfg.NodeName = name
		mc := cfg.memberlistConfig()
		tr := c.net.add(i)
		mc.Transport = newStreamGuard(tr, cfg.streamLimits())
		mc.BindAddr, mc.BindPort = tr.addr.IP.String(), tr.addr.Port
		mc.AdvertiseAddr, mc.AdvertisePort = tr.addr.IP.String(), tr.addr.Port
		mc.Delegate, mc.Events = m, m
		mc.Logger = quiet
		ml, err := memberlist.Create(mc)
		if err != nil {
			tb.Fatalf("member %d: %v", i, err)
		}
		m.ml = ml
		c.members = append(c.members, m)
	}
	return c
}

// joinWave has every member but the first join one random member that
// joined before it (the first member for the second), one after another
// with no virtual time between them.
func (c *simCluster) joinWave(tb testing.TB) {
	tb.Helper()
	for i := 1; i < c.size; i++ {
		seed := c.members[rand.IntN(i)].ml.LocalNode().Address()
		if _, err := c.members[i].ml.Join([]string{seed}); err != nil {
			tb.Fatalf("member %d join %s: %v", i, seed, err)
		}
	}
}

// waitUntil advances virtual time in steps until cond holds or limit passes;
// it returns the virtual time taken.
func waitUntil(tb testing.TB, step, limit time.Duration, what string, cond func() bool) time.Duration {
	tb.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > limit {
			tb.Fatalf("sim: %s not within %v of virtual time", what, limit)
		}
		time.Sleep(step) // virtual time: the synctest bubble's clock
	}
	return time.Since(start)
}

// shutdown stops every member, then lets virtual time run past the
// longest probe so memberlist's probe goroutines (which Shutdown does not
// wait for) end inside the bubble.
func (c *simCluster) shutdown() {
	for _, m := range c.members {
		_ = m.ml.Shutdown()
	}
	time.Sleep(2 * (c.cfg.ProbeInterval + c.cfg.TCPTimeout)) // virtual time
}

// spread times one broadcast: start makes it, and it has reached everyone
// when count calls of the hook installed by arm have been seen.
func (c *simCluster) spread(tb testing.TB, name string, arm func(m *simMember, hook func(string)), start func(), curve *plot.Series) time.Duration {
	tb.Helper()
	var seen atomic.Int64
	want := int64(0)
	for _, m := range c.members {
		if m.ml.LocalNode().Name != name {
			want++
			arm(m, func(n string) {
				if n == name {
					seen.Add(1)
				}
			})
		}
	}
	began := time.Now()
	start()
	return waitUntil(tb, 5*time.Millisecond, 10*time.Minute, "broadcast reaches everyone", func() bool {
		n := seen.Load()
		addChange(curve, time.Since(began), float64(n))
		return n >= want
	})
}

// simFigures is what one simulation run measures.
type simFigures struct {
	size                      int
	converge                  time.Duration // join wave start -> everyone holds everyone alive
	detect, disseminate       time.Duration // kill -> first member declares it dead -> all do
	bytesPerMemberSec         float64       // steady gossip, packets and streams
	heapPerMember             float64       // bytes of live heap per member, converged
	wall                      time.Duration
	gossipRoundsToDisseminate float64
	logN                      float64
	// The curves of the report: members that hold everyone alive after the
	// join wave began, members that declared the victim dead after the kill
	// (by virtual seconds).
	converging, dying plot.Series
}

// addChange appends (at, v) to s when v differs from its last point.
func addChange(s *plot.Series, at time.Duration, v float64) {
	if k := len(s.Points); k == 0 || s.Points[k-1].V != v {
		s.Points = append(s.Points, plot.Point{T: at.Seconds(), V: v})
	}
}

// simulate runs the join wave, a steady window and one death in a synctest
// bubble and returns the figures.
func simulate(t *testing.T, size int, steady time.Duration) simFigures {
	var f simFigures
	f.size = size
	wallStart := time.Now()
	synctest.Test(t, func(t *testing.T) {
		var before runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		c := newSimCluster(t, size)
		defer c.shutdown()
		// Convergence after a join wave waits for push/pulls to repair
		// lost alive messages: allow three of memberlist's scaled push/pull
		// intervals (PushPullInterval x (log2(n/32)+1) above 32 members).
		limit := max(10*time.Minute, 3*time.Duration(float64(c.cfg.PushPullInterval)*(math.Log2(max(1, float64(size)/32))+1)))
		start := time.Now()
		c.joinWave(t)
		joined := time.Since(start)
		f.converge = joined + waitUntil(t, 100*time.Millisecond, limit, "convergence", func() bool {
			n := c.converged.Load()
			addChange(&f.converging, time.Since(start), float64(n))
			return n == int64(size)
		})
		var after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&after)
		f.heapPerMember = float64(after.HeapAlloc-before.HeapAlloc) / float64(size)

		b0 := c.net.bytes.Load()
		time.Sleep(steady)
		f.bytesPerMemberSec = float64(c.net.bytes.Load()-b0) / float64(size) / steady.Seconds()

		// A death: the victim stops answering. detect is the time until the
		// first member declares it dead (probe, suspicion timeout);
		// disseminate the time from there until every member has.
		victim := c.members[size/2]
		name := victim.ml.LocalNode().Name
		var first atomic.Int64 // virtual unix nanos of the first declaration
		killed := time.Now()
		total := c.spread(t, name, func(m *simMember, h func(string)) {
			m.seenDead = func(n string) {
				if n == name {
					first.CompareAndSwap(0, time.Now().UnixNano())
				}
				h(n)
			}
		}, func() { _ = victim.ml.Shutdown() }, &f.dying)
		f.detect = time.Unix(0, first.Load()).Sub(killed)
		f.disseminate = total - f.detect
	})
	f.wall = time.Since(wallStart)
	cfg := PresetFor("sim", size)
	f.gossipRoundsToDisseminate = f.disseminate.Seconds() / cfg.GossipInterval.Seconds()
	f.logN = math.Log2(float64(size))
	return f
}

func (f simFigures) String() string {
	return fmt.Sprintf("| %d | %.1f s | %.2f s | %.2f s (%.1f gossip rounds; log2 n = %.1f) | %.0f B/s | %.1f KiB | %v |",
		f.size, f.converge.Seconds(), f.detect.Seconds(), f.disseminate.Seconds(), f.gossipRoundsToDisseminate, f.logN,
		f.bytesPerMemberSec, f.heapPerMember/1024, f.wall.Round(time.Second))
}

// TestSimulatedCluster runs memberlist with mesh's presets on an in-memory
// network in virtual time (testing/synctest): a join wave, a steady
// window, one death. The normal suite runs 100 members; MESH_SIM=1000,5000
// runs the sizes quoted in docs/fleet-scale.md (minutes of wall time and
// gigabytes of heap at 5,000: every member holds every other):
//
//	MESH_SIM=1000,5000 go test -run TestSimulatedCluster -v -timeout 150m ./mesh/
func TestSimulatedCluster(t *testing.T) {
	sizes := []int{100}
	steady := 30 * time.Second
	if v := os.Getenv("MESH_SIM"); v != "" {
		sizes = nil
		for _, s := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil || n < 3 {
				t.Fatalf("MESH_SIM=%q: want sizes >= 3", v)
			}
			sizes = append(sizes, n)
		}
		steady = 2 * time.Minute
	}
	t.Log("| members | converge after join wave | kill -> first declares dead | -> all have declared | gossip per member | heap per member | wall time |")
	t.Log("|---|---|---|---|---|---|---|")
	for _, n := range sizes {
		f := simulate(t, n, steady)
		t.Log(f.String())
		f.report(t)
		// What the presets promise, and what SWIM predicts: a death reaches
		// everyone in O(log n) gossip rounds, the suspicion timeout bounds
		// detection, and a member's gossip traffic stays small.
		cfg := PresetFor("sim", n)
		if maxDetect := cfg.maxSuspicion(n) + 10*cfg.ProbeInterval; f.detect > maxDetect {
			t.Errorf("%d members: first declaration of a death after %v, more than %v", n, f.detect, maxDetect)
		}
		if rounds := 2 * f.logN; f.gossipRoundsToDisseminate > rounds {
			t.Errorf("%d members: a broadcast took %.1f gossip rounds to reach everyone, more than 2 log2 n = %.0f", n, f.gossipRoundsToDisseminate, rounds)
		}
	}
}

// report writes sim-N.svg when MESH_REPORT_DIR names a directory (make sim:
// docs/).
func (f simFigures) report(tb testing.TB) {
	dir := os.Getenv("MESH_REPORT_DIR")
	if dir == "" {
		return
	}
	f.converging.Name, f.dying.Name = "members that hold all alive", "members that declared it dead"
	path := filepath.Join(dir, fmt.Sprintf("sim-%d.svg", f.size))
	err := plot.WriteFile(path, fmt.Sprintf("make sim: %d simulated members, virtual time", f.size), []plot.Chart{
		{Title: "Join wave: members that hold every member alive (virtual seconds since the wave began)", YLabel: "members", Series: []plot.Series{f.converging}},
		{Title: "A member stops: members that declared it dead (virtual seconds since it stopped)", YLabel: "members", Series: []plot.Series{f.dying}},
	})
	if err != nil {
		tb.Errorf("report: %v", err)
		return
	}
	tb.Logf("report: %s", path)
}
