package node

import (
	"bytes"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"time"

	"github.com/meshnode/meshnode/internal/badconfig"
	"github.com/meshnode/meshnode/internal/ident"
	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/mesh"
	"github.com/meshnode/meshnode/outbox"
	"github.com/meshnode/meshnode/partition"
	"github.com/meshnode/meshnode/transport"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// DefaultCluster is the cluster name of DefaultConfig, and of mesh's and
// transport's DefaultConfig.
const DefaultCluster = ident.DefaultCluster

// Config configures a Node. DefaultConfig sets every field.
//
// The top-level fields are the ones an operator sets; the embedded
// lower-layer configs (Mesh, Transport, Outbox, Relay, Responses) hold the
// tuning. Some fields of the embedded configs are the node's: it sets them
// from its own fields, or per start, as serf does with its memberlist
// config. DefaultConfig leaves them zero, and Validate refuses a config
// that sets one to something else than the node would (ErrBadConfig,
// naming both fields):
//
//	Mesh.NodeName, Transport.NodeName   Name
//	Mesh.Cluster, Transport.Cluster     Cluster
//	Mesh.BindAddr                       GossipAddr
//	Mesh.Join                           Join
//	Mesh.SecretKey                      GossipKey
//	Mesh.DataDir, Transport.DataDir     DataDir
//	Outbox.Path                         DataDir (DataDir/outbox.db)
//	Transport.ListenAddr                QUICAddr
//	Transport.Identity                  TLS
//	Responses.TTL                       AskResponseTTL
//	Mesh.Logger, Transport.Logger,
//	Outbox.Logger, Relay.Logger         Logger (each part adds its component)
//	Mesh.Meta                           the node: boot id, QUIC address, Tags
//	Transport.BootID, .OutboxID         the node, at each Open
//
// Mesh.OnEvent is not the node's: the node reacts to membership first,
// then calls it, on a goroutine of its own.
type Config struct {
	Name       string             // node name: unique in the cluster, the DNS SAN of its certificate
	Cluster    string             // cluster name: nodes of other clusters are refused
	DataDir    string             // outbox, dedupe window, peers and QUIC reset key live here (required)
	GossipAddr string             // memberlist bind address (host:port; port 0 picks one)
	QUICAddr   string             // QUIC bind address (host:port; port 0 picks one)
	Join       []string           // gossip addresses of seed nodes
	GossipKey  []byte             // 32-byte gossip encryption key; nil disables encryption (tests only)
	TLS        transport.Identity // cluster CA roots and this node's certificate (required)

	MailboxCapacity int              // default mailbox capacity of spawned actors (1024)
	Overflow        mailbox.Overflow // default overflow strategy of spawned actors (Reject)
	AskTimeout      time.Duration    // deadline for Ask when the context has none (10 s)
	AskResponseTTL  time.Duration    // early responses and waiters are pruned after this (1 min); an ask still waiting fails with context.DeadlineExceeded
	// SpawnGrace: for this long after Start, a reliable message for an
	// actor that does not exist here is answered "not yet" (the sender
	// waits, uncounted) rather than "no such actor" (which counts toward
	// the message's MaxAttempts), so an application may spawn late; and
	// so for this long after an actor stopped, so that a redeploy (Stop,
	// then Spawn again) dead-letters nothing.
	SpawnGrace time.Duration
	// HandlerTimeout bounds the context a reliable message's handler runs
	// with (its TTL may bound it sooner). A handler that returns an error
	// after it is a handler failure; one that returns nil is a success.
	HandlerTimeout time.Duration

	// Tags are this node's member tags, gossiped in its metadata (peers
	// see them in Member.Tags); with the node's own fields they must fit
	// in memberlist's 512 bytes. Node.SetTags changes them.
	Tags map[string]string

	// ClientInterceptors run around every Tell, Ask and TellReliable of
	// this node, the first outermost (nil: none).
	ClientInterceptors []ClientInterceptor
	// ServerInterceptors run around every handler run of this node's
	// actors, the first outermost (nil: none).
	ServerInterceptors []ServerInterceptor
	// TracerProvider, when set, makes a span per send and per handler run,
	// and the trace context travels in message headers (nil: no spans).
	TracerProvider trace.TracerProvider
	// Propagator writes the trace context into headers and reads it back
	// (nil: W3C trace context and baggage when TracerProvider is set, and
	// nothing otherwise).
	Propagator propagation.TextMapPropagator
	// MailboxBytes is the default bound of spawned actors' mailboxes in
	// bytes of queued messages, besides their count (16 MiB).
	MailboxBytes int64
	// PeerQueuedBytes bounds the bytes of one peer's messages queued in
	// all mailboxes together; past it that peer's messages are refused as
	// "full" while others' still get in (32 MiB).
	PeerQueuedBytes int64
	// DepartedPeerGrace: a peer that membership reports dead or left has
	// its in-memory state here (relay limiter, route and streams,
	// transport entry, byte budget, warnings) dropped this long after,
	// once nothing is queued or in flight to it (10 min). A peer back
	// within it keeps its state; one back later gets fresh state. What
	// guards exactly-once on disk is never dropped with it.
	DepartedPeerGrace time.Duration
	// Responses bounds the ask responses kept while no ask waits for them
	// (bytes per peer and in all, EarlyTTL); its TTL is AskResponseTTL.
	Responses mailbox.RegistryConfig

	Mesh      mesh.Config      // membership tuning (failure detection, reconnect)
	Transport transport.Config // QUIC tuning (queues, lanes, timeouts, frame size)
	Outbox    outbox.Config    // durable store tuning (attempts, key window, retention, clock)
	Relay     partition.Config // relay partitions, batch size, backoff, AIMD

	Logger *slog.Logger // structured logs, with node=Name; nil discards them
}

// DefaultConfig returns a Config for a node named name with every field set.
// DataDir and TLS must still be filled in.
func DefaultConfig(name string) Config {
	return Config{
		Name:            name,
		Cluster:         DefaultCluster,
		GossipAddr:      "0.0.0.0:7946",
		QUICAddr:        "0.0.0.0:7947",
		MailboxCapacity: mailbox.DefaultCapacity,
		Overflow:        mailbox.Reject,
		MailboxBytes:    16 << 20,
		PeerQueuedBytes: 32 << 20,
		// Outlasts a restart or a brief partition, so a peer that comes
		// back soon keeps its AIMD limit; short enough that churn does
		// not accumulate.
		DepartedPeerGrace: 10 * time.Minute,
		AskTimeout:        10 * time.Second,
		AskResponseTTL:    time.Minute,
		SpawnGrace:        2 * time.Minute,
		HandlerTimeout:    30 * time.Second,
		Tags:              nil, // no member tags
		// No interceptors, no tracing: nothing runs around a send but the send.
		ClientInterceptors: nil,
		ServerInterceptors: nil,
		TracerProvider:     nil,
		Propagator:         nil,
		// The lower layers' defaults, without the fields the node owns.
		Responses: tuning(mailbox.DefaultRegistryConfig(), func(r *mailbox.RegistryConfig) { r.TTL = 0 }),
		Mesh:      tuning(mesh.DefaultConfig(""), clearMeshOwned),
		Transport: tuning(transport.DefaultConfig(""), func(t *transport.Config) {
			t.Cluster, t.BootID, t.ListenAddr, t.Logger = "", "", "", nil
		}),
		Outbox: tuning(outbox.DefaultConfig(""), func(o *outbox.Config) { o.Logger = nil }),
		Relay:  tuning(partition.DefaultConfig(), func(r *partition.Config) { r.Logger = nil }),
	}
}

// MeshPreset returns mesh's tuning for a cluster of about size members
// (mesh.PresetFor: probe, gossip and push/pull intervals, inbound limits)
// without the fields the node owns, ready for Config.Mesh. DefaultConfig's
// Mesh is MeshPreset(16).
func MeshPreset(size int) mesh.Config { return tuning(mesh.PresetFor("", size), clearMeshOwned) }

func clearMeshOwned(m *mesh.Config) { m.Cluster, m.BindAddr, m.Meta, m.Logger = "", "", nil, nil }

// tuning returns c with clear applied: a lower layer's default config
// without the fields the node owns.
func tuning[C any](c C, clear func(*C)) C {
	clear(&c)
	return c
}

// Validate reports the first problem with c or with its embedded configs,
// as an error wrapping ErrBadConfig and, for an embedded config, also its
// package's sentinel (outbox.ErrBadConfig, ...). The message reads once:
// "node: bad config: Outbox: MaxBatch must be >= 1".
func (c Config) Validate() error {
	if err := c.validateOwn(); err != nil {
		return err
	}
	if err := c.checkOwned(); err != nil {
		return err
	}
	// The node sets BootID and OutboxID at Open; stand-ins let the rest
	// of the transport config be checked now.
	m, t, o, r := c.lower(ident.NewBootID(), nil)
	t.OutboxID = [16]byte{1}
	for _, sub := range []struct {
		name string
		err  error
	}{
		{"Mesh", m.Validate()}, {"Transport", t.Validate()}, {"Outbox", o.Validate()},
		{"Relay", r.Validate()}, {"Responses", c.responses().Validate()},
	} {
		if sub.err != nil {
			return badconfig.Within(ErrBadConfig, sub.name, sub.err)
		}
	}
	return nil
}

// validateOwn checks the node's own fields.
func (c Config) validateOwn() error {
	bad := func(format string, args ...any) error { return badconfig.New(ErrBadConfig, format, args...) }
	if err := validName(c.Name); err != nil {
		return bad("name %q: %v", c.Name, err)
	}
	if c.Cluster == "" {
		return bad("cluster name is empty")
	}
	if c.DataDir == "" {
		return bad("data directory is empty")
	}
	for what, a := range map[string]string{"gossip address": c.GossipAddr, "QUIC address": c.QUICAddr} {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return bad("%s %q: %v", what, a, err)
		}
	}
	if c.GossipKey != nil && len(c.GossipKey) != 32 {
		return bad("gossip key is %d bytes, want 32", len(c.GossipKey))
	}
	if c.TLS.Roots == nil || len(c.TLS.Cert.Certificate) == 0 {
		return bad("TLS identity missing: need the cluster CA and this node's certificate")
	}
	if c.TLS.Name != "" && c.TLS.Name != c.Name {
		return bad("certificate is for %q but the node is named %q", c.TLS.Name, c.Name)
	}
	if c.MailboxCapacity <= 0 {
		return bad("mailbox capacity %d must be positive", c.MailboxCapacity)
	}
	if c.MailboxBytes <= 0 || c.PeerQueuedBytes <= 0 {
		return bad("mailbox bytes %d and peer queued bytes %d must be positive", c.MailboxBytes, c.PeerQueuedBytes)
	}
	if c.DepartedPeerGrace < time.Second {
		return bad("departed peer grace %v must be at least 1s", c.DepartedPeerGrace)
	}
	if c.AskTimeout <= 0 {
		return bad("ask timeout must be positive")
	}
	if c.AskResponseTTL < time.Millisecond {
		return bad("ask response TTL %v must be at least 1ms", c.AskResponseTTL)
	}
	if c.SpawnGrace < 0 {
		return bad("spawn grace %v must not be negative", c.SpawnGrace)
	}
	if c.HandlerTimeout <= 0 {
		return bad("handler timeout must be positive")
	}
	if err := checkTags(c.Cluster, c.Tags); err != nil {
		return &badconfig.Error{Sentinel: ErrBadConfig, Detail: err.Error(), Cause: err}
	}
	if slices.ContainsFunc(c.ClientInterceptors, func(f ClientInterceptor) bool { return f == nil }) ||
		slices.ContainsFunc(c.ServerInterceptors, func(f ServerInterceptor) bool { return f == nil }) {
		return bad("an interceptor is nil")
	}
	return nil
}

