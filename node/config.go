package node

import (
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"time"

	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/mesh"
	"github.com/meshnode/meshnode/outbox"
	"github.com/meshnode/meshnode/partition"
	"github.com/meshnode/meshnode/transport"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Config configures a Node. DefaultConfig sets every field; the top-level
// fields are the ones an operator sets, and New copies them into the embedded
// lower-layer configs (Mesh, Transport, Outbox, Relay), which hold the tuning.
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
	AskResponseTTL  time.Duration    // early responses and orphaned waiters are pruned after this (1 min)
	// SpawnGrace: for this long after Start, a reliable message for an
	// actor that does not exist here is answered "not yet" (the sender
	// waits, uncounted) rather than "no such actor" (which counts toward
	// the message's MaxAttempts), so an application may spawn late.
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
	// Responses bounds the ask responses kept while no ask waits for them
	// (bytes per peer and in all, EarlyTTL); its TTL is AskResponseTTL.
	Responses mailbox.RegistryConfig

	Mesh      mesh.Config      // membership tuning (failure detection, reconnect)
	Transport transport.Config // QUIC tuning (queues, lanes, timeouts, frame size)
	Outbox    outbox.Config    // durable store tuning (attempts, key window, retention, clock)
	Relay     partition.Config // relay partitions, batch size, backoff, AIMD

	Logger *slog.Logger // structured logs; nil discards them
}

// DefaultConfig returns a Config for a node named name with every field set.
// DataDir and TLS must still be filled in.
func DefaultConfig(name string) Config {
	return Config{
		Name:            name,
		Cluster:         "meshnode",
		GossipAddr:      "0.0.0.0:7946",
		QUICAddr:        "0.0.0.0:7947",
		MailboxCapacity: mailbox.DefaultCapacity,
		Overflow:        mailbox.Reject,
		MailboxBytes:    16 << 20,
		PeerQueuedBytes: 32 << 20,
		AskTimeout:      10 * time.Second,
		AskResponseTTL:  time.Minute,
		SpawnGrace:      2 * time.Minute,
		HandlerTimeout:  30 * time.Second,
		Tags:            nil, // no member tags
		// No interceptors, no tracing: nothing runs around a send but the send.
		ClientInterceptors: nil,
		ServerInterceptors: nil,
		TracerProvider:     nil,
		Propagator:         nil,
		Responses:          mailbox.DefaultRegistryConfig(),
		Mesh:               mesh.DefaultConfig(name),
		Transport:          transport.DefaultConfig(name),
		Outbox:             outbox.DefaultConfig(""),
		Relay:              partition.DefaultConfig(),
	}
}

// Validate reports the first problem with c, wrapped in ErrBadConfig.
func (c Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrBadConfig, fmt.Sprintf(format, args...))
	}
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
		return fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	if slices.ContainsFunc(c.ClientInterceptors, func(f ClientInterceptor) bool { return f == nil }) ||
		slices.ContainsFunc(c.ServerInterceptors, func(f ServerInterceptor) bool { return f == nil }) {
		return bad("an interceptor is nil")
	}
	if err := c.responses().Validate(); err != nil {
		return bad("responses: %v", err)
	}
	return nil
}

// responses is the response registry's config, with AskResponseTTL.
func (c Config) responses() mailbox.RegistryConfig {
	r := c.Responses
	r.TTL = c.AskResponseTTL
	return r
}

// lower fills the embedded configs from the top-level fields. Mesh.OnEvent
// is the application's: the node chains it after its own reaction.
func (c Config) lower(bootID string, logger *slog.Logger) (mesh.Config, transport.Config, outbox.Config, partition.Config) {
	m := c.Mesh
	m.NodeName, m.Cluster, m.BindAddr, m.Join, m.SecretKey, m.DataDir = c.Name, c.Cluster, c.GossipAddr, c.Join, c.GossipKey, c.DataDir
	m.Logger = logger.With("part", "mesh")

	t := c.Transport
	t.NodeName, t.Cluster, t.BootID, t.ListenAddr, t.Identity, t.DataDir = c.Name, c.Cluster, bootID, c.QUICAddr, c.TLS, c.DataDir
	t.Logger = logger.With("part", "transport")

	o := c.Outbox
	o.Path = filepath.Join(c.DataDir, "outbox.db")
	o.Logger = logger.With("part", "outbox")

	r := c.Relay
	r.Logger = logger.With("part", "relay")
	return m, t, o, r
}
