package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshnode/meshnode/internal/badconfig"
	"github.com/meshnode/meshnode/internal/ident"
	"github.com/meshnode/meshnode/internal/ratelog"
	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/mesh"
	"github.com/meshnode/meshnode/outbox"
	"github.com/meshnode/meshnode/partition"
	"github.com/meshnode/meshnode/transport"
)

// Member is a cluster member as membership sees it.
type Member = mesh.Member

// Node is one meshnode: membership, transport, actors, outbox and relay.
// All methods are safe for concurrent use.
//
// Lock order: actorsMu and askMu are leaves.
type Node struct {
	cfg    Config
	name   string
	sender string // "@name": the sender of what the node API sends
	bootID string
	log    *slog.Logger // the node's own lines: node=Name, component=node
	parts  *slog.Logger // handed to mesh, transport, outbox and relay: node=Name

	// meshp is the membership, nil until Start; the transport, started
	// before it, may already ask it (membership).
	meshp     atomic.Pointer[mesh.Mesh]
	transport *transport.Transport
	store     *outbox.Store
	relay     *partition.Relay
	in        *inbound
	held      heldReplies // replies of requests that ran, waiting for the disk (heldreply.go)
	evictions evictions   // reliable messages evicted by DropOldest mailboxes, drops not yet answered (evictions.go)
	responses *mailbox.ResponseRegistry

	ctx       context.Context // cancelled by Close: handlers and sends see it
	cancel    context.CancelFunc
	wg        sync.WaitGroup // background goroutines of the node itself
	closed    atomic.Bool
	once      sync.Once
	startOnce sync.Once
	startedMs atomic.Int64 // the store's elapsed clock at Start (0 = not started)

	warnedPeers sync.Map // node name -> true: unknown peers already logged once

	claimLog           *ratelog.Limiter // envelopes that claim another node: one line a minute per peer
	charges            peerCharges      // bytes of each peer's messages queued in mailboxes (limits.go)
	invoke             Invoker          // the client interceptors around send; nil when there are none
	serverInterceptors []ServerInterceptor
	draining           atomic.Bool // Shutdown began: no new message enters a mailbox

	events *memberEvents
	fwd    *forwarding // sending, carrying and taking forwarded messages (forward.go)

	// metaMu guards the fields below: the gossip metadata this node
	// advertises. quicAddr is set once Start has advertised it (mesh is
	// set before).
	metaMu   sync.Mutex
	tags     map[string]string
	quicAddr string

	// actorsMu guards the fields below.
	actorsMu sync.RWMutex
	actors   map[string]*actor
	// stopped holds when (the store's elapsed clock, ms) each actor
	// stopped within the last SpawnGrace (stopGraceLeft); pruneAt is the
	// size at which Stop next drops the older ones.
	stopped map[string]int64
	pruneAt int

	// departedMu guards the field below: when membership last reported
	// each peer dead or left (absent once it is back or was pruned).
	departedMu sync.Mutex
	departed   map[string]time.Time

	// askMu guards the field below: pending remote asks per peer, so a peer
	// that dies or restarts fails its asks at once instead of at their deadline.
	askMu sync.Mutex
	asks  map[string]map[string]struct{} // node -> correlation ids

	stats counters
}

// membership returns the node's membership, nil before Start.
func (n *Node) membership() *mesh.Mesh { return n.meshp.Load() }

// New starts a node: Open, then Start. A bad config is an error, never a
// panic. The node joins the cluster before New returns, so peers may send
// to actors the application has not spawned yet: reliable messages for them
// wait (SpawnGrace). To have actors in place first, use Open, Spawn, Start.
func New(cfg Config) (*Node, error) {
	n, err := Open(cfg)
	if err != nil {
		return nil, err
	}
	if err := n.Start(context.Background()); err != nil {
		_ = n.Kill()
		return nil, err
	}
	return n, nil
}

// Open prepares a node without making it visible to the cluster: it opens
// the outbox and binds QUIC. Actors can be spawned and reliable messages
// sent (they are stored) before Start joins the cluster.
func Open(cfg Config) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	logger = logger.With("node", cfg.Name) // once: the parts add only their component
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("node: create data directory: %w", err)
	}
	responses, err := mailbox.NewResponseRegistry(cfg.responses())
	if err != nil {
		return nil, badconfig.Within(ErrBadConfig, "Responses", err)
	}
	n := &Node{
		cfg:       cfg,
		name:      cfg.Name,
		sender:    Address{Node: cfg.Name}.String(),
		bootID:    ident.NewBootID(),
		parts:     logger,
		log:       logger.With("component", "node"),
		claimLog:  ratelog.New(time.Minute),
		responses: responses,
		actors:    make(map[string]*actor),
		asks:      make(map[string]map[string]struct{}),
		departed:  make(map[string]time.Time),
		tags:      maps.Clone(cfg.Tags),
	}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.setupInterceptors()
	n.events = newMemberEvents(n, cfg.Mesh.OnEvent)
	_, tcfg, ocfg, rcfg := cfg.lower(n.bootID, n.parts)

	// The parts' errors name their package ("outbox: data file is
	// locked ..."): the wrappers add only the operation.
	if n.store, err = outbox.Open(ocfg); err != nil {
		n.cancel()
		return nil, fmt.Errorf("node: open: %w", err)
	}
	n.in = newInbound(n.store)
	tcfg.OutboxID = n.store.OutboxID()
	if n.transport, err = transport.New(tcfg, resolver{n}, receiver{n}); err != nil {
		n.cancel()
		_ = n.store.Close()
		return nil, fmt.Errorf("node: open: %w", err)
	}
	n.fwd = newForwarding(cfg, n.transport)
	if n.relay, err = partition.New(rcfg, n.store, deliverer{n}); err != nil {
		n.cancel()
		_ = n.transport.Close()
		_ = n.store.Close()
		return nil, fmt.Errorf("node: open: %w", err)
	}
	return n, nil
}

