package testnet

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/mesh"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/outbox"
	"github.com/meshnode/meshnode/transport"
)

// Option configures a Cluster.
type Option func(*options)

type options struct {
	seed     uint64
	mutate   []func(i int, cfg *node.Config)
	spawn    []func(i int, n *node.Node) error
	logger   *slog.Logger
	converge time.Duration
	dir      string
}

// WithConfig mutates every node's config before node.New (also on Restart).
func WithConfig(f func(i int, cfg *node.Config)) Option {
	return func(o *options) { o.mutate = append(o.mutate, f) }
}

// WithMailbox sets the default mailbox of every node's actors.
func WithMailbox(capacity int, overflow mailbox.Overflow) Option {
	return WithConfig(func(_ int, cfg *node.Config) { cfg.MailboxCapacity, cfg.Overflow = capacity, overflow })
}

// WithSpawn runs f after each node starts (and after every Restart), so a
// restarted node gets its actors back.
func WithSpawn(f func(i int, n *node.Node) error) Option {
	return func(o *options) { o.spawn = append(o.spawn, f) }
}

// WithSeed seeds the network's random drops (default 1).
func WithSeed(seed uint64) Option { return func(o *options) { o.seed = seed } }

// WithLogger gives every node a logger (default: discard).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithConvergeTimeout bounds the wait for convergence at start (default 20 s).
func WithConvergeTimeout(d time.Duration) Option { return func(o *options) { o.converge = d } }

// WithDir puts the nodes' data directories under dir (default: a new
// temporary directory, removed by Close).
func WithDir(dir string) Option { return func(o *options) { o.dir = dir } }

// Cluster is n in-process nodes on 127.0.0.1 sharing one fault Network and
// one CA. Methods are safe for concurrent use; indexes are 0..n-1.
type Cluster struct {
	opts   options
	net    *Network
	ca     *transport.CA
	key    []byte
	dir    string
	ownDir bool

	// mu guards the fields below.
	mu      sync.Mutex
	members []*member
	closed  bool
	disks   map[int]func() // nodes whose disk is full, and what frees it
}

type member struct {
	name    string
	dataDir string
	clock   *outbox.AdjustableClock // the node's clock, kept across restarts (it is the device's)
	n       *node.Node              // nil when killed or stopped
	boots   []string                // boot ids of every incarnation, in order
	// syncFail, when set, makes the next write of the outbox's meta page
	// reach the file and report an I/O error, as a failing fsync does
	// (SyncFail); unsync removes the fault at Close.
	syncFail *atomic.Bool
	unsync   func()
}

// New starts an n-node cluster for a test and closes it in tb.Cleanup. It
// fails tb when the cluster cannot start or converge.
func New(tb testing.TB, n int, opts ...Option) *Cluster {
	tb.Helper()
	opts = append([]Option{WithDir(tb.TempDir())}, opts...)
	c, err := Start(context.Background(), n, opts...)
	if err != nil {
		tb.Fatalf("testnet: start %d nodes: %v", n, err)
	}
	tb.Cleanup(func() {
		if err := c.Close(); err != nil {
			tb.Errorf("testnet: close: %v", err)
		}
	})
	return c
}

