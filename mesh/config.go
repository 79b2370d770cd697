package mesh

import (
	"fmt"
	"log/slog"
	"math"
	"net"
	"slices"
	"strconv"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/meshnode/meshnode/internal/badconfig"
	"github.com/meshnode/meshnode/internal/ident"
	"github.com/meshnode/meshnode/mailbox/pb"
)

// MaxMetaSize is the exclusive upper bound on the encoded NodeMeta
// (memberlist's MetaMaxSize).
const MaxMetaSize = memberlist.MetaMaxSize

// minStreamBytes is the smallest InboundStreamBytes: a push/pull of a few
// dozen members with full metadata.
const minStreamBytes = 64 << 10

// minPacketBytes is the smallest InboundPacketBytes: memberlist's UDP buffer
// (1,400 bytes) plus a 255-byte label and the encryption overhead.
const minPacketBytes = 2048

// maxClusterLen keeps "meshnode/"+cluster within memberlist's 255-byte label.
const maxClusterLen = 200

// Config configures a Mesh. Start from DefaultConfig.
type Config struct {
	// NodeName is this member's unique name in the cluster.
	NodeName string
	// Cluster names the cluster; it is the gossip label ("meshnode/"+Cluster)
	// and members whose NodeMeta carries another cluster are refused.
	Cluster string
	// BindAddr is the gossip host:port (UDP and TCP); port 0 picks a free port.
	BindAddr string
	// AdvertiseAddr is the host:port peers use to reach us; "" = the bound address.
	AdvertiseAddr string
	// Join lists seed gossip addresses tried at start and by the reconnect loop.
	Join []string
	// SecretKey is the 32-byte AES-256 gossip key; nil disables encryption
	// (tests only: a warning is logged).
	SecretKey []byte
	// DataDir holds peers.json so a restarted node finds its cluster without
	// seeds; "" disables persistence.
	DataDir string
	// Meta is this node's metadata. Empty BootId, ProtocolVersions or Cluster
	// are filled in by New (random, pb.SupportedVersions, Cluster).
	Meta *pb.NodeMeta
	// OnEvent is called serially from the mesh's own goroutine; nil = no events.
	// It may block, but only delays later events (never memberlist).
	OnEvent func(Event)

	// ProbeInterval: how often each node probes one random peer. Lower finds
	// failures faster but costs packets: N nodes send N probes per interval.
	ProbeInterval time.Duration
	// ProbeTimeout: how long to wait for a direct ack before asking others to
	// probe indirectly. Must cover the RTT plus scheduling delay under load,
	// or busy nodes are suspected falsely.
	ProbeTimeout time.Duration
	// GossipInterval: how often queued broadcasts (alive/suspect/dead) are
	// sent to a few random peers. Lower spreads news faster at more packets.
	GossipInterval time.Duration
	// PushPullInterval: full state sync over TCP with one random peer.
	// Repairs lost gossip; costs a TCP exchange of the whole member list.
	PushPullInterval time.Duration
	// TCPTimeout bounds TCP dials and push/pull exchanges, and so how long a
	// Join to an unreachable address blocks.
	TCPTimeout time.Duration
	// SuspicionMult scales the suspicion timeout
	// (SuspicionMult * max(1, log10(n)) * ProbeInterval): lower declares dead
	// sooner, higher gives a slow node more time to refute.
	SuspicionMult int
	// SuspicionMaxTimeoutMult caps the timeout while few peers confirm the
	// suspicion, at this multiple of the minimum.
	SuspicionMaxTimeoutMult int
	// RetransmitMult: each broadcast is retransmitted RetransmitMult*log(n+1)
	// times; higher is more reliable on lossy links, more traffic.
	RetransmitMult int
	// IndirectChecks: peers asked to probe a node that missed a direct ack.
	// More avoids false suspicion from one bad path.
	IndirectChecks int
	// DeadNodeReclaimTime: after this long dead, a node of the same name may
	// come back from a new address (restart on another port or host).
	DeadNodeReclaimTime time.Duration
	// ReconnectInterval: how often unreachable join seeds and recently
	// failed peers are re-joined (failed peers by about two members of the
	// cluster each interval, and by about eight 1, 2, 4 ... 32 intervals
	// after the failure); bounds how fast a healed partition merges.
	ReconnectInterval time.Duration
	// ReconnectTimeout: a failed or left peer is forgotten (and no longer
	// re-joined) after this long.
	ReconnectTimeout time.Duration
	// LeaveTimeout bounds how long Close waits for the leave broadcast.
	LeaveTimeout time.Duration

	// Inbound limits. The cluster label is not secret and memberlist reads
	// a whole stream before it checks the gossip key, so these bound what a
	// stranger who can reach the gossip port makes this node hold. Worst
	// case for the heap: about 3 x InboundStreams x InboundStreamBytes
	// (memberlist's read buffer grows by doubling, then decrypts a copy).

	// InboundStreams caps the inbound gossip streams (push/pull, joins,
	// leave intents, TCP probes) open at once. Further connections wait in
	// the kernel's accept queue, not in memory. Raise it with the cluster
	// size: every member opens one push/pull per PushPullInterval (scaled).
	InboundStreams int
	// InboundStreamBytes caps the bytes read from one inbound stream. It
	// must hold a push/pull of the whole member list: about 250 bytes per
	// member with meshnode's metadata (up to ~600 with MaxMetaSize).
	InboundStreamBytes int
	// InboundStreamTimeout caps the life of an inbound stream, from accept.
	// memberlist's own deadline (TCPTimeout) may end it sooner, never later.
	InboundStreamTimeout time.Duration
	// InboundStreamRate caps the bytes per second read from all inbound
	// streams together (bursts of InboundStreamBytes pass at once). memberlist
	// must read and decrypt a whole stream to authenticate it, so this bounds
	// the CPU a stranger can make this node spend on garbage. Honest gossip
	// needs about 2 x (member list size) per PushPullInterval (scaled), plus
	// one member list per joining node.
	InboundStreamRate int
	// InboundPacketBytes: gossip datagrams larger than this are dropped
	// unread. memberlist never sends more than about 1,400 bytes (its UDP
	// buffer) plus the label and encryption overhead.
	InboundPacketBytes int
	// HandoffQueueDepth bounds the gossip messages (alive, suspect, dead
	// and user messages) received and waiting for memberlist's handler;
	// beyond it they are dropped. A wave of deaths or joins in a large
	// cluster arrives as a burst of them, and a dropped alive message is a
	// refutation lost: the member stays dead in that view until a
	// push/pull. Each waiting message holds its datagram (at most
	// InboundPacketBytes); with a SecretKey only members can fill it.
	HandoffQueueDepth int

	// WrapTransport lets tests inject faults: it gets mesh's transport (the
	// gossip sockets under the inbound limits) and returns the one
	// memberlist uses. nil = unchanged.
	WrapTransport func(memberlist.NodeAwareTransport) memberlist.NodeAwareTransport
	// Logger receives mesh logs and memberlist's own output (at debug
	// level), under component=mesh (memberlist's lines add lib=memberlist);
	// nil discards them.
	Logger *slog.Logger
}

