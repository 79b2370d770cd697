package transport

import (
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/meshnode/meshnode/internal/badconfig"
	"github.com/meshnode/meshnode/internal/ident"
	"github.com/meshnode/meshnode/mailbox/pb"
)

// The range of MaxFrameSize.
const (
	minFrameSize = 1 << 10
	maxFrameSize = 1 << 30
)

// maxLanes bounds Config.Lanes; the QUIC stream limit is derived from it.
const maxLanes = 256

// defaultLanes is Config.Lanes by default.
const defaultLanes = 16

// Config configures a Transport. Start from DefaultConfig.
type Config struct {
	NodeName string // this node's name; must equal Identity.Name
	Cluster  string // peers of another cluster are refused
	BootID   string // changes on every start; lets peers tell a restart from a reconnect
	// OutboxID names this node's outbox (made with its file): the sender
	// part of the reliable streams it feeds, sent in the Hello. Zero is
	// refused by peers.
	OutboxID [16]byte

	ListenAddr string   // UDP address for listening and dialing; "127.0.0.1:0" picks a free port
	Identity   Identity // CA roots and this node's certificate
	DataDir    string   // the stateless-reset key is persisted as DataDir/quic-reset.key; "" = random per run

	// MaxFrameSize is the largest frame sent or accepted; a larger length
	// prefix is refused before allocating. Each side announces it in its
	// Hello, and envelopes to a peer that announced a smaller one are held
	// to the peer's.
	MaxFrameSize   int
	SendQueueSize  int // envelopes queued per peer before Send returns ErrQueueFull (a batch of any count fits an empty queue)
	SendQueueBytes int // encoded bytes queued per peer before Send returns ErrQueueFull
	Lanes          int // unidirectional envelope streams per connection and direction; to a peer that announces fewer in its Hello (what its receive window is sized for), that many

	// What one peer may make this node hold while reading (see readlimit.go).
	MaxReadBytes     int           // bytes of frames being read on one connection at once, over all its streams
	FrameReadTimeout time.Duration // a frame must be complete this long after its first byte arrived
	MaxHeaders       int           // header entries a received envelope may carry
	MaxHeaderBytes   int           // encoded bytes of those entries together
	// StreamWindow is how many bytes a peer may send on one stream ahead
	// of what this node has read (its QUIC receive window). One lane moves
	// at most this much per round trip: 512 KiB is 5 MB/s at 100 ms.
	// Raise it for long, fast links; a connection then buffers up to
	// 2 x (Lanes, at least 16, + 1) x StreamWindow unread.
	StreamWindow int

	KeepAlivePeriod  time.Duration // PING interval so an idle connection stays open and a dead one is noticed
	MaxIdleTimeout   time.Duration // a connection with no packets from the peer for this long is dead
	HandshakeTimeout time.Duration // dial + TLS + Hello exchange must finish within this
	IdleConnTimeout  time.Duration // a connection that carried no frame either way this long is closed (the next send dials again); 0 = never

	WrapPacketConn func(net.PacketConn) net.PacketConn // fault injection in tests; nil = the plain UDP socket
	Logger         *slog.Logger                        // logs under component=transport; nil discards them

	// helloHook lets tests send a different Hello (see export_test.go).
	helloHook func(*pb.Hello)
	// maxReceipts overrides maxQueuedReceipts in tests; 0 = the default.
	maxReceipts int
	// largeStall overrides largeStall in tests; 0 = the default.
	largeStall time.Duration
}

// DefaultConfig returns a Config with every field set except Identity,
// which the caller must provide (see CA.NewIdentity, LoadIdentityFiles).
func DefaultConfig(nodeName string) Config {
	return Config{
		NodeName:         nodeName,
		Cluster:          ident.DefaultCluster, // "meshnode": the cluster name peers must share
		BootID:           ident.NewBootID(),    // random per process start
		OutboxID:         [16]byte{},           // required: the node sets its outbox's id
		ListenAddr:       "0.0.0.0:7947",       // next to memberlist's 7946
		Identity:         Identity{},           // required: set by the caller
		DataDir:          "",                   // no persisted reset key: resets only work within one run
		MaxFrameSize:     4 << 20,              // 4 MiB: big enough for documents, small enough to bound memory per read
		SendQueueSize:    8192,                 // ~1 MiB of 128-byte messages per peer
		SendQueueBytes:   64 << 20,             // large messages are bounded by bytes: 16 frames of the 4 MiB maximum
		Lanes:            defaultLanes,         // 16 recipients can progress independently per peer
		MaxReadBytes:     8 << 20,              // two frames of the 4 MiB maximum in progress per connection
		FrameReadTimeout: 30 * time.Second,     // 4 MiB in 30 s needs ~1.1 Mbit/s; raise it for slower links
		MaxHeaders:       64,                   // application headers are few and short
		MaxHeaderBytes:   16 << 10,             // 16 KiB of keys and values together
		StreamWindow:     512 << 10,            // 5 MB/s per lane at a 100 ms round trip; 17 MiB unread per connection at most
		KeepAlivePeriod:  time.Second,          // ping every second
		MaxIdleTimeout:   5 * time.Second,      // dead peer noticed within 5 s
		HandshakeTimeout: 3 * time.Second,      // a dial never hangs longer than 3 s
		IdleConnTimeout:  2 * time.Minute,      // a fleet keeps open only the connections it uses
		WrapPacketConn:   nil,                  // no fault injection
		Logger:           slog.Default(),       // the process logger
	}
}