// Start starts an n-node cluster: a new CA, nodes "n0".."n<n-1>" on
// loopback port 0 (n0 first, the rest eight at a time, each joining n0 and
// two random running nodes), and waits until every node sees n alive.
// Close it when done.
func Start(ctx context.Context, n int, opts ...Option) (*Cluster, error) {
	if n < 1 {
		return nil, fmt.Errorf("testnet: start: %w: %d nodes", ErrBadIndex, n)
	}
	o := options{seed: 1, converge: 20 * time.Second}
	for _, opt := range opts {
		opt(&o)
	}
	if o.logger == nil {
		o.logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	c := &Cluster{opts: o, net: NewNetwork(o.seed), dir: o.dir}
	if c.dir == "" {
		d, err := os.MkdirTemp("", "meshnode-testnet-")
		if err != nil {
			return nil, fmt.Errorf("testnet: start: data directory: %w", err)
		}
		c.dir, c.ownDir = d, true
	}
	var err error
	if c.ca, err = transport.NewCA("testnet CA", 24*time.Hour); err != nil {
		return nil, fmt.Errorf("testnet: start: CA: %w", err)
	}
	c.key = make([]byte, 32)
	_, _ = rand.Read(c.key)
	for i := range n {
		name := fmt.Sprintf("n%d", i)
		c.members = append(c.members, &member{name: name, dataDir: filepath.Join(c.dir, name), clock: outbox.NewAdjustableClock()})
	}
	// The first node alone, then the rest in parallel: each joins n0 and
	// two random running nodes, so no join seed takes every join in turn.
	if err := c.startNode(0); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("testnet: start: %w", err)
	}
	if err := c.startParallel(1, n); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("testnet: start: %w", err)
	}
	if err := c.WaitConverged(o.converge); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("testnet: start: %w", err)
	}
	_ = ctx
	return c, nil
}

// startWorkers bounds the nodes starting at once: each start binds sockets,
// opens a store and runs a memberlist join, and a burst of hundreds only
// queues on the accept queues of the nodes joined through. With 8, 200 whole nodes on two cores
// converged in 3 of 12 starts (the join wave tipped into a storm of
// suspicions); with 2, in 3 of 3, in 4.6-5.8 s.
const startWorkers = 2

// Clusters larger than paceAbove start one node every joinEvery. A joiner
// re-broadcasts every member its push/pull taught it, so a join costs
// gossip in proportion to the cluster's size, and all of a large cluster's
// joins share this process's cores (a real fleet's devices each have their
// own). In mesh's gossip-only fleet test on two cores, 200 members started
// by eight workers, as fast as they could or each waiting only until the
// members it could see caught up, tipped into a storm of suspicions in 6
// of 6 starts on a slower day, and started like this converged in 9 of 9;
// the fleet scenario's 200 whole nodes, paced, converged in 5 of 5 (20 s).
const (
	paceAbove = 64
	joinEvery = 100 * time.Millisecond
)