// DefaultConfig returns a configuration tuned for a 3-10 node LAN: a killed
// node is declared dead in about 1.5 s (measured), inside the 3 s target.
func DefaultConfig(nodeName string) Config {
	return Config{
		NodeName:      nodeName,             // unique member name
		Cluster:       ident.DefaultCluster, // "meshnode": gossip label and membership filter
		BindAddr:      "127.0.0.1:0",        // loopback, free port: safe default
		AdvertiseAddr: "",                   // advertise the bound address
		Join:          nil,                  // no seeds: start a new cluster
		SecretKey:     nil,                  // unencrypted: set a key in production
		DataDir:       "",                   // no peers.json
		Meta:          &pb.NodeMeta{BootId: ident.NewBootID(), ProtocolVersions: pb.SupportedVersions()},
		OnEvent:       nil, // no subscriber

		ProbeInterval:           300 * time.Millisecond, // ~3 probes/s per node; 200 ms gave false suspicion on a loaded 2-core box
		ProbeTimeout:            150 * time.Millisecond, // LAN RTT is <1 ms; the rest absorbs GC, -race and load
		GossipInterval:          50 * time.Millisecond,  // news reaches 10 nodes in ~150 ms
		PushPullInterval:        5 * time.Second,        // anti-entropy; cheap at 10 nodes
		TCPTimeout:              time.Second,            // LAN dial; bounds a Join to a dead seed
		SuspicionMult:           2,                      // 600 ms suspicion at n<=10 before dead
		SuspicionMaxTimeoutMult: 2,                      // at most 1.2 s without confirmations
		RetransmitMult:          4,                      // memberlist LAN default: reliable enough
		IndirectChecks:          3,                      // three helpers before suspecting
		DeadNodeReclaimTime:     time.Second,            // restarted node may reuse its name soon
		ReconnectInterval:       time.Second,            // partitions heal within ~1 s
		ReconnectTimeout:        24 * time.Hour,         // edge devices may be away for hours
		LeaveTimeout:            time.Second,            // graceful close never hangs longer
		InboundStreams:          16,                     // push/pull of 10 nodes needs ~1; joins come in bursts
		InboundStreamBytes:      1 << 20,                // push/pull of ~4,000 members; 16 x 1 MiB bounds a flood
		InboundStreamTimeout:    2 * time.Second,        // 2 x TCPTimeout: honest peers end on memberlist's deadline
		InboundStreamRate:       4 << 20,                // 4 MiB/s: ~1,000 joins of a 10-node list per second
		InboundPacketBytes:      8 << 10,                // memberlist sends <= ~1.7 KiB; leaves ample room
		HandoffQueueDepth:       1024,                   // memberlist's default; presets above 16 members raise it
		WrapTransport:           nil,                    // real network
		Logger:                  slog.Default(),         // process logger
	}
}

