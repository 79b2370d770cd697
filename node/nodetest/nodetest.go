// Package nodetest starts clusters of real meshnode nodes in one process,
// for the tests of applications built on node: every node has its own
// data directory, QUIC and gossip on loopback, and a certificate from one
// test CA; the cluster is closed when the test ends.
//
//	c := nodetest.New(t, []string{"operator", "device-1"},
//		nodetest.WithSetup(func(n *node.Node) error { // before the node joins, and on every restart
//			_, err := n.Spawn("echo", echo)
//			return err
//		}))
//	err := c.Node("operator").Ask(ctx, node.Addr("echo", "device-1"), req, &resp)
//	c.Kill("device-1")    // a crash: its data directory stays
//	c.Restart("device-1") // the same name and data, new ports
//
// # Guarantees
//
//   - New and Restart return once every running node sees every running
//     node alive; Kill and Stop once every other running node sees the
//     node down. Restart, Kill and Stop also wait until every other node
//     has reacted to the change (failed its asks to the old incarnation,
//     say), so a send right after meets the new state. Any failure fails
//     the test (tb.Fatal) with the reason.
//   - Setup runs between node.Open and Node.Start, so the actors it spawns
//     are in place before any peer can send to them, on the first start
//     and after every restart.
//   - Close (at the test's end) kills every node still running: a test's
//     end needs no graceful leave.
//
// # Decisions
//
//   - nodetest is for applications; testnet (in this repository) is the
//     fault laboratory under meshnode's own claims: a fault network under
//     gossip and QUIC, a nemesis, an invariant checker and scenarios,
//     addressed by index. An application test wants names and a few lines.
//   - Nodes join every running node, so a restarted first node is not left
//     alone; gossip is encrypted with a key made for the cluster.
package nodetest

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/mesh"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/transport"
)

// Option configures a Cluster.
type Option func(*options)

type options struct {
	setup   []func(n *node.Node) error
	config  []func(cfg *node.Config)
	timeout time.Duration
}

// WithSetup runs f on every node after node.Open and before Node.Start
// (again after every restart): spawn the node's actors here. n.Name() tells
// the nodes apart.
func WithSetup(f func(n *node.Node) error) Option {
	return func(o *options) { o.setup = append(o.setup, f) }
}

// WithConfig edits every node's config before node.Open (cfg.Name tells
// the nodes apart).
func WithConfig(f func(cfg *node.Config)) Option {
	return func(o *options) { o.config = append(o.config, f) }
}

// WithTimeout bounds each wait for the cluster to converge or to see a
// node down (default 20 s).
func WithTimeout(d time.Duration) Option { return func(o *options) { o.timeout = d } }

// Cluster is a set of named nodes in this process. Its methods are safe for
// concurrent use and fail the test on error.
type Cluster struct {
	tb   testing.TB
	opts options
	ca   *transport.CA
	key  []byte
	dir  string

	// mu guards the fields below.
	mu    sync.Mutex
	names []string
	nodes map[string]*node.Node // nil while down
}

// New starts a node for each name, waits until all see all alive, and
// closes the cluster when the test ends.
func New(tb testing.TB, names []string, opts ...Option) *Cluster {
	tb.Helper()
	o := options{timeout: 20 * time.Second}
	for _, opt := range opts {
		opt(&o)
	}
	ca, err := transport.NewCA("nodetest CA", 24*time.Hour)
	if err != nil {
		tb.Fatalf("nodetest: CA: %v", err)
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	c := &Cluster{tb: tb, opts: o, ca: ca, key: key, dir: tb.TempDir(), names: append([]string(nil), names...), nodes: map[string]*node.Node{}}
	tb.Cleanup(c.close)
	for _, name := range names {
		if _, dup := c.nodes[name]; dup {
			tb.Fatalf("nodetest: node %q named twice", name)
		}
		c.nodes[name] = nil
		if err := c.start(name); err != nil {
			tb.Fatalf("nodetest: %v", err)
		}
	}
	c.WaitConverged()
	return c
}

// Node returns the running node of that name (nil while it is down).
func (c *Cluster) Node(name string) *node.Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[name]
}

// DataDir returns the data directory of the node of that name.
func (c *Cluster) DataDir(name string) string { return filepath.Join(c.dir, name) }

// start opens, sets up and starts the node of that name.
func (c *Cluster) start(name string) error {
	c.mu.Lock()
	var join []string
	for _, n := range c.nodes {
		if n != nil {
			join = append(join, n.GossipAddr())
		}
	}
	c.mu.Unlock()
	id, err := c.ca.NewIdentity(name)
	if err != nil {
		return fmt.Errorf("identity of %s: %w", name, err)
	}
	cfg := node.DefaultConfig(name)
	cfg.Cluster = "nodetest"
	cfg.DataDir = c.DataDir(name)
	cfg.GossipAddr, cfg.QUICAddr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Join, cfg.GossipKey, cfg.TLS = join, c.key, id
	for _, f := range c.opts.config {
		f(&cfg)
	}
	n, err := node.Open(cfg)
	if err != nil {
		return fmt.Errorf("open %s: %w", name, err)
	}
	for _, f := range c.opts.setup {
		if err := f(n); err != nil {
			_ = n.Kill()
			return fmt.Errorf("set up %s: %w", name, err)
		}
	}
	if err := n.Start(c.tb.Context()); err != nil {
		_ = n.Kill()
		return fmt.Errorf("start %s: %w", name, err)
	}
	c.mu.Lock()
	c.nodes[name] = n
	c.mu.Unlock()
	return nil
}