// Validate reports the first problem in c, or nil.
func (c Config) Validate() error {
	switch {
	case c.NodeName == "":
		return badconfig.New(ErrBadConfig, "NodeName is empty")
	case c.Cluster == "":
		return badconfig.New(ErrBadConfig, "Cluster is empty")
	case c.BootID == "":
		return badconfig.New(ErrBadConfig, "BootID is empty")
	case c.OutboxID == [16]byte{}:
		return badconfig.New(ErrBadConfig, "OutboxID is not set")
	case len(c.Identity.Cert.Certificate) == 0 || c.Identity.Roots == nil:
		return badconfig.New(ErrBadConfig, "Identity is not set (use CA.NewIdentity or LoadIdentityFiles)")
	case c.Identity.Name != c.NodeName:
		return badconfig.New(ErrBadConfig, "certificate is for %q but NodeName is %q", c.Identity.Name, c.NodeName)
	case c.MaxFrameSize < minFrameSize || c.MaxFrameSize > maxFrameSize:
		return badconfig.New(ErrBadConfig, "MaxFrameSize %d outside [1 KiB, 1 GiB]", c.MaxFrameSize)
	case c.SendQueueSize < 1:
		return badconfig.New(ErrBadConfig, "SendQueueSize %d must be at least 1", c.SendQueueSize)
	case c.SendQueueBytes < c.MaxFrameSize:
		return badconfig.New(ErrBadConfig, "SendQueueBytes %d must hold one frame of MaxFrameSize %d", c.SendQueueBytes, c.MaxFrameSize)
	case c.Lanes < 1 || c.Lanes > maxLanes:
		return badconfig.New(ErrBadConfig, "Lanes %d outside [1, %d]", c.Lanes, maxLanes)
	case c.MaxReadBytes < c.MaxFrameSize:
		return badconfig.New(ErrBadConfig, "MaxReadBytes %d must hold one frame of MaxFrameSize %d", c.MaxReadBytes, c.MaxFrameSize)
	case c.StreamWindow < MinStreamWindow || c.StreamWindow > MaxStreamWindow:
		return badconfig.New(ErrBadConfig, "StreamWindow %d outside [64 KiB, 16 MiB]", c.StreamWindow)
	case c.FrameReadTimeout <= 0:
		return badconfig.New(ErrBadConfig, "FrameReadTimeout must be positive")
	case c.MaxHeaders < 0 || c.MaxHeaderBytes < 0:
		return badconfig.New(ErrBadConfig, "MaxHeaders and MaxHeaderBytes must not be negative")
	case c.KeepAlivePeriod <= 0 || c.MaxIdleTimeout <= 0 || c.HandshakeTimeout <= 0:
		return badconfig.New(ErrBadConfig, "KeepAlivePeriod, MaxIdleTimeout and HandshakeTimeout must be positive")
	case c.IdleConnTimeout < 0:
		return badconfig.New(ErrBadConfig, "IdleConnTimeout %v is negative (0 keeps idle connections open)", c.IdleConnTimeout)
	case c.KeepAlivePeriod >= c.MaxIdleTimeout:
		return badconfig.New(ErrBadConfig, "KeepAlivePeriod %v must be below MaxIdleTimeout %v", c.KeepAlivePeriod, c.MaxIdleTimeout)
	}
	host, port, err := net.SplitHostPort(c.ListenAddr)
	if err != nil {
		return badconfig.New(ErrBadConfig, "ListenAddr %q: %v", c.ListenAddr, err)
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil {
		return badconfig.New(ErrBadConfig, "ListenAddr %q: bad port: %v", c.ListenAddr, err)
	} else if p == 0 && host == "" {
		return badconfig.New(ErrBadConfig, "ListenAddr %q: give a host with port 0", c.ListenAddr)
	}
	return nil
}