// Validate reports the first problem with c, wrapping ErrBadConfig,
// ErrBadGossipKey or ErrMetaTooLarge.
func (c Config) Validate() error {
	bad := func(format string, args ...any) error { return badconfig.New(ErrBadConfig, format, args...) }
	if c.NodeName == "" {
		return bad("NodeName is empty")
	}
	if c.Cluster == "" || len(c.Cluster) > maxClusterLen {
		return bad("Cluster must be 1..%d bytes, got %d", maxClusterLen, len(c.Cluster))
	}
	if _, _, err := splitHostPort(c.BindAddr); err != nil {
		return bad("BindAddr %q: %v", c.BindAddr, err)
	}
	if c.AdvertiseAddr != "" {
		if _, _, err := splitHostPort(c.AdvertiseAddr); err != nil {
			return bad("AdvertiseAddr %q: %v", c.AdvertiseAddr, err)
		}
	}
	for _, j := range c.Join {
		if _, _, err := net.SplitHostPort(j); err != nil {
			return bad("Join address %q: %v", j, err)
		}
	}
	if c.SecretKey != nil && len(c.SecretKey) != 32 {
		return &badconfig.Error{Sentinel: ErrBadConfig, Detail: fmt.Sprintf("SecretKey is %d bytes, want 32", len(c.SecretKey)), Cause: ErrBadGossipKey}
	}
	if c.Meta != nil {
		if c.Meta.GetCluster() != "" && c.Meta.GetCluster() != c.Cluster {
			return bad("Meta.Cluster %q != Cluster %q", c.Meta.GetCluster(), c.Cluster)
		}
		if _, err := encodeMeta(fillMeta(c.Meta, c.Cluster)); err != nil {
			return &badconfig.Error{Sentinel: ErrBadConfig, Detail: "Meta: " + err.Error(), Cause: err}
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"ProbeInterval", c.ProbeInterval}, {"ProbeTimeout", c.ProbeTimeout},
		{"GossipInterval", c.GossipInterval}, {"PushPullInterval", c.PushPullInterval},
		{"TCPTimeout", c.TCPTimeout}, {"DeadNodeReclaimTime", c.DeadNodeReclaimTime},
		{"ReconnectInterval", c.ReconnectInterval}, {"ReconnectTimeout", c.ReconnectTimeout},
		{"LeaveTimeout", c.LeaveTimeout},
	} {
		if d.v <= 0 {
			return bad("%s must be > 0, got %v", d.name, d.v)
		}
	}
	if c.ProbeTimeout >= c.ProbeInterval {
		return bad("ProbeTimeout %v must be < ProbeInterval %v", c.ProbeTimeout, c.ProbeInterval)
	}
	if c.ReconnectTimeout < c.ReconnectInterval {
		return bad("ReconnectTimeout %v must be >= ReconnectInterval %v", c.ReconnectTimeout, c.ReconnectInterval)
	}
	for _, n := range []struct {
		name string
		v    int
	}{
		{"SuspicionMult", c.SuspicionMult}, {"SuspicionMaxTimeoutMult", c.SuspicionMaxTimeoutMult},
		{"RetransmitMult", c.RetransmitMult}, {"HandoffQueueDepth", c.HandoffQueueDepth},
	} {
		if n.v < 1 {
			return bad("%s must be >= 1, got %d", n.name, n.v)
		}
	}
	if c.IndirectChecks < 0 {
		return bad("IndirectChecks must be >= 0, got %d", c.IndirectChecks)
	}
	if c.InboundStreams < 1 {
		return bad("InboundStreams must be >= 1, got %d", c.InboundStreams)
	}
	if c.InboundStreamBytes < minStreamBytes {
		return bad("InboundStreamBytes must be >= %d (a small push/pull), got %d", minStreamBytes, c.InboundStreamBytes)
	}
	if c.InboundStreamTimeout < c.TCPTimeout {
		return bad("InboundStreamTimeout %v must be >= TCPTimeout %v", c.InboundStreamTimeout, c.TCPTimeout)
	}
	if c.InboundStreamRate < minStreamBytes {
		return bad("InboundStreamRate must be >= %d bytes/s, got %d", minStreamBytes, c.InboundStreamRate)
	}
	if c.InboundPacketBytes < minPacketBytes || c.InboundPacketBytes > readBufSize {
		return bad("InboundPacketBytes must be %d..%d, got %d", minPacketBytes, readBufSize, c.InboundPacketBytes)
	}
	return nil
}