// take detaches the running node of that name.
func (c *Cluster) take(name string) *node.Node {
	c.tb.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	n, known := c.nodes[name]
	if !known || n == nil {
		c.tb.Fatalf("nodetest: %q is not running", name)
	}
	c.nodes[name] = nil
	return n
}

// Kill crashes the node (node.Kill: no leave) and waits until the others
// have seen it die and reacted (their asks to it failed, connections
// closed).
func (c *Cluster) Kill(name string) {
	c.tb.Helper()
	seen := c.watch(name, node.MemberDead, node.MemberLeft)
	if err := c.take(name).Kill(); err != nil {
		c.tb.Fatalf("nodetest: kill %s: %v", name, err)
	}
	seen()
	c.WaitDown(name)
}

// Stop closes the node gracefully (Node.Close) and waits until the others
// have seen it leave and reacted.
func (c *Cluster) Stop(name string) {
	c.tb.Helper()
	seen := c.watch(name, node.MemberDead, node.MemberLeft)
	if err := c.take(name).Close(); err != nil {
		c.tb.Fatalf("nodetest: stop %s: %v", name, err)
	}
	seen()
	c.WaitDown(name)
}

// watch subscribes to the membership events of every running node and
// returns a function that waits until each has had an event of one of
// kinds about the node of that name. A node publishes an event after its
// own reaction to it, so once seen, the change is fully taken in.
func (c *Cluster) watch(name string, kinds ...node.MemberEventKind) (wait func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var chans []<-chan node.MemberEvent
	for _, n := range c.running() {
		if n.Name() != name {
			chans = append(chans, n.MemberEvents(ctx, 256))
		}
	}
	return func() {
		c.tb.Helper()
		defer cancel()
		timeout := time.After(c.opts.timeout)
		for _, ch := range chans {
		events:
			for {
				select {
				case ev, ok := <-ch:
					if !ok {
						break events // that node closed meanwhile
					}
					if ev.Member.Name == name && slices.Contains(kinds, ev.Kind) {
						break events
					}
				case <-timeout:
					c.tb.Fatalf("nodetest: timed out after %v waiting for the cluster to see %s %v", c.opts.timeout, name, kinds)
				}
			}
		}
	}
}

// Restart starts a stopped or killed node again on its data directory
// (new ports, new boot id) and waits until the cluster converges.
func (c *Cluster) Restart(name string) {
	c.tb.Helper()
	c.mu.Lock()
	n, known := c.nodes[name]
	c.mu.Unlock()
	if !known || n != nil {
		c.tb.Fatalf("nodetest: restart %q: not a stopped node of the cluster", name)
	}
	seen := c.watch(name, node.MemberJoin, node.MemberAlive, node.MemberRestart)
	if err := c.start(name); err != nil {
		c.tb.Fatalf("nodetest: restart: %v", err)
	}
	seen()
	c.WaitConverged()
}

// running returns the running nodes.
func (c *Cluster) running() []*node.Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*node.Node
	for _, name := range c.names {
		if n := c.nodes[name]; n != nil {
			out = append(out, n)
		}
	}
	return out
}

// WaitConverged waits until every running node sees every running node alive.
func (c *Cluster) WaitConverged() {
	c.tb.Helper()
	c.waitFor("every running node sees every running node alive", func() bool {
		running := c.running()
		for _, a := range running {
			for _, b := range running {
				if state(a, b.Name()) != mesh.StateAlive {
					return false
				}
			}
		}
		return true
	})
}

// WaitDown waits until no running node sees the node of that name alive.
func (c *Cluster) WaitDown(name string) {
	c.tb.Helper()
	c.waitFor("every running node sees "+name+" down", func() bool {
		for _, a := range c.running() {
			if s := state(a, name); s == mesh.StateAlive || s == mesh.StateSuspect {
				return false
			}
		}
		return true
	})
}

// state is how a sees the member of that name (0 when unknown).
func state(a *node.Node, name string) mesh.State {
	for _, m := range a.Members() {
		if m.Name == name {
			return m.State
		}
	}
	return 0
}

// waitFor polls cond until it holds or the cluster's timeout passes.
func (c *Cluster) waitFor(what string, cond func() bool) {
	c.tb.Helper()
	deadline := time.Now().Add(c.opts.timeout)
	wait := time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			c.tb.Fatalf("nodetest: timed out after %v waiting until %s", c.opts.timeout, what)
		}
		time.Sleep(wait) // a polling interval; cond decides
		wait = min(2*wait, 50*time.Millisecond)
	}
}

// close kills every running node.
func (c *Cluster) close() {
	c.mu.Lock()
	var nodes []*node.Node
	for name, n := range c.nodes {
		if n != nil {
			nodes = append(nodes, n)
			c.nodes[name] = nil
		}
	}
	c.mu.Unlock()
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() { errs[i] = n.Kill() })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.tb.Errorf("nodetest: close: %v", err)
	}
}
