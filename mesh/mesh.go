package mesh

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/meshnode/meshnode/mailbox/pb"
)

// Mesh is one node's membership in a cluster. All methods are safe for
// concurrent use.
type Mesh struct {
	cfg  Config
	log  *slog.Logger
	ml   *memberlist.Memberlist
	addr string                 // our gossip host:port, set once in New
	meta atomic.Pointer[[]byte] // encoded NodeMeta served to memberlist
	// guard and packetDrops hold the inbound limits' counters; set once in New.
	guard       *streamGuard
	packetDrops *atomic.Uint64
	net         *netTransport // its byte counters

	notify    chan struct{} // 1 slot: "the view changed"
	done      chan struct{} // closed by shutdown: goroutines return
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
	// peersDirty is set by the dispatcher when the remembered peer set
	// changed; the reconnect loop writes peers.json (debounce).
	peersDirty atomic.Bool
	metaMu     sync.Mutex // serialises UpdateMeta

	// keyring is memberlist's gossip keyring (nil without encryption); set
	// once in New. keyMu serialises changes and their saving.
	keyring *memberlist.Keyring
	keyMu   sync.Mutex

	// lifeMu guards closed against Join/UpdateMeta running into Shutdown.
	// Lock order: lifeMu before mu.
	lifeMu sync.RWMutex
	closed bool

	// mu guards the fields below. Held only for map reads and writes.
	mu sync.RWMutex
	// view is every known member incl. self, dead and left (until
	// ReconnectTimeout); written synchronously by memberlist's delegates,
	// only through setLocked and deleteLocked.
	view map[string]Member
	// changed names the members whose view entry was written or deleted
	// since the dispatcher last looked: it handles those, not the whole
	// view (a pass over every member per change is O(n²) in a join wave).
	changed map[string]struct{}
	// leaving maps a node name to the boot id it announced leaving with.
	leaving map[string]string
	// moved maps a node name to the address a conflicting claim came from.
	moved map[string]string
	// refused maps a refused node name to the last reason logged.
	refused map[string]string
	// reprobing names the Suspect members a re-probe is running for.
	reprobing map[string]struct{}
	// filePeers are the peers loaded from peers.json, retried until they
	// are members or ReconnectTimeout passes after start.
	filePeers []peerRecord
	startedAt time.Time
}