// checkOwned refuses an embedded config's field that the node owns (see
// Config) set to something else than the node's value: the node would
// overwrite it, and the application would not know.
func (c Config) checkOwned() error {
	sameIdentity := func(a, b transport.Identity) bool {
		return a.Name == b.Name && a.Roots == b.Roots && slices.EqualFunc(a.Cert.Certificate, b.Cert.Certificate, bytes.Equal)
	}
	for _, f := range []struct {
		field, owner string
		set, same    bool
	}{
		{"Mesh.NodeName", "Name", c.Mesh.NodeName != "", c.Mesh.NodeName == c.Name},
		{"Mesh.Cluster", "Cluster", c.Mesh.Cluster != "", c.Mesh.Cluster == c.Cluster},
		{"Mesh.BindAddr", "GossipAddr", c.Mesh.BindAddr != "", c.Mesh.BindAddr == c.GossipAddr},
		{"Mesh.Join", "Join", c.Mesh.Join != nil, slices.Equal(c.Mesh.Join, c.Join)},
		{"Mesh.SecretKey", "GossipKey", c.Mesh.SecretKey != nil, bytes.Equal(c.Mesh.SecretKey, c.GossipKey)},
		{"Mesh.DataDir", "DataDir", c.Mesh.DataDir != "", c.Mesh.DataDir == c.DataDir},
		{"Mesh.Meta", "the node (boot id, QUIC address, Tags)", c.Mesh.Meta != nil, false},
		{"Mesh.Logger", "Logger", c.Mesh.Logger != nil, c.Mesh.Logger == c.Logger},
		{"Transport.NodeName", "Name", c.Transport.NodeName != "", c.Transport.NodeName == c.Name},
		{"Transport.Cluster", "Cluster", c.Transport.Cluster != "", c.Transport.Cluster == c.Cluster},
		{"Transport.BootID", "the node (a new one at each Open)", c.Transport.BootID != "", false},
		{"Transport.OutboxID", "the node (its outbox's id)", c.Transport.OutboxID != [16]byte{}, false},
		{"Transport.ListenAddr", "QUICAddr", c.Transport.ListenAddr != "", c.Transport.ListenAddr == c.QUICAddr},
		{"Transport.Identity", "TLS", !sameIdentity(c.Transport.Identity, transport.Identity{}), sameIdentity(c.Transport.Identity, c.TLS)},
		{"Transport.DataDir", "DataDir", c.Transport.DataDir != "", c.Transport.DataDir == c.DataDir},
		{"Transport.Logger", "Logger", c.Transport.Logger != nil, c.Transport.Logger == c.Logger},
		{"Outbox.Path", "DataDir (DataDir/outbox.db)", c.Outbox.Path != "", c.Outbox.Path == c.outboxPath()},
		{"Outbox.Logger", "Logger", c.Outbox.Logger != nil, c.Outbox.Logger == c.Logger},
		{"Relay.Logger", "Logger", c.Relay.Logger != nil, c.Relay.Logger == c.Logger},
		{"Responses.TTL", "AskResponseTTL", c.Responses.TTL != 0, c.Responses.TTL == c.AskResponseTTL},
	} {
		if f.set && !f.same {
			return badconfig.New(ErrBadConfig, "%s is set by %s: leave it zero", f.field, f.owner)
		}
	}
	return nil
}

