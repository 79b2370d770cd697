package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/mailbox/pb"
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
// Lock order: actorsMu before an actor's chainMu; askMu is a leaf.
type Node struct {
	cfg    Config
	name   string
	bootID string
	log    *slog.Logger

	mesh      *mesh.Mesh
	transport *transport.Transport
	store     *outbox.Store
	relay     *partition.Relay
	responses *mailbox.ResponseRegistry

	ctx    context.Context // cancelled by Close: handlers and sends see it
	cancel context.CancelFunc
	wg     sync.WaitGroup // background goroutines of the node itself
	closed atomic.Bool
	once   sync.Once

	// actorsMu guards the field below.
	actorsMu sync.RWMutex
	actors   map[string]*actor

	// askMu guards the field below: pending remote asks per peer, so a peer
	// that dies or restarts fails its asks at once instead of at their deadline.
	askMu sync.Mutex
	asks  map[string]map[string]struct{} // node -> correlation ids

	stats counters
}

// New starts a node: opens the outbox, binds QUIC, joins the cluster and
// starts the relay. A bad config is an error, never a panic.
func New(cfg Config) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("node: create data directory: %w", err)
	}
	n := &Node{
		cfg:       cfg,
		name:      cfg.Name,
		bootID:    mailbox.NewID(),
		log:       logger.With("node", cfg.Name),
		responses: mailbox.NewResponseRegistry(cfg.AskResponseTTL),
		actors:    make(map[string]*actor),
		asks:      make(map[string]map[string]struct{}),
	}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	mcfg, tcfg, ocfg := cfg.lower(n.bootID, n.log)

	var err error
	if n.store, err = outbox.Open(ocfg); err != nil {
		n.cancel()
		return nil, fmt.Errorf("node: open outbox: %w", err)
	}
	if n.transport, err = transport.New(tcfg, resolver{n}, receiver{n}); err != nil {
		n.cancel()
		_ = n.store.Close()
		return nil, fmt.Errorf("node: start transport: %w", err)
	}
	mcfg.Meta = &pb.NodeMeta{
		QuicAddr:         n.transport.LocalAddr().String(),
		BootId:           n.bootID,
		ProtocolVersions: pb.SupportedVersions(),
		Cluster:          cfg.Cluster,
	}
	mcfg.OnEvent = n.onMemberEvent
	rcfg := cfg.Relay
	rcfg.Logger = n.log.With("part", "relay")
	if n.relay, err = partition.New(rcfg, n.store, deliverer{n}); err != nil {
		n.cancel()
		_ = n.transport.Close()
		_ = n.store.Close()
		return nil, fmt.Errorf("node: start relay: %w", err)
	}
	if n.mesh, err = mesh.New(mcfg); err != nil {
		n.cancel()
		_ = n.relay.Close()
		_ = n.transport.Close()
		_ = n.store.Close()
		return nil, fmt.Errorf("node: join cluster: %w", err)
	}
	if err := n.advertiseQUIC(); err != nil {
		_ = n.shutdown(false)
		return nil, err
	}
	n.relay.Start()
	n.wg.Add(1)
	go n.pruneLoop()
	n.log.Info("node started", "gossip", n.mesh.GossipAddr(), "quic", n.transport.LocalAddr().String(), "boot", n.bootID)
	return n, nil
}

// advertiseQUIC replaces an unspecified QUIC host (0.0.0.0) in the gossip
// metadata with the host memberlist advertises, so peers can dial it.
func (n *Node) advertiseQUIC() error {
	qhost, qport, err := net.SplitHostPort(n.transport.LocalAddr().String())
	if err != nil {
		return fmt.Errorf("node: QUIC address: %w", err)
	}
	if ip := net.ParseIP(qhost); ip == nil || !ip.IsUnspecified() {
		return nil
	}
	ghost, _, err := net.SplitHostPort(n.mesh.GossipAddr())
	if err != nil {
		return fmt.Errorf("node: gossip address: %w", err)
	}
	meta := &pb.NodeMeta{
		QuicAddr:         net.JoinHostPort(ghost, qport),
		BootId:           n.bootID,
		ProtocolVersions: pb.SupportedVersions(),
		Cluster:          n.cfg.Cluster,
	}
	if err := n.mesh.UpdateMeta(meta); err != nil {
		return fmt.Errorf("node: advertise QUIC address: %w", err)
	}
	return nil
}

// Name returns the node's name.
func (n *Node) Name() string { return n.name }

// BootID returns the id of this incarnation of the node.
func (n *Node) BootID() string { return n.bootID }

// GossipAddr returns the memberlist address others can join.
func (n *Node) GossipAddr() string { return n.mesh.GossipAddr() }

// QUICAddr returns the bound QUIC address.
func (n *Node) QUICAddr() string { return n.transport.LocalAddr().String() }

// Members returns every known member with its state, this node included.
func (n *Node) Members() []Member { return n.mesh.Members() }

// Outbox returns the durable outbox: Stats, DeadLetters, Replay, Purge.
func (n *Node) Outbox() *outbox.Store { return n.store }

// Close leaves the cluster gracefully (peers see Left), stops the relay,
// closes connections, stops the actors and closes the outbox. Messages that
// were Queued stay on disk for the next start. Idempotent.
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
			errs = append(errs, n.mesh.Close())
			n.cancel()
			errs = append(errs, n.relay.Close())
			errs = append(errs, n.transport.Close())
		} else {
			// A crash: the network goes first, so nothing more leaves the node.
			errs = append(errs, n.mesh.Kill())
			errs = append(errs, n.transport.Close())
			n.cancel()
			errs = append(errs, n.relay.Close())
		}
		n.actorsMu.Lock()
		actors := n.actors
		n.actors = map[string]*actor{}
		n.actorsMu.Unlock()
		for _, a := range actors {
			a.mb.Close()
		}
		n.wg.Wait()
		errs = append(errs, n.store.Close())
		n.log.Info("node stopped", "graceful", graceful)
	})
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("node: close: %w", err)
	}
	return nil
}

// pruneLoop drops early responses and waiters that outlived their TTL.
func (n *Node) pruneLoop() {
	defer n.wg.Done()
	t := time.NewTicker(n.cfg.AskResponseTTL / 2)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case now := <-t.C:
			n.responses.Prune(now)
		}
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
	case mesh.EventRestart:
		n.transport.ClosePeer(name, "peer restarted")
		n.failAsks(name, "peer restarted")
		n.relay.NodeAlive(name)
	case mesh.EventJoin, mesh.EventAlive:
		n.relay.NodeAlive(name)
	}
	n.log.Debug("member event", "peer", name, "event", ev.Kind.String())
}