// New starts a member: it binds the gossip address, tries the join addresses
// (Config.Join and peers.json) once, and starts the dispatcher and
// reconnect goroutines. Unreachable join addresses are not an error: the
// reconnect loop keeps trying.
func New(cfg Config) (*Mesh, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.Join = slices.Clone(cfg.Join)
	cfg.Meta = fillMeta(cfg.Meta, cfg.Cluster)
	metaBytes, err := encodeMeta(cfg.Meta)
	if err != nil {
		return nil, err
	}
	m := &Mesh{
		cfg:       cfg,
		log:       cfg.Logger.With("component", "mesh"),
		notify:    make(chan struct{}, 1),
		done:      make(chan struct{}),
		view:      make(map[string]Member),
		changed:   make(map[string]struct{}),
		leaving:   make(map[string]string),
		refused:   make(map[string]string),
		moved:     make(map[string]string),
		reprobing: make(map[string]struct{}),
		startedAt: time.Now(),
	}
	m.meta.Store(&metaBytes)
	if cfg.SecretKey == nil {
		m.log.Warn("mesh: gossip is NOT encrypted (SecretKey is nil); use only in tests")
	}
	if m.filePeers, err = loadPeers(cfg.DataDir); err != nil {
		// A corrupt peers file must not keep the node down: Config.Join still works.
		m.log.Warn("mesh: ignoring peers file", "err", err)
	}

	mlLog := newMemberlistLogger(m.log, m.markSuspect)
	host, port, _ := splitHostPort(cfg.BindAddr) // Validate checked it
	if host == "" {
		host = "0.0.0.0"
	}
	nt, err := newNetTransport(host, port, cfg.InboundPacketBytes, m.log)
	if err != nil {
		return nil, fmt.Errorf("mesh: new: bind %s: %w", cfg.BindAddr, err)
	}
	m.packetDrops = &nt.dropped
	m.net = nt
	m.guard = newStreamGuard(nt, cfg.streamLimits())
	var tr memberlist.NodeAwareTransport = m.guard
	if cfg.WrapTransport != nil {
		tr = cfg.WrapTransport(tr)
	}

	d := &delegate{m: m}
	mc := cfg.memberlistConfig()
	mc.Transport = tr
	mc.BindAddr = host
	mc.BindPort = nt.port()
	mc.AdvertisePort = mc.BindPort
	if cfg.AdvertiseAddr != "" {
		mc.AdvertiseAddr, mc.AdvertisePort, _ = splitHostPort(cfg.AdvertiseAddr)
	}
	mc.Delegate = d
	mc.Events = d
	mc.Alive = d
	mc.Conflict = d
	mc.Ping = d
	mc.Logger = mlLog
	if cfg.SecretKey != nil {
		if m.keyring, err = buildKeyring(cfg.DataDir, cfg.SecretKey); err != nil {
			_ = tr.Shutdown()
			return nil, fmt.Errorf("mesh: new: %w", err)
		}
		mc.Keyring, mc.SecretKey = m.keyring, nil
	}

	ml, err := memberlist.Create(mc)
	if err != nil {
		_ = tr.Shutdown() // Create may fail before it owns the transport
		return nil, fmt.Errorf("mesh: new: create memberlist: %w", err)
	}
	m.ml = ml
	m.addr = ml.LocalNode().Address()

	if seeds := m.initialSeeds(); len(seeds) > 0 {
		if n, err := ml.Join(seeds); err != nil {
			if !isKeyMismatch(err.Error()) { // memberlist's own line says it: a WARN (logging.go)
				m.log.Warn("mesh: no seed answered yet; the reconnect loop keeps trying", "err", m.joinFailed(seeds, err))
			}
		} else {
			m.log.Debug("mesh: joined", "contacted", n)
		}
	}

	m.wg.Add(2)
	go m.dispatch()
	go m.reconnect()
	m.kick()
	return m, nil
}