// Start joins the cluster and starts delivering reliable messages. It is
// called once (New calls it); a second call returns nil. ctx bounds the
// join only as far as it is checked before and after it.
func (n *Node) Start(ctx context.Context) error {
	if n.closed.Load() {
		return ErrClosed
	}
	var err error
	n.startOnce.Do(func() { err = n.start(ctx) })
	return err
}

func (n *Node) start(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("node: start: %w", err)
	}
	mcfg, _, _, _ := n.cfg.lower(n.bootID, n.parts)
	n.metaMu.Lock()
	tags := n.tags
	n.metaMu.Unlock()
	mcfg.Meta = n.nodeMeta(n.transport.LocalAddr().String(), tags)
	// The node reacts first, then the application's callback (which
	// Config.Mesh.OnEvent names) runs on its own goroutine.
	mcfg.OnEvent = n.onMemberEvent
	m, err := mesh.New(mcfg)
	if err != nil {
		return fmt.Errorf("node: join cluster: %w", err)
	}
	n.meshp.Store(m)
	if err := n.advertiseQUIC(tags); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("node: start: %w", err)
	}
	n.startedMs.Store(max(n.store.ElapsedMs(), 1))
	n.relay.Start()
	n.wg.Add(1)
	go n.pruneLoop()
	n.startSigners()
	n.log.Info("node started", "gossip", n.membership().GossipAddr(), "quic", n.transport.LocalAddr().String(), "boot", n.bootID)
	return nil
}

// advertiseQUIC replaces an unspecified QUIC host (0.0.0.0) in the gossip
// metadata with the host memberlist advertises, so peers can dial it, and
// gossips tags set since the metadata was made (sent is what mesh.New got).
func (n *Node) advertiseQUIC(sent map[string]string) error {
	addr := n.transport.LocalAddr().String()
	qhost, qport, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("node: QUIC address: %w", err)
	}
	if ip := net.ParseIP(qhost); ip != nil && ip.IsUnspecified() {
		ghost, _, err := net.SplitHostPort(n.membership().GossipAddr())
		if err != nil {
			return fmt.Errorf("node: gossip address: %w", err)
		}
		addr = net.JoinHostPort(ghost, qport)
	}
	n.metaMu.Lock()
	defer n.metaMu.Unlock()
	n.quicAddr = addr
	if addr == n.transport.LocalAddr().String() && maps.Equal(sent, n.tags) {
		return nil
	}
	if err := n.membership().UpdateMeta(n.nodeMeta(addr, n.tags)); err != nil {
		return fmt.Errorf("node: advertise QUIC address: %w", err)
	}
	return nil
}

// ReloadCertificate presents id's certificate on new connections from now
// on (a renewed certificate, without a restart). A certificate for another
// name or from another CA is refused and the current one kept.
func (n *Node) ReloadCertificate(id transport.Identity) error {
	if err := n.transport.ReloadCertificate(id); err != nil {
		return fmt.Errorf("node: reload certificate: %w", err)
	}
	return nil
}

// Name returns the node's name.
func (n *Node) Name() string { return n.name }

// BootID returns the id of this incarnation of the node.
func (n *Node) BootID() string { return n.bootID }

// GossipAddr returns the memberlist address others can join ("" before Start).
func (n *Node) GossipAddr() string {
	if n.membership() == nil {
		return ""
	}
	return n.membership().GossipAddr()
}

// QUICAddr returns the bound QUIC address.
func (n *Node) QUICAddr() string { return n.transport.LocalAddr().String() }

// Members returns every known member with its state, this node included
// (none before Start).
func (n *Node) Members() []Member {
	if n.membership() == nil {
		return nil
	}
	return n.membership().Members()
}

// Close leaves the cluster gracefully (peers see Left), stops the relay,
// closes connections, stops the actors and closes the outbox: the fast
// path. Messages that were Queued stay on disk for the next start; tells
// still in mailboxes are dropped and counted (Stats.Dropped), reliable
// messages not yet handled are sent again by their senders. Shutdown lets
// the mailboxes drain first. Idempotent.
func (n *Node) Close() error { return n.shutdown(true) }