// startParallel starts nodes [from, to) with startWorkers workers and
// returns the first error.
func (c *Cluster) startParallel(from, to int) error {
	next := make(chan int)
	errs := make(chan error, to-from)
	var wg sync.WaitGroup
	for range min(startWorkers, to-from) {
		wg.Go(func() {
			for i := range next {
				if err := c.startNode(i); err != nil {
					errs <- err
				}
			}
		})
	}
	var tick <-chan time.Time
	if len(c.members) > paceAbove {
		t := time.NewTicker(joinEvery)
		defer t.Stop()
		tick = t.C
	}
	for i := from; i < to; i++ {
		if tick != nil {
			<-tick
		}
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	return <-errs // nil when closed and empty
}

// startNode creates node i (its member must not be running).
func (c *Cluster) startNode(i int) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	m := c.members[i]
	// Join addresses: the first running node, which every node knows, and two random
	// running others, which spreads the joins of a parallel start.
	var running []string
	for j, o := range c.members {
		if j != i && o.n != nil {
			running = append(running, o.n.GossipAddr())
		}
	}
	c.mu.Unlock()
	var join []string
	if len(running) > 0 {
		join = append(join, running[0])
		for range 2 {
			if a := running[mrand.IntN(len(running))]; !slices.Contains(join, a) {
				join = append(join, a)
			}
		}
	}

	id, err := c.ca.NewIdentity(m.name)
	if err != nil {
		return fmt.Errorf("identity of %s: %w", m.name, err)
	}
	c.mu.Lock()
	if m.syncFail == nil {
		path := filepath.Join(m.dataDir, "outbox.db")
		armed := new(atomic.Bool)
		m.syncFail = armed
		m.unsync = faults.FailWrites(path, fmt.Errorf("fdatasync %s: %w", path, syscall.EIO),
			func(meta bool) bool { return meta && armed.CompareAndSwap(true, false) })
	}
	m.syncFail.Store(false) // a new incarnation's disk works
	c.mu.Unlock()
	cfg := node.DefaultConfig(m.name)
	cfg.Cluster = "testnet"
	cfg.DataDir = m.dataDir
	cfg.GossipAddr = "127.0.0.1:0"
	cfg.QUICAddr = "127.0.0.1:0"
	cfg.Join = join
	cfg.GossipKey = c.key
	cfg.TLS = id
	cfg.Logger = c.opts.logger
	if len(c.members) > 16 {
		cfg.Mesh = node.MeshPreset(len(c.members)) // the tuning a fleet of this size ships with
	}
	cfg.Mesh.WrapTransport = c.net.WrapTransport(m.name)
	cfg.Transport.WrapPacketConn = c.net.WrapPacketConn(m.name)
	cfg.Outbox.Clock = m.clock
	for _, f := range c.opts.mutate {
		f(i, &cfg)
	}
	nd, err := node.New(cfg)
	if err != nil {
		return fmt.Errorf("node %s: %w", m.name, err)
	}
	for _, f := range c.opts.spawn {
		if err := f(i, nd); err != nil {
			_ = nd.Kill()
			return fmt.Errorf("spawn on %s: %w", m.name, err)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		_ = nd.Kill()
		return ErrClosed
	}
	m.n = nd
	m.boots = append(m.boots, nd.BootID())
	return nil
}

// Clock returns node i's clock: the system clock unless a test moves it
// (Advance, StepClock). It is kept across restarts, as a device's is.
func (c *Cluster) Clock(i int) *outbox.AdjustableClock {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i < 0 || i >= len(c.members) {
		return nil
	}
	return c.members[i].clock
}

// Advance makes d pass at once on every node's clocks (running or not).
func (c *Cluster) Advance(d time.Duration) {
	c.mu.Lock()
	clocks := make([]*outbox.AdjustableClock, len(c.members))
	for i, m := range c.members {
		clocks[i] = m.clock
	}
	c.mu.Unlock()
	for _, k := range clocks {
		k.Advance(d)
	}
}

// Len returns the number of nodes, running or not.
func (c *Cluster) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.members)
}

// Network returns the cluster's fault network (verbs by node name).
func (c *Cluster) Network() *Network { return c.net }

// CA returns the cluster's certificate authority.
func (c *Cluster) CA() *transport.CA { return c.ca }

// Name returns node i's name ("n<i>"), or "" for a bad index.
func (c *Cluster) Name(i int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i < 0 || i >= len(c.members) {
		return ""
	}
	return c.members[i].name
}

// Names returns the names of the given nodes.
func (c *Cluster) Names(idx ...int) []string {
	out := make([]string, len(idx))
	for k, i := range idx {
		out[k] = c.Name(i)
	}
	return out
}

// Addr returns the address of actor on node i.
func (c *Cluster) Addr(actor string, i int) node.Address { return node.Addr(actor, c.Name(i)) }

// Node returns node i's current incarnation, or nil when it is down or i
// is out of range.
func (c *Cluster) Node(i int) *node.Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i < 0 || i >= len(c.members) {
		return nil
	}
	return c.members[i].n
}

// DataDir returns node i's data directory.
func (c *Cluster) DataDir(i int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i < 0 || i >= len(c.members) {
		return ""
	}
	return c.members[i].dataDir
}

// Boots returns the boot ids of every incarnation of node i, oldest first.
func (c *Cluster) Boots(i int) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i < 0 || i >= len(c.members) {
		return nil
	}
	return append([]string(nil), c.members[i].boots...)
}