// initialSeeds is Config.Join plus the addresses from peers.json, minus ours.
func (m *Mesh) initialSeeds() []string {
	seen := map[string]bool{m.addr: true}
	var out []string
	add := func(a string) {
		if !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	for _, a := range m.cfg.Join {
		add(a)
	}
	for _, p := range m.filePeers {
		if p.Name != m.cfg.NodeName {
			add(p.Addr)
		}
	}
	return out
}

// InboundStats returns what the inbound limits (Config.InboundStreams and
// the fields after it) refused or cut since New.
func (m *Mesh) InboundStats() InboundStats {
	st := m.guard.stats()
	st.PacketsTooLarge = m.packetDrops.Load()
	return st
}

// Traffic is the gossip this node sent and received since New: every
// datagram and stream byte on the gossip port (probes, gossip, push/pull,
// joins), as the sockets saw them.
type Traffic struct {
	Sent, Received uint64 // bytes
}

// Traffic returns the gossip bytes sent and received since New.
func (m *Mesh) Traffic() Traffic {
	return Traffic{Sent: m.net.sent.Load(), Received: m.net.received.Load()}
}

// LocalName returns this node's name.
func (m *Mesh) LocalName() string { return m.cfg.NodeName }

// GossipAddr returns the gossip host:port peers reach us at (after port 0
// was resolved).
func (m *Mesh) GossipAddr() string { return m.addr }

// Members returns every known member, including self and dead or left
// members still remembered, sorted by name.
func (m *Mesh) Members() []Member {
	m.mu.RLock()
	out := make([]Member, 0, len(m.view))
	for _, mem := range m.view {
		out = append(out, mem.clone())
	}
	m.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Member returns the member called name.
func (m *Mesh) Member(name string) (Member, bool) {
	m.mu.RLock()
	mem, ok := m.view[name]
	m.mu.RUnlock()
	return mem.clone(), ok
}

// Alive reports whether name is Alive or Suspect.
func (m *Mesh) Alive(name string) bool {
	m.mu.RLock()
	mem, ok := m.view[name]
	m.mu.RUnlock()
	return ok && mem.State.reachable()
}

// Resolve returns the QUIC address of an Alive or Suspect member, else an
// error wrapping ErrUnreachable. It takes only a read lock.
func (m *Mesh) Resolve(name string) (string, error) {
	m.mu.RLock()
	mem, ok := m.view[name]
	m.mu.RUnlock()
	switch {
	case !ok:
		return "", fmt.Errorf("mesh: resolve %q: unknown: %w", name, ErrUnreachable)
	case !mem.State.reachable():
		return "", fmt.Errorf("mesh: resolve %q: %s: %w", name, mem.State, ErrUnreachable)
	case mem.QUICAddr == "":
		return "", fmt.Errorf("mesh: resolve %q: no QUIC address: %w", name, ErrUnreachable)
	}
	return mem.QUICAddr, nil
}

// NumAlive counts Alive and Suspect members, self included.
func (m *Mesh) NumAlive() int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	n := 0
	for _, mem := range m.view {
		if mem.State.reachable() {
			n++
		}
	}
	return n
}

// Join contacts the given gossip addresses and returns how many answered;
// the error is non-nil only if none did (wrong key or cluster included).
func (m *Mesh) Join(addrs []string) (int, error) {
	m.lifeMu.RLock()
	defer m.lifeMu.RUnlock()
	if m.closed {
		return 0, fmt.Errorf("mesh: join: %w", ErrClosed)
	}
	n, err := m.ml.Join(addrs)
	if err != nil {
		return n, m.joinFailed(addrs, err)
	}
	return n, nil
}

// joinFailed says why a join may have failed. memberlist reports what the
// socket said: a join address that is down refuses the connection or times out,
// but one that is up and in another cluster, or with another gossip key,
// reads the first bytes and closes the connection, which the joiner sees
// as a bare "EOF". That node cannot say which: it never authenticated us.
func (m *Mesh) joinFailed(addrs []string, err error) error {
	if isKeyMismatch(err.Error()) {
		return fmt.Errorf("mesh: join %v: %w: check that gossip_key_file holds the cluster's key (meshnode keyring list on a member shows its keys): %w",
			addrs, ErrKeyMismatch, err)
	}
	gossip := "unencrypted (no gossip key)"
	if len(m.cfg.SecretKey) > 0 {
		gossip = "encrypted with this node's gossip key"
	}
	return fmt.Errorf("mesh: join %v: %w: %v; a seed that is up but closes the connection without an answer (EOF) "+
		"belongs to another cluster or uses another gossip key: this node is in cluster %q, its gossip %s",
		addrs, ErrNoSeedAnswered, err, m.cfg.Cluster, gossip)
}

// UpdateMeta replaces this node's metadata and gossips it. Empty fields are
// filled as in New; a different Cluster is refused. It waits up to
// TCPTimeout for the broadcast; a timeout is not an error (gossip and
// push/pull still spread it).
func (m *Mesh) UpdateMeta(meta *pb.NodeMeta) error {
	if meta == nil {
		return fmt.Errorf("mesh: update meta: %w: nil meta", ErrBadConfig)
	}
	if meta.GetCluster() != "" && meta.GetCluster() != m.cfg.Cluster {
		return fmt.Errorf("mesh: update meta: %w: cluster %q != %q", ErrBadConfig, meta.GetCluster(), m.cfg.Cluster)
	}
	full := fillMeta(meta, m.cfg.Cluster)
	b, err := encodeMeta(full)
	if err != nil {
		return fmt.Errorf("mesh: update meta: %w", err)
	}
	m.lifeMu.RLock()
	defer m.lifeMu.RUnlock()
	if m.closed {
		return fmt.Errorf("mesh: update meta: %w", ErrClosed)
	}
	m.metaMu.Lock()
	defer m.metaMu.Unlock()
	m.meta.Store(&b)
	if err := m.ml.UpdateNode(m.cfg.TCPTimeout); err != nil {
		m.log.Debug("mesh: meta update not yet acknowledged by gossip", "err", err)
	}
	return nil
}

// Close leaves gracefully (bounded by LeaveTimeout), shuts memberlist down
// and waits for the mesh goroutines, among them a re-probe of a Suspect
// member in flight (at most ProbeTimeout). Idempotent; later calls return
// the first result.
func (m *Mesh) Close() error { return m.shutdown(true) }

// Kill shuts down without a leave, as a crash would: peers detect the node
// as Dead by probing. For tests. Idempotent.
func (m *Mesh) Kill() error { return m.shutdown(false) }

func (m *Mesh) shutdown(graceful bool) error {
	m.closeOnce.Do(func() {
		m.lifeMu.Lock()
		m.closed = true
		m.lifeMu.Unlock()
		close(m.done)
		m.wg.Wait() // no Join from the reconnect loop, no OnEvent after this

		var errs []error
		if graceful {
			m.sendLeaveIntents()
			if err := m.ml.Leave(m.cfg.LeaveTimeout); err != nil {
				errs = append(errs, fmt.Errorf("mesh: leave: %w", err))
			}
		}
		if err := m.ml.Shutdown(); err != nil {
			errs = append(errs, fmt.Errorf("mesh: shutdown: %w", err))
		}
		if graceful {
			if err := savePeers(m.cfg.DataDir, m.rememberedPeers()); err != nil {
				errs = append(errs, err)
			}
		}
		m.closeErr = errors.Join(errs...)
	})
	return m.closeErr
}

// sendLeaveIntents tells every reachable peer, over memberlist's reliable
// stream, that we are leaving, so its NotifyLeave can report Left instead
// of Dead. Each send is bounded by TCPTimeout; all run in parallel.
func (m *Mesh) sendLeaveIntents() {
	msg := encodeLeaveIntent(m.cfg.NodeName, m.cfg.Meta.GetBootId(), m.cfg.Cluster)
	var wg sync.WaitGroup
	for _, mem := range m.Members() {
		if mem.Name == m.cfg.NodeName || !mem.State.reachable() {
			continue
		}
		node, err := nodeFor(mem)
		if err != nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := m.ml.SendReliable(node, msg); err != nil {
				m.log.Debug("mesh: leave intent not delivered", "to", mem.Name, "err", err)
			}
		}()
	}
	wg.Wait()
}