func (c Config) outboxPath() string { return filepath.Join(c.DataDir, "outbox.db") }

// responses is the response registry's config, with AskResponseTTL.
func (c Config) responses() mailbox.RegistryConfig {
	r := c.Responses
	r.TTL = c.AskResponseTTL
	return r
}

// lower fills the fields of the embedded configs that the node owns (see
// Config) from the top-level fields. Mesh.Meta and Mesh.OnEvent are set
// at Start; Transport.OutboxID once the outbox is open. logger carries
// node=Name; each part adds its component.
func (c Config) lower(bootID string, logger *slog.Logger) (mesh.Config, transport.Config, outbox.Config, partition.Config) {
	m := c.Mesh
	m.NodeName, m.Cluster, m.BindAddr, m.Join, m.SecretKey, m.DataDir = c.Name, c.Cluster, c.GossipAddr, c.Join, c.GossipKey, c.DataDir
	m.Logger = logger

	t := c.Transport
	t.NodeName, t.Cluster, t.BootID, t.ListenAddr, t.Identity, t.DataDir = c.Name, c.Cluster, bootID, c.QUICAddr, c.TLS, c.DataDir
	t.Logger = logger

	o := c.Outbox
	o.Path = c.outboxPath()
	o.Logger = logger

	r := c.Relay
	r.Logger = logger
	return m, t, o, r
}
