package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sync"
	"time"

	"github.com/meshnode/meshnode/mesh"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/transport"
)

// env holds what every phase shares: the work directory and the cluster CA.
type env struct {
	cfg    Config
	dir    string // this run's temporary directory, removed by Run
	ca     *transport.CA
	points []Point // the curves phase's points
}

func newEnv(cfg Config, dir string) (*env, error) {
	ca, err := transport.NewCA("meshbench CA", 24*time.Hour)
	if err != nil {
		return nil, fmt.Errorf("bench: create CA: %w", err)
	}
	return &env{cfg: cfg, dir: dir, ca: ca}, nil
}

// nodeConfig returns a loopback node config with its own data directory
// under the run's directory.
func (e *env) nodeConfig(name, sub string, join ...string) (node.Config, error) {
	id, err := e.ca.NewIdentity(name)
	if err != nil {
		return node.Config{}, fmt.Errorf("bench: identity %s: %w", name, err)
	}
	cfg := node.DefaultConfig(name)
	cfg.Cluster = "meshbench"
	cfg.DataDir = filepath.Join(e.dir, sub, name)
	cfg.GossipAddr = "127.0.0.1:0"
	cfg.QUICAddr = "127.0.0.1:0"
	cfg.Join = join
	cfg.TLS = id
	if e.cfg.AIMDMax > 0 {
		cfg.Relay.Limiter.Max = e.cfg.AIMDMax
		cfg.Relay.Limiter.Initial = min(cfg.Relay.Limiter.Initial, e.cfg.AIMDMax)
	}
	if e.cfg.RelayBatch > 0 {
		cfg.Relay.BatchSize = e.cfg.RelayBatch
	}
	return cfg, nil
}

// startNode starts a node named name in the sub-directory sub.
func (e *env) startNode(name, sub string, join ...string) (*node.Node, error) {
	cfg, err := e.nodeConfig(name, sub, join...)
	if err != nil {
		return nil, err
	}
	n, err := node.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("bench: start node %s: %w", name, err)
	}
	return n, nil
}

// pair starts two nodes, the second joined to the first, and waits until
// each sees the other alive. The caller closes both.
func (e *env) pair(sub string) (a, b *node.Node, err error) {
	a, err = e.startNode("n1", sub)
	if err != nil {
		return nil, nil, err
	}
	b, err = e.startNode("n2", sub, a.GossipAddr())
	if err != nil {
		_ = a.Close()
		return nil, nil, err
	}
	if err := waitFor(10*time.Second, "n1 and n2 see each other alive", func() bool {
		return seesAlive(a, "n2") && seesAlive(b, "n1")
	}); err != nil {
		_ = b.Close()
		_ = a.Close()
		return nil, nil, err
	}
	return a, b, nil
}

// seesAlive reports whether n's membership has peer alive.
func seesAlive(n *node.Node, peer string) bool {
	for _, m := range n.Members() {
		if m.Name == peer && m.State == mesh.StateAlive {
			return true
		}
	}
	return false
}

// waitFor polls cond until it holds or timeout passes. The sleep is the
// polling interval, not synchronisation: cond decides.
func waitFor(timeout time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	wait := 50 * time.Microsecond
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("%w after %v waiting for: %s", ErrTimeout, timeout, what)
		}
		time.Sleep(wait)
		if wait < 5*time.Millisecond {
			wait *= 2
		}
	}
	return nil
}

// profile starts a CPU profile named name.pprof in cfg.Profiles and returns
// the function that stops it (idempotent); without cfg.Profiles it does nothing.
func (e *env) profile(name string) (stop func(), err error) {
	if e.cfg.Profiles == "" {
		return func() {}, nil
	}
	if err := os.MkdirAll(e.cfg.Profiles, 0o755); err != nil {
		return nil, fmt.Errorf("bench: profile directory: %w", err)
	}
	f, err := os.Create(filepath.Join(e.cfg.Profiles, name+".pprof"))
	if err != nil {
		return nil, fmt.Errorf("bench: profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("bench: profile: %w", err)
	}
	var once sync.Once
	return func() { once.Do(func() { pprof.StopCPUProfile(); _ = f.Close() }) }, nil
}