func nodeFor(mem Member) (*memberlist.Node, error) {
	host, ps, err := net.SplitHostPort(mem.GossipAddr)
	if err != nil {
		return nil, err
	}
	port, err := strconv.Atoi(ps)
	if err != nil {
		return nil, err
	}
	return &memberlist.Node{Name: mem.Name, Addr: net.ParseIP(host), Port: uint16(port)}, nil
}

// kick wakes the dispatcher without blocking; a pending kick already covers
// this change because the dispatcher reads the latest view.
func (m *Mesh) kick() {
	select {
	case m.notify <- struct{}{}:
	default:
	}
}

// setFromNode records memberlist's view of n (called from delegates).
func (m *Mesh) setFromNode(n *memberlist.Node, st State) {
	mem := Member{Name: n.Name, GossipAddr: n.Address(), State: st}
	if meta, err := decodeMeta(n.Meta); err == nil {
		mem.QUICAddr = meta.GetQuicAddr()
		mem.BootID = meta.GetBootId()
		mem.Cluster = meta.GetCluster()
		mem.ProtocolVersions = meta.GetProtocolVersions()
		mem.Tags = meta.GetTags()
		mem.Features = meta.GetFeatures()
	}
	now := time.Now()
	m.mu.Lock()
	if st == StateDead {
		if boot, ok := m.leaving[n.Name]; ok && boot == mem.BootID {
			mem.State = StateLeft
		}
	} else if boot, ok := m.leaving[n.Name]; ok && boot != mem.BootID {
		delete(m.leaving, n.Name) // a new incarnation of the node
	}
	if st == StateAlive {
		delete(m.moved, n.Name)
	}
	old, ok := m.view[n.Name]
	if st == StateAlive && ok && old.State == StateSuspect && old.BootID == mem.BootID {
		mem.State = StateSuspect // an update does not refute a suspicion by itself
	}
	mem.Since = now
	if ok && old.State == mem.State {
		mem.Since = old.Since
	}
	m.setLocked(n.Name, mem)
	m.mu.Unlock()
	m.kick()
}