// Running returns the indexes of running nodes.
func (c *Cluster) Running() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []int
	for i, m := range c.members {
		if m.n != nil {
			out = append(out, i)
		}
	}
	return out
}

// take detaches node i's incarnation for Kill or Stop.
func (c *Cluster) take(i int) (*node.Node, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i < 0 || i >= len(c.members) {
		return nil, fmt.Errorf("%w: %d", ErrBadIndex, i)
	}
	nd := c.members[i].n
	if nd == nil {
		return nil, fmt.Errorf("%w: %s", ErrNotRunning, c.members[i].name)
	}
	c.members[i].n = nil
	return nd, nil
}

// Kill crashes node i: no leave, peers see it fail. Its data directory
// holds exactly what a crash leaves.
func (c *Cluster) Kill(i int) error {
	nd, err := c.take(i)
	if err != nil {
		return fmt.Errorf("testnet: kill: %w", err)
	}
	if err := nd.Kill(); err != nil {
		return fmt.Errorf("testnet: kill %s: %w", nd.Name(), err)
	}
	return nil
}

// Stop closes node i gracefully: it leaves, and its outbox stays on disk.
func (c *Cluster) Stop(i int) error {
	nd, err := c.take(i)
	if err != nil {
		return fmt.Errorf("testnet: stop: %w", err)
	}
	if err := nd.Close(); err != nil {
		return fmt.Errorf("testnet: stop %s: %w", nd.Name(), err)
	}
	return nil
}

// Restart starts a new incarnation of a killed or stopped node i with the
// same name and data directory (new ports, new boot id), joining the
// running nodes. It does not wait for convergence.
func (c *Cluster) Restart(i int) error {
	c.mu.Lock()
	if i < 0 || i >= len(c.members) {
		c.mu.Unlock()
		return fmt.Errorf("testnet: restart: %w: %d", ErrBadIndex, i)
	}
	if c.members[i].n != nil {
		c.mu.Unlock()
		return fmt.Errorf("testnet: restart: %w: %s", ErrRunning, c.members[i].name)
	}
	c.mu.Unlock()
	if err := c.startNode(i); err != nil {
		return fmt.Errorf("testnet: restart: %w", err)
	}
	return nil
}

// converged reports whether every running node sees every running node
// alive; the first laggard is described in why.
func (c *Cluster) converged() (ok bool, why string) {
	c.mu.Lock()
	var running []*node.Node
	for _, m := range c.members {
		if m.n != nil {
			running = append(running, m.n)
		}
	}
	c.mu.Unlock()
	for _, a := range running {
		state := map[string]mesh.State{}
		for _, m := range a.Members() {
			state[m.Name] = m.State
		}
		for _, b := range running {
			switch st, known := state[b.Name()]; {
			case !known:
				return false, fmt.Sprintf("%s does not know %s", a.Name(), b.Name())
			case st != mesh.StateAlive:
				return false, fmt.Sprintf("%s sees %s %v, not alive", a.Name(), b.Name(), st)
			}
		}
	}
	return true, ""
}

// WaitConverged waits until every running node sees every running node
// alive, polling (no sleep-based guess).
func (c *Cluster) WaitConverged(timeout time.Duration) error {
	return c.waitFor(timeout, ErrNotConverged, c.converged)
}

// WaitDown waits until every running node sees node i as not alive.
func (c *Cluster) WaitDown(i int, timeout time.Duration) error {
	name := c.Name(i)
	return c.waitFor(timeout, ErrNotConverged, func() (bool, string) {
		for _, j := range c.Running() {
			nd := c.Node(j)
			if nd == nil || j == i {
				continue
			}
			for _, m := range nd.Members() {
				if m.Name == name && (m.State == mesh.StateAlive || m.State == mesh.StateSuspect) {
					return false, fmt.Sprintf("%s still sees %s %s", nd.Name(), name, m.State)
				}
			}
		}
		return true, ""
	})
}

