package partition

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshnode/meshnode/mailbox/pb"
)

// Routes: when membership holds a peer alive (gossip reaches it through
// others' indirect probes) but this node cannot reach it directly, the
// peer's emissions go through another member that can (a forwarder), one
// hop. The durability stays here: a forwarder stores nothing, and an
// emission it fails is judged like one whose receipts were lost.

// ForwardConfig says when the relay sends a peer's streams through a
// forwarder and when it tries the direct path again.
type ForwardConfig struct {
	// After is how many emissions in a row to a peer that membership holds
	// alive must fail to reach it (no connection could be made, or it was
	// lost before any receipt came) before its streams go through a
	// forwarder. Each such failure takes at least a handshake timeout or a
	// connection's idle timeout, so a restart or one lost connection never
	// triggers it. 0 turns forwarding off.
	After int
	// Probe is how often, while a peer's streams are forwarded, a fresh
	// direct connection to it is tried; when one succeeds, they go direct
	// again.
	Probe time.Duration
}

// DefaultForwardConfig returns the defaults: forward after two failed
// emissions, probe the direct path every 5 s.
func DefaultForwardConfig() ForwardConfig {
	return ForwardConfig{
		After: 2,               // two connection failures in a row: 6-10 s of a path that leads nowhere
		Probe: 5 * time.Second, // one handshake per forwarded peer every 5 s
	}
}

// Router is implemented by a Deliverer that can also send through another
// member. Without it (or with ForwardConfig.After 0) the relay only sends
// directly, and a peer it cannot reach waits.
type Router interface {
	// Forwarders returns the members that may carry emissions to node
	// now, in a stable order: alive, able to forward, neither this node
	// nor node. It must be fast and must not block.
	Forwarders(node string) []string
	// DeliverVia is Deliver through the member via. A receipt that node
	// did not sign is returned as nil (err says why): the relay acts only
	// on node's own word.
	DeliverVia(ctx context.Context, via, node string, msgs []*pb.Envelope) ([]*pb.Receipt, error)
	// Probe returns nil when a fresh direct connection to node could be
	// made now; it is bounded by ctx and the transport's handshake timeout.
	Probe(ctx context.Context, node string) error
}

// RouteStats is how the streams to one peer are sent now.
type RouteStats struct {
	Via     string // the forwarder; "" while none can carry them (they wait)
	Misses  int    // emissions in a row that could not reach the peer directly
	Stalled int    // emissions since that found nobody to carry them (deferred)
}

// routes owns the choice of path per peer node. Its decisions are made
// under mu from what emissions report, never from a flag set elsewhere.
type routes struct {
	r   *Relay
	rt  Router // nil: forwarding off
	cfg ForwardConfig

	forwarded, switches atomic.Uint64
	wg                  sync.WaitGroup // probes; Add only under mu while !closed

	// mu guards the fields below.
	mu     sync.Mutex
	peers  map[string]*route
	peak   int  // see shrinkDelete
	closed bool // set by close: no probe starts after it
}

// route is one peer's path. Guarded by routes.mu.
type route struct {
	misses     int       // emissions in a row that could not reach the peer directly
	stalled    int       // emissions that found no forwarder
	forwarding bool      // its emissions go through a forwarder
	via        string    // the forwarder in use ("" = choose one)
	viaMisses  int       // emissions in a row through via that brought no receipt
	last       string    // the forwarder that failed last: the next one is after it
	probeAt    time.Time // when the direct path is tried next
	probing    bool      // a probe is running
}

func newRoutes(r *Relay, d Deliverer, cfg ForwardConfig) *routes {
	rs := &routes{r: r, cfg: cfg, peers: map[string]*route{}}
	if rt, ok := d.(Router); ok && cfg.After > 0 {
		rs.rt = rt
	}
	return rs
}

// forwarding reports whether node's streams go through a forwarder now.
func (rs *routes) forwarding(node string) bool {
	if rs.rt == nil {
		return false
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	p := rs.peers[node]
	return p != nil && p.forwarding
}

// deliver sends one emission to node on its current path and learns from
// the outcome which path to use next. via names the forwarder it went
// through ("" for the direct path).
func (rs *routes) deliver(ctx context.Context, node string, envs []*pb.Envelope) (rcs []*pb.Receipt, via string, err error) {
	if rs.rt == nil {
		rcs, err = rs.r.d.Deliver(ctx, node, envs)
		return rcs, "", err
	}
	via, forward := rs.pick(node)
	if !forward {
		rcs, err = rs.r.d.Deliver(ctx, node, envs)
		rs.observeDirect(node, rcs, err)
		return rcs, "", err
	}
	if via == "" {
		// Nobody can carry it: the emission fails like a lost one and the
		// stream waits (deferred, uncounted) for a forwarder or the heal.
		return nil, "", fmt.Errorf("partition: %w: %s cannot be reached directly and no member can forward to it", ErrUnreachable, node)
	}
	rcs, err = rs.rt.DeliverVia(ctx, via, node, envs)
	rs.observeVia(node, via, rcs, err)
	return rcs, via, err
}

// pick returns the forwarder for node's next emission, or forward=false
// for the direct path; it starts a probe of the direct path when one is due.
func (rs *routes) pick(node string) (via string, forward bool) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	p := rs.peers[node]
	if p == nil || !p.forwarding {
		return "", false
	}
	if now := time.Now(); !p.probing && !now.Before(p.probeAt) && !rs.closed {
		// Probes may start from Send's caller, outside the relay's
		// goroutines: their own WaitGroup, added to under mu, is waited
		// for by close once no more can start.
		p.probing = true
		rs.wg.Add(1)
		go rs.probe(node)
	}
	cands := rs.rt.Forwarders(node)
	if p.via != "" && slices.Contains(cands, p.via) {
		return p.via, true
	}
	p.via = ""
	if len(cands) == 0 {
		p.stalled++
		return "", true
	}
	// Rotate: the first candidate after the one that failed last, so a
	// failing forwarder is not chosen again while others remain.
	i, _ := slices.BinarySearch(cands, p.last)
	if i < len(cands) && cands[i] == p.last {
		i++
	}
	if i >= len(cands) {
		i = 0
	}
	p.via, p.viaMisses = cands[i], 0
	rs.r.cfg.Logger.Info("relay: sending through a forwarder", "peer", node, "via", p.via)
	return p.via, true
}