// setLocked writes name's view entry and marks it for the dispatcher.
// Caller holds mu for writing.
func (m *Mesh) setLocked(name string, mem Member) {
	m.view[name] = mem
	m.changed[name] = struct{}{}
}

// deleteLocked forgets name and marks it for the dispatcher. Caller holds
// mu for writing.
func (m *Mesh) deleteLocked(name string) {
	delete(m.view, name)
	m.changed[name] = struct{}{}
}

// takeChanged returns the members changed since the last call, sorted by
// name, and the names of those deleted meanwhile.
func (m *Mesh) takeChanged() (cur []Member, gone []string) {
	m.mu.Lock()
	for name := range m.changed {
		if mem, ok := m.view[name]; ok {
			cur = append(cur, mem.clone())
		} else {
			gone = append(gone, name)
		}
	}
	clear(m.changed)
	m.mu.Unlock()
	sort.Slice(cur, func(i, j int) bool { return cur[i].Name < cur[j].Name })
	return cur, gone
}

// markSuspect is called when our own probe of name failed.
func (m *Mesh) markSuspect(name string) { m.transition(name, StateAlive, StateSuspect) }

// clearSuspect is called when name acked a probe.
func (m *Mesh) clearSuspect(name string) { m.transition(name, StateSuspect, StateAlive) }

func (m *Mesh) transition(name string, from, to State) {
	m.mu.Lock()
	mem, ok := m.view[name]
	changed := ok && mem.State == from
	if changed {
		mem.State = to
		mem.Since = time.Now()
		m.setLocked(name, mem)
	}
	m.mu.Unlock()
	if changed {
		m.kick()
	}
}

// recordLeaveIntent remembers that name is about to leave; if memberlist
// already declared it dead (the intent came late), it is Left after all.
func (m *Mesh) recordLeaveIntent(name, bootID string) {
	m.mu.Lock()
	m.leaving[name] = bootID
	mem, ok := m.view[name]
	changed := ok && mem.State == StateDead && mem.BootID == bootID
	if changed {
		mem.State = StateLeft
		m.setLocked(name, mem)
	}
	m.mu.Unlock()
	if changed {
		m.kick()
	}
}

// recordMoved remembers that name was claimed from addr.
func (m *Mesh) recordMoved(name, addr string) {
	m.mu.Lock()
	m.moved[name] = addr
	m.mu.Unlock()
}

// logRefusal logs why a node is refused, once per node and reason.
func (m *Mesh) logRefusal(name string, err error) {
	reason := err.Error()
	m.mu.Lock()
	logged := m.refused[name] == reason
	m.refused[name] = reason
	m.mu.Unlock()
	if !logged {
		m.log.Warn("mesh: refusing node "+name+": "+strings.TrimPrefix(reason, ErrRefused.Error()+": "), "peer", name)
	}
}