// waitFor polls cond until it holds or timeout passes; then the error wraps
// failed and says why.
func (c *Cluster) waitFor(timeout time.Duration, failed error, cond func() (bool, string)) error {
	deadline := time.Now().Add(timeout)
	wait := time.Millisecond
	for {
		ok, why := cond()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w after %v: %s", failed, timeout, why)
		}
		time.Sleep(wait) // polling interval; cond decides
		if wait < 50*time.Millisecond {
			wait *= 2
		}
	}
}

// Close stops every running node (concurrently, as crashes: a test's end
// needs no graceful leave) and removes the data directory if Start made it.
// Idempotent.
func (c *Cluster) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	for _, free := range c.disks {
		free()
	}
	c.disks = nil
	var nodes []*node.Node
	for _, m := range c.members {
		if m.unsync != nil {
			m.unsync()
		}
		if m.n != nil {
			nodes = append(nodes, m.n)
			m.n = nil
		}
	}
	c.mu.Unlock()
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for k, nd := range nodes {
		wg.Go(func() { errs[k] = nd.Kill() })
	}
	wg.Wait()
	if c.ownDir {
		errs = append(errs, os.RemoveAll(c.dir))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("testnet: close: %w", err)
	}
	return nil
}

// --- faults by index ---

// Cut blocks both directions between nodes a and b.
func (c *Cluster) Cut(a, b int) { c.net.Cut(c.Name(a), c.Name(b)) }

// Isolate cuts node i from every other node.
func (c *Cluster) Isolate(i int) { c.net.Isolate(c.Name(i)) }

// Partition cuts every link between nodes of different groups.
func (c *Cluster) Partition(groups ...[]int) {
	named := make([][]string, len(groups))
	for k, g := range groups {
		named[k] = c.Names(g...)
	}
	c.net.Partition(named...)
}

// Drop loses packets from -> to with probability p.
func (c *Cluster) Drop(from, to int, p float64) error {
	return c.net.Drop(c.Name(from), c.Name(to), p)
}

// Delay delays packets from -> to by d.
func (c *Cluster) Delay(from, to int, d time.Duration) error {
	return c.net.Delay(c.Name(from), c.Name(to), d)
}

// Heal removes every network fault.
func (c *Cluster) Heal() { c.net.Heal() }

// DiskFull makes node i's disk refuse writes, as a full one does: every
// commit of its outbox fails with ENOSPC (sends to be stored, acks,
// watermarks, verdicts), across restarts, until FreeDisks or Close. Reads
// still work and the node keeps running.
func (c *Cluster) DiskFull(i int) {
	path := filepath.Join(c.DataDir(i), "outbox.db")
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.disks[i] != nil || i < 0 || i >= len(c.members) {
		return
	}
	if c.disks == nil {
		c.disks = map[int]func(){}
	}
	c.disks[i], _ = faults.FailCommits(path, fmt.Errorf("write %s: %w", path, syscall.ENOSPC))
}

// SyncFail makes node i's disk fail the sync of its outbox's next commit
// after bbolt wrote it (an fsync's I/O error): the outbox stops (sends to
// be stored fail at the call, the node runs no reliable message) until the
// node is restarted (a Restart of it kills it first).
func (c *Cluster) SyncFail(i int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || i < 0 || i >= len(c.members) || c.members[i].n == nil {
		return
	}
	c.members[i].syncFail.Store(true)
}

// FreeDisks lets every disk DiskFull filled take writes again.
func (c *Cluster) FreeDisks() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, free := range c.disks {
		free()
		delete(c.disks, i)
	}
}

// Sees reports whether node i currently sees node j alive (or suspect).
func (c *Cluster) Sees(i, j int) bool {
	nd, name := c.Node(i), c.Name(j)
	if nd == nil {
		return false
	}
	for _, m := range nd.Members() {
		if m.Name == name {
			return m.State == mesh.StateAlive || m.State == mesh.StateSuspect
		}
	}
	return false
}