// Kill stops the node as a crash would, without leaving the cluster (peers
// see it fail). For fault injection in tests and testnet; the data on disk
// is exactly what a crash would leave, since everything acknowledged was
// fsynced.
func (n *Node) Kill() error { return n.shutdown(false) }

func (n *Node) shutdown(graceful bool) error {
	var errs []error
	n.once.Do(func() {
		n.closed.Store(true)
		if graceful {
			// Leave first so peers see Left and stop sending; handlers then see
			// their context end and in-flight replies may still go out.
			if n.membership() != nil {
				errs = append(errs, n.membership().Close())
			}
			n.cancel()
			errs = append(errs, n.relay.Close())
			errs = append(errs, n.transport.Close())
		} else {
			// A crash: nothing more is decided or recorded (the relay stops
			// first, so a dying connection is not judged), and nothing more
			// leaves the node.
			errs = append(errs, n.relay.Close())
			if n.membership() != nil {
				errs = append(errs, n.membership().Kill())
			}
			errs = append(errs, n.transport.Close())
			n.cancel()
		}
		n.actorsMu.Lock()
		actors := n.actors
		n.actors = map[string]*actor{}
		n.actorsMu.Unlock()
		for _, a := range actors {
			a.mb.Close()
		}
		n.wg.Wait()
		n.events.wait()
		n.in.settle()
		if graceful {
			errs = append(errs, n.store.Close())
		} else {
			errs = append(errs, n.store.Abandon()) // as a crash leaves it: checked in full at the next open
		}
		n.log.Info("node stopped", "graceful", graceful)
	})
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("node: close: %w", err)
	}
	return nil
}

// pruneLoop drops early responses and waiters that outlived their TTL, and
// forgets cached stream watermarks nobody used for a while.
func (n *Node) pruneLoop() {
	defer n.wg.Done()
	t := time.NewTicker(min(n.cfg.AskResponseTTL, n.cfg.Responses.EarlyTTL) / 2)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case now := <-t.C:
			n.responses.Prune(now)
			n.in.evictIdle(streamCacheIdle.Milliseconds())
			n.pruneDeparted(now)
		}
	}
}

// streamCacheIdle: a stream's watermark stays cached this long after its
// last message; after that it is read from the store again.
const streamCacheIdle = 10 * time.Minute

// returned says peer is a member again: its state is not to be pruned.
func (n *Node) returned(peer string) {
	n.departedMu.Lock()
	delete(n.departed, peer)
	n.departedMu.Unlock()
}

// pruneDeparted drops the in-memory state of the peers gone for
// DepartedPeerGrace at now, layer by layer, once the relay agrees nothing
// is queued or in flight to them; a peer it refuses is tried again at the
// next tick. Only memory is dropped: receiver watermarks, key windows and
// the horizons of forgotten streams live in the stores with their own
// retention, and a peer that comes back finds them. Runs on pruneLoop.
func (n *Node) pruneDeparted(now time.Time) {
	n.departedMu.Lock()
	var due []string
	for peer, at := range n.departed {
		if now.Sub(at) >= n.cfg.DepartedPeerGrace {
			due = append(due, peer)
		}
	}
	n.departedMu.Unlock()
	for _, peer := range due {
		if !n.relay.ForgetPeer(peer) || !n.transport.ForgetPeer(peer) {
			continue
		}
		n.charges.forget(peer)
		n.warnedPeers.Delete(peer)
		n.departedMu.Lock()
		// Back meanwhile (returned deleted it) or gone again (a newer
		// time): only the entry this pass judged is removed.
		if at, ok := n.departed[peer]; ok && now.Sub(at) >= n.cfg.DepartedPeerGrace {
			delete(n.departed, peer)
		}
		n.departedMu.Unlock()
	}
}

// onMemberEvent runs on mesh's dispatcher goroutine.
func (n *Node) onMemberEvent(ev mesh.Event) {
	name := ev.Member.Name
	if name == n.name {
		return
	}
	switch ev.Kind {
	case mesh.EventDead, mesh.EventLeft:
		n.transport.ClosePeer(name, "peer "+ev.Kind.String())
		n.failAsks(name, "peer "+ev.Kind.String())
		n.departedMu.Lock()
		n.departed[name] = time.Now()
		n.departedMu.Unlock()
	case mesh.EventRestart:
		n.transport.ClosePeer(name, "peer restarted")
		n.failAsks(name, "peer restarted")
		n.returned(name)
		n.relay.NodeAlive(name)
	case mesh.EventJoin, mesh.EventAlive:
		n.returned(name)
		n.relay.NodeAlive(name)
	}
	switch ev.Kind {
	case mesh.EventJoin, mesh.EventLeft, mesh.EventDead, mesh.EventRestart:
		n.log.Info("member "+ev.Kind.String(), "peer", name)
	default:
		n.log.Debug("member event", "peer", name, "event", ev.Kind.String())
	}
	n.events.publish(ev)
}
