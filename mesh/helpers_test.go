package mesh_test

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/meshnode/meshnode/internal/ident"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/mesh"
)

var testKey = []byte("0123456789abcdef0123456789abcdef")

// logBuf is a concurrency-safe sink for a node's logs so tests can assert
// what was logged.
type logBuf struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// eventLog records the events a node published.
type eventLog struct {
	mu  sync.Mutex
	evs []mesh.Event
}

func (e *eventLog) add(ev mesh.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.evs = append(e.evs, ev)
}

// kinds returns the event kinds seen for member name, minus those in skip.
func (e *eventLog) kinds(name string, skip ...mesh.EventKind) []mesh.EventKind {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []mesh.EventKind
next:
	for _, ev := range e.evs {
		if ev.Member.Name != name {
			continue
		}
		for _, s := range skip {
			if ev.Kind == s {
				continue next
			}
		}
		out = append(out, ev.Kind)
	}
	return out
}

func (e *eventLog) has(kind mesh.EventKind, name string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, ev := range e.evs {
		if ev.Kind == kind && ev.Member.Name == name {
			return true
		}
	}
	return false
}

func (e *eventLog) count(kinds ...mesh.EventKind) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, ev := range e.evs {
		for _, k := range kinds {
			if ev.Kind == k {
				n++
			}
		}
	}
	return n
}

type testNode struct {
	*mesh.Mesh
	cfg    mesh.Config
	events *eventLog
	logs   *logBuf
}

// testConfig is DefaultConfig on loopback with a temp data dir, encryption,
// a fake QUIC address and logs captured instead of printed.
func testConfig(tb testing.TB, name string) mesh.Config {
	tb.Helper()
	cfg := mesh.DefaultConfig(name)
	cfg.Cluster = "test"
	cfg.DataDir = tb.TempDir()
	cfg.SecretKey = testKey
	cfg.Meta = &pb.NodeMeta{QuicAddr: "127.0.0.1:" + fmt.Sprint(40000+len(name)), BootId: ident.NewBootID()}
	return cfg
}

// start runs New with an event log and a log buffer and closes the node at
// the end of the test.
func start(tb testing.TB, cfg mesh.Config) *testNode {
	tb.Helper()
	n := &testNode{cfg: cfg, events: &eventLog{}, logs: &logBuf{}}
	n.cfg.OnEvent = n.events.add
	n.cfg.Logger = slog.New(slog.NewTextHandler(n.logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	m, err := mesh.New(n.cfg)
	if err != nil {
		tb.Fatalf("New(%s): %v", cfg.NodeName, err)
	}
	n.Mesh = m
	tb.Cleanup(func() { _ = m.Kill() }) // fast teardown; Close is tested on purpose
	return n
}

// startCluster starts n nodes, all seeded with the first one.
func startCluster(tb testing.TB, n int, mod func(i int, cfg *mesh.Config)) []*testNode {
	tb.Helper()
	nodes := make([]*testNode, 0, n)
	for i := range n {
		cfg := testConfig(tb, fmt.Sprintf("n%02d", i))
		if i > 0 {
			cfg.Join = []string{nodes[0].GossipAddr()}
		}
		if mod != nil {
			mod(i, &cfg)
		}
		nodes = append(nodes, start(tb, cfg))
	}
	return nodes
}

func waitConverged(tb testing.TB, nodes []*testNode, timeout time.Duration) {
	tb.Helper()
	testutil.WaitFor(tb, timeout, fmt.Sprintf("%d nodes see each other alive", len(nodes)), func() bool {
		for _, n := range nodes {
			if n.NumAlive() != len(nodes) {
				return false
			}
		}
		return true
	})
}

func stateAt(n *testNode, name string) mesh.State {
	m, ok := n.Member(name)
	if !ok {
		return 0
	}
	return m.State
}

// faultNet is a raft-style test network: it cuts gossip between groups of
// addresses by dropping packets and refusing streams on the sending side.
// Every node's transport is wrapped, so one side suffices.
type faultNet struct {
	mu  sync.Mutex
	cut map[[2]string]bool
}

func newFaultNet() *faultNet { return &faultNet{cut: map[[2]string]bool{}} }

// Partition cuts every link between a and b in both directions.
func (f *faultNet) Partition(a, b []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, x := range a {
		for _, y := range b {
			f.cut[[2]string{x, y}] = true
			f.cut[[2]string{y, x}] = true
		}
	}
}

// Heal restores every link.
func (f *faultNet) Heal() {
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(f.cut)
}

func (f *faultNet) isCut(from, to string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cut[[2]string{from, to}]
}

// Wrap is a Config.WrapTransport.
func (f *faultNet) Wrap(t memberlist.NodeAwareTransport) memberlist.NodeAwareTransport {
	_, port, err := t.FinalAdvertiseAddr("", 0)
	if err != nil {
		panic(fmt.Sprintf("faultNet: transport has no address: %v", err)) // test helper: a broken transport is a test bug
	}
	return &faultTransport{NodeAwareTransport: t, net: f, self: fmt.Sprintf("127.0.0.1:%d", port)}
}

var errCut = errors.New("faultnet: link cut")

type faultTransport struct {
	memberlist.NodeAwareTransport
	net  *faultNet
	self string
}

func (t *faultTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	if t.net.isCut(t.self, addr) {
		return time.Now(), nil // dropped silently, like a lost datagram
	}
	return t.NodeAwareTransport.WriteTo(b, addr)
}

func (t *faultTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	if t.net.isCut(t.self, a.Addr) {
		return time.Now(), nil
	}
	return t.NodeAwareTransport.WriteToAddress(b, a)
}

func (t *faultTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	if t.net.isCut(t.self, addr) {
		return nil, errCut
	}
	return t.NodeAwareTransport.DialTimeout(addr, timeout)
}

func (t *faultTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	if t.net.isCut(t.self, a.Addr) {
		return nil, errCut
	}
	return t.NodeAwareTransport.DialAddressTimeout(a, timeout)
}