// observeDirect learns from a direct emission: any receipt means the path
// works; a failure to reach a peer that membership holds alive is a miss,
// and After misses in a row move its streams to a forwarder.
func (rs *routes) observeDirect(node string, rcs []*pb.Receipt, err error) {
	got := slices.ContainsFunc(rcs, func(rc *pb.Receipt) bool { return rc != nil })
	rs.mu.Lock()
	defer rs.mu.Unlock()
	p := rs.peers[node]
	switch {
	case got:
		if p != nil {
			delete(rs.peers, node)
		}
	case isUnreachable(err) && rs.r.d.Alive(node):
		if p == nil {
			p = &route{}
			rs.peers[node] = p
		}
		p.misses++
		if p.misses >= rs.cfg.After && !p.forwarding {
			p.forwarding, p.probeAt = true, time.Now().Add(rs.cfg.Probe)
			rs.switches.Add(1)
			rs.r.cfg.Logger.Warn("relay: a peer that membership holds alive cannot be reached directly; its streams go through a forwarder",
				"peer", node, "failed_emissions", p.misses, "err", err)
			rs.r.wakeAll()
		}
	}
}

// viaAfter is how many emissions in a row through a forwarder may bring
// no receipt before the next one tries another: a forwarder's first
// emission to a recipient it has no connection to yet fails while it dials.
const viaAfter = 2

// observeVia learns from an emission through via: viaAfter in a row with
// no receipt at all from node mean via cannot carry it (down, cut from
// node, or tampering), and the next emission tries another forwarder.
func (rs *routes) observeVia(node, via string, rcs []*pb.Receipt, err error) {
	n := 0
	for _, rc := range rcs {
		if rc != nil {
			n++
		}
	}
	rs.forwarded.Add(uint64(n))
	rs.mu.Lock()
	defer rs.mu.Unlock()
	p := rs.peers[node]
	if p == nil || p.via != via {
		return
	}
	if n > 0 {
		p.viaMisses = 0
		return
	}
	if p.viaMisses++; p.viaMisses >= viaAfter {
		p.via, p.last, p.viaMisses = "", via, 0
		rs.r.cfg.Logger.Info("relay: the forwarder brought no receipt; trying another", "peer", node, "via", via, "err", err)
	}
}

// probe tries the direct path to node; when it works, node's streams go
// direct again and are due at once.
func (rs *routes) probe(node string) {
	defer rs.wg.Done()
	err := rs.rt.Probe(rs.r.ctx, node)
	rs.mu.Lock()
	p := rs.peers[node]
	if p != nil {
		p.probing = false
		p.probeAt = time.Now().Add(rs.cfg.Probe)
		if err == nil {
			delete(rs.peers, node)
		}
	}
	rs.mu.Unlock()
	if err == nil && p != nil {
		rs.switches.Add(1)
		rs.r.cfg.Logger.Info("relay: the direct path to a forwarded peer works again; its streams go direct", "peer", node)
		rs.r.NodeAlive(node)
	}
}

// close stops new probes and waits for those running (the relay's
// context, which bounds them, is cancelled first).
func (rs *routes) close() {
	rs.mu.Lock()
	rs.closed = true
	rs.mu.Unlock()
	rs.wg.Wait()
}

// forget drops node's route (it left the cluster).
func (rs *routes) forget(node string) {
	rs.mu.Lock()
	shrinkDelete(&rs.peers, &rs.peak, node)
	rs.mu.Unlock()
}

// stats returns the routes of the peers whose streams are forwarded.
func (rs *routes) stats() map[string]RouteStats {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	out := map[string]RouteStats{}
	for n, p := range rs.peers {
		if p.forwarding {
			out[n] = RouteStats{Via: p.via, Misses: p.misses, Stalled: p.stalled}
		}
	}
	return out
}

// Routes returns the peers whose streams go through a forwarder now.
func (r *Relay) Routes() map[string]RouteStats { return r.routes.stats() }

func isUnreachable(err error) bool { return errors.Is(err, ErrUnreachable) }