// memberlistConfig is memberlist's configuration for c without the parts
// New fills per node (transport, addresses, delegates, logger): the
// protocol's timing, labelling and encryption. The simulation uses it too,
// so the figures in docs/fleet-scale.md come from what New runs.
func (c Config) memberlistConfig() *memberlist.Config {
	mc := memberlist.DefaultLANConfig()
	mc.Name = c.NodeName
	mc.Label = "meshnode/" + c.Cluster
	mc.ProbeInterval = c.ProbeInterval
	mc.ProbeTimeout = c.ProbeTimeout
	mc.GossipInterval = c.GossipInterval
	mc.PushPullInterval = c.PushPullInterval
	mc.TCPTimeout = c.TCPTimeout
	mc.SuspicionMult = c.SuspicionMult
	mc.SuspicionMaxTimeoutMult = c.SuspicionMaxTimeoutMult
	mc.RetransmitMult = c.RetransmitMult
	mc.IndirectChecks = c.IndirectChecks
	mc.DeadNodeReclaimTime = c.DeadNodeReclaimTime
	mc.HandoffQueueDepth = c.HandoffQueueDepth
	if c.SecretKey != nil {
		mc.SecretKey = slices.Clone(c.SecretKey)
		mc.GossipVerifyIncoming = true
		mc.GossipVerifyOutgoing = true
	}
	mc.LogOutput = nil
	// Compression saves nothing on a LAN for packets this small, and its
	// lzw writer was the largest CPU cost of gossip in profiles.
	mc.EnableCompression = false
	return mc
}

// maxSuspicion is memberlist's longest suspicion timeout in a cluster of n:
// SuspicionMaxTimeoutMult x SuspicionMult x max(1, log10 n) x ProbeInterval.
func (c Config) maxSuspicion(n int) time.Duration {
	scale := math.Max(1, math.Log10(math.Max(1, float64(n))))
	return time.Duration(float64(c.SuspicionMaxTimeoutMult*c.SuspicionMult) * scale * float64(c.ProbeInterval))
}

func (c Config) streamLimits() streamLimits {
	return streamLimits{
		streams: c.InboundStreams,
		bytes:   int64(c.InboundStreamBytes),
		timeout: c.InboundStreamTimeout,
		rate:    c.InboundStreamRate,
	}
}

func splitHostPort(addr string) (string, int, error) {
	host, ps, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(ps)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("bad port %q", ps)
	}
	if host != "" && net.ParseIP(host) == nil {
		return "", 0, fmt.Errorf("host %q is not an IP address", host)
	}
	return host, port, nil
}
