package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshnode/meshnode/internal/envcodec"
	"github.com/meshnode/meshnode/internal/queued"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/quic-go/quic-go"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// ALPN is the TLS application protocol; it carries the protocol major version.
const ALPN = "meshnode/2"

// oldALPNs are application protocols of earlier major versions. They are
// offered and accepted only so that such a peer is refused after the
// handshake with a close reason that says what to do, rather than with a
// bare TLS alert.
var oldALPNs = []string{"meshnode/1"}

// Resolver maps node names to QUIC addresses. The transport asks it on every
// send, so membership decides reachability.
type Resolver interface {
	// Resolve returns the QUIC address (host:port) of node, or an error wrapping ErrUnreachable
	// when the node is unknown or known to be down. Fast, never blocks.
	Resolve(node string) (string, error)
}

// PeerInfo identifies the sender of an envelope: its name (verified by its
// certificate), the boot id of its current run and its outbox id.
type PeerInfo struct {
	Name, BootID string
	OutboxID     [16]byte
}

// Handler receives envelopes.
type Handler interface {
	// HandleEnvelope is called for each envelope received, in order per lane, on the lane's reader
	// goroutine; it must not block for long. When env.Receipt != RECEIPT_NONE, the handler calls reply
	// exactly once (now or later, from any goroutine); reply never blocks (drops with a log if the
	// connection is gone). reply is nil when no receipt was asked.
	HandleEnvelope(from PeerInfo, env *pb.Envelope, reply func(*pb.Receipt))
}

// PeerStats counts the frames and bytes exchanged with one peer over all
// its connections.
type PeerStats struct {
	FramesIn, FramesOut, BytesIn, BytesOut uint64
	// WritesOut counts the stream writes that carried FramesOut:
	// FramesOut / WritesOut is how many frames one write took on average
	// (frames queued while the lane was busy go out together).
	WritesOut uint64
	Connected bool // a connection to the peer is open now
}

// peer is the per-name state: the current connection, a dial in progress,
// and counters that survive reconnects.
type peer struct {
	name                                   string
	framesIn, framesOut, bytesIn, bytesOut atomic.Uint64
	writesOut                              atomic.Uint64

	// Guarded by Transport.mu.
	conn       *conn
	gone       uint64    // the id of the last conn that left this entry (setConn); 0: none
	goneAt     time.Time // when it left
	idle       idleWatch // when conn last carried a frame (idle.go)
	dialing    *dialCall
	registered chan struct{} // closed and replaced whenever conn is set
	awaiting   int           // callers in awaitConn
	accepting  int           // incoming connections between admitIncoming and register
}

// setConn makes c (nil: none) the peer's connection. The one it takes the
// place of is on its way to shutdown: its id goes into the next Hello to
// the peer, which may still hold it as live when its CONNECTION_CLOSE was
// lost (register). Transport.mu must be held.
func (p *peer) setConn(c *conn) {
	if p.conn != nil && p.conn != c {
		p.gone, p.goneAt = p.conn.id, time.Now()
	}
	p.conn = c
}

// goneFor is the id of the last connection with node that this node no
// longer has (0: none), for the Hello it sends node.
func (t *Transport) goneFor(node string) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p := t.peers[node]; p != nil {
		return p.gone
	}
	return 0
}

// dialCall lets concurrent senders share one dial.
type dialCall struct {
	done chan struct{}
	c    *conn // set before done is closed
	err  error // set before done is closed

	// handshaken: the QUIC handshake completed (the peer is reachable this
	// way) and the Hello is next. Guarded by Transport.mu.
	handshaken bool
}

// Transport is a QUIC endpoint: it listens and dials on one UDP socket and
// keeps at most one connection per peer.
type Transport struct {
	cfg       Config
	r         Resolver
	h         Handler
	log       *slog.Logger
	udp       *net.UDPConn
	qt        *quic.Transport
	ln        *quic.Listener
	qconf     *quic.Config
	serverTLS *tls.Config
	clientTLS *tls.Config
	certs     *CertificateSource // the certificate presented at each handshake
	refused   *refusals          // peers refused for who they are
	bgDials   sync.Map           // node name -> struct{}: dials started by Forward (forward.go)

	idleClosed atomic.Uint64 // connections closed for idleness (idle.go)
	crowded    atomic.Int32  // connections whose queue is near its byte bound (queuefull.go)

	ctx    context.Context // ends on Close; bounds dials and handshakes
	cancel context.CancelFunc
	wg     sync.WaitGroup // every goroutine of the transport and its connections

	closeOnce sync.Once

	// mu guards the fields below. Lock order: Transport.mu before conn.mu
	// and lane.mu; never call into quic-go while holding it.
	mu     sync.Mutex
	closed bool
	peers  map[string]*peer
}

// New opens the UDP socket, starts listening and returns the Transport.
func New(cfg Config, r Resolver, h Handler) (*Transport, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if r == nil || h == nil {
		return nil, errors.New("transport: new: Resolver and Handler are required")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "transport")
	key, err := loadResetKey(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	ua, err := net.ResolveUDPAddr("udp", cfg.ListenAddr)
	if err != nil {
		return nil, fmt.Errorf("transport: listen %s: %w", cfg.ListenAddr, err)
	}
	udp, err := net.ListenUDP("udp", ua)
	if err != nil {
		return nil, fmt.Errorf("transport: listen %s: %w", cfg.ListenAddr, err)
	}
	var pc net.PacketConn = udp
	if cfg.WrapPacketConn != nil {
		pc = cfg.WrapPacketConn(udp)
	}
	t := &Transport{
		cfg:     cfg,
		r:       r,
		h:       h,
		log:     log,
		refused: newRefusals(),
		udp:     udp,
		qt:      &quic.Transport{Conn: pc, StatelessResetKey: key},
		peers:   make(map[string]*peer),
		qconf: &quic.Config{
			HandshakeIdleTimeout:  cfg.HandshakeTimeout,
			MaxIdleTimeout:        cfg.MaxIdleTimeout,
			KeepAlivePeriod:       cfg.KeepAlivePeriod,
			MaxIncomingStreams:    -1,              // only unidirectional streams are used
			MaxIncomingUniStreams: 2*maxLanes + 16, // a peer's lanes + control, whatever its Lanes setting
		},
	}
	setReceiveWindows(t.qconf, cfg)
	t.certs = NewCertificateSource(cfg.Identity)
	// The client's certificate is required and verified against the
	// cluster CA by verifyClient, not by crypto/tls, so that a refused one
	// is counted and logged (refusals.go).
	base := &tls.Config{
		MinVersion:     tls.VersionTLS13,
		GetCertificate: t.certs.GetCertificate,
		ClientAuth:     tls.RequestClientCert,
		ClientCAs:      cfg.Identity.Roots,
		NextProtos:     append([]string{ALPN}, oldALPNs...),
	}
	t.serverTLS = base.Clone()
	t.serverTLS.GetConfigForClient = t.serverTLSFor(base)
	t.clientTLS = &tls.Config{
		MinVersion:           tls.VersionTLS13,
		GetClientCertificate: t.certs.GetClientCertificate,
		RootCAs:              cfg.Identity.Roots,
		NextProtos:           append([]string{ALPN}, oldALPNs...),
	}
	ln, err := t.qt.Listen(t.serverTLS, t.qconf)
	if err != nil {
		_ = t.qt.Close()
		_ = udp.Close()
		return nil, fmt.Errorf("transport: listen %s: %w", cfg.ListenAddr, err)
	}
	t.ln = ln
	t.ctx, t.cancel = context.WithCancel(context.Background())
	t.wg.Add(1)
	go t.acceptLoop()
	if cfg.IdleConnTimeout > 0 {
		t.wg.Add(1)
		go t.closeIdleLoop()
	}
	return t, nil
}

// ReloadCertificate presents id's certificate from the next handshake on
// (a renewed certificate, without a restart). It refuses, keeping the
// current one, a certificate for another name or from another CA
// (ErrCertificateRefused). Open connections keep theirs.
func (t *Transport) ReloadCertificate(id Identity) error { return t.certs.Reload(id) }

// LocalAddr is the UDP address the transport listens and dials on.
func (t *Transport) LocalAddr() net.Addr { return t.udp.LocalAddr() }

func (t *Transport) acceptLoop() {
	defer t.wg.Done()
	for {
		qc, err := t.ln.Accept(t.ctx)
		if err != nil {
			if t.ctx.Err() == nil {
				t.log.Error("accept stopped", "err", err)
			}
			return
		}
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			ctx, cancel := context.WithTimeout(t.ctx, t.cfg.HandshakeTimeout)
			defer cancel()
			if _, err := t.setup(ctx, qc, false, ""); err != nil && !errors.Is(err, ErrIncompatible) && !errors.Is(err, errDuplicate) {
				t.log.Warn("incoming connection refused", "remote", qc.RemoteAddr(), "err", err)
			}
		}()
	}
}

// Send queues env on the peer's connection (dialing it if needed, bounded by ctx) and returns once the
// frame is handed to the connection's bounded writer queue. Errors wrap ErrUnreachable / ErrQueueFull / ErrClosed.
// env may be reused by the caller once Send returns.
func (t *Transport) Send(ctx context.Context, node string, env *pb.Envelope) error {
	return t.enqueue(ctx, node, []*pb.Envelope{env}, nil)
}

// Request sends env (caller sets env.Receipt to ACCEPTED or PROCESSED; env.MsgId must be set) and waits for its receipt.
// Connection failure -> error wrapping ErrConnLost (or ErrUnreachable); ctx end -> ctx error; waiter removed either way.
func (t *Transport) Request(ctx context.Context, node string, env *pb.Envelope) (*pb.Receipt, error) {
	rs, err := t.RequestBatch(ctx, node, []*pb.Envelope{env})
	if err != nil {
		return nil, err
	}
	return rs[0], nil
}

// RequestBatch queues envs in this order atomically (contiguous in their lane, all for the same recipient)
// and waits for all receipts; result i is the receipt of envs[i], or nil when it did not come (then err
// says why: connection lost / ctx). Used by the reliable relay to pipeline a window of messages.
func (t *Transport) RequestBatch(ctx context.Context, node string, envs []*pb.Envelope) ([]*pb.Receipt, error) {
	if len(envs) == 0 {
		return nil, nil
	}
	seen := make(map[string]struct{}, len(envs))
	for i, e := range envs {
		switch {
		case e == nil:
			return nil, fmt.Errorf("%w: envelope %d is nil", ErrBadEnvelope, i)
		case e.GetMsgId() == "":
			return nil, fmt.Errorf("%w: envelope %d has no msg id", ErrBadEnvelope, i)
		case e.GetReceipt() == pb.Envelope_RECEIPT_NONE:
			return nil, fmt.Errorf("%w: envelope %q asks no receipt", ErrBadEnvelope, e.GetMsgId())
		case e.GetRecipient() != envs[0].GetRecipient():
			return nil, fmt.Errorf("%w: batch mixes recipients %q and %q", ErrBadEnvelope, envs[0].GetRecipient(), e.GetRecipient())
		}
		if _, dup := seen[e.GetMsgId()]; dup {
			return nil, fmt.Errorf("%w: msg id %q twice in one batch", ErrBadEnvelope, e.GetMsgId())
		}
		seen[e.GetMsgId()] = struct{}{}
	}
	// An envelope that cannot be encoded into a frame is left out and
	// reported; the others are sent.
	var unsendable *EncodeError
	all := envs
	idx := make([]int, 0, len(envs))
	// The peer's limit comes with its Hello: the connection the batch
	// will take (connFor replaces one the peer left by restarting, which
	// may have announced another) says which envelopes are too large for
	// it, so they are left out here like those too large for ours, not
	// refused with the whole batch by its lane. A failed dial fails the
	// batch at once (enqueue would dial again). The envelopes are
	// complete: no room is kept for fields added later. An envelope over
	// the peer's limit is confirmed too large only once the peer is shown
	// alive with it: a connection to a peer that restarted in place may
	// not be closed yet (ErrLimitUnconfirmed).
	start := time.Now()
	checked, err := t.connFor(ctx, node)
	if err != nil {
		return make([]*pb.Receipt, len(envs)), err
	}
	limit := checked.maxFrame
	// The peer's Hello during this call, a receipt on the same connection,
	// or the connection's surviving MaxIdleTimeout since its limit was
	// first doubted (keep-alives draw a restarted peer's stateless reset,
	// or find it gone, well within that) shows the peer that announced the
	// limit alive.
	confirmed := !checked.born.Before(start)
	if d := checked.doubted.Load(); d != 0 && start.UnixNano()-d >= int64(t.cfg.MaxIdleTimeout) {
		confirmed = true
	}
	out := make([]*pb.Receipt, len(all))
	var c *conn // the connection the batch went on
	defer func() {
		if !confirmed && (c != checked || !slices.ContainsFunc(out, func(rc *pb.Receipt) bool { return rc != nil })) {
			unconfirmed(unsendable, checked)
		}
	}()
	for i, e := range envs {
		if err := t.checkSize(e, limit, 0); err != nil {
			if unsendable == nil {
				unsendable = &EncodeError{Errs: map[int]error{}}
			}
			unsendable.Errs[i] = err
			continue
		}
		idx = append(idx, i)
	}
	if unsendable != nil {
		if len(idx) == 0 {
			return out, unsendable
		}
		envs = make([]*pb.Envelope, len(idx))
		for j, i := range idx {
			envs[j] = all[i]
		}
	}
	var ws []*waiter
	var settled <-chan struct{}
	if err := t.enqueue(ctx, node, envs, func(cc *conn) error {
		// Fresh waiters for every connection tried: a connection that died
		// after registering them has set them already.
		ws, settled = newWaiters(len(envs))
		c = cc
		return cc.addWaiters(envs, ws)
	}); err != nil {
		return out, errors.Join(err, unsendableErr(unsendable))
	}
	queued.Signal(ctx) // on the lane, behind what was queued on it before
	select {
	case <-settled:
	case <-ctx.Done():
		c.removeWaiters(envs, ws)
	}
	// In order: the receipts up to the first waiter that failed, or that
	// ctx ended before its receipt came.
	for j, w := range ws {
		switch {
		case !w.set.Load():
			return out, errors.Join(fmt.Errorf("transport: request %q to %s: %w", envs[j].GetMsgId(), node, ctx.Err()), unsendableErr(unsendable))
		case w.err != nil:
			c.removeWaiters(envs, ws)
			return out, errors.Join(fmt.Errorf("transport: request %q to %s: %w", envs[j].GetMsgId(), node, w.err), unsendableErr(unsendable))
		}
		out[idx[j]] = w.rc
	}
	return out, unsendableErr(unsendable)
}

// peerLimitError is an envelope over the frame limit the peer announced,
// below ours.
type peerLimitError struct {
	size, limit int
	unconfirmed bool // announced on a connection nothing showed alive
}

func (e *peerLimitError) Error() string {
	s := fmt.Sprintf("%v: a message of %d bytes encoded does not fit the %d-byte frame limit the recipient's node announced", ErrFrameTooLarge, e.size, e.limit)
	if e.unconfirmed {
		s += " (on a connection not yet shown alive)"
	}
	return s
}

func (e *peerLimitError) Unwrap() []error {
	if e.unconfirmed {
		return []error{ErrFrameTooLarge, ErrLimitUnconfirmed}
	}
	return []error{ErrFrameTooLarge}
}

// unconfirmed marks e's entries over a limit the peer announced on c as
// not confirmed (ErrLimitUnconfirmed), and notes when c's limit was
// first doubted.
func unconfirmed(e *EncodeError, c *conn) {
	if e == nil {
		return
	}
	for _, err := range e.Errs {
		if pe := (*peerLimitError)(nil); errors.As(err, &pe) {
			pe.unconfirmed = true
			c.doubted.CompareAndSwap(0, time.Now().UnixNano())
		}
	}
}

// unsendableErr returns e as an error, nil when e is nil.
func unsendableErr(e *EncodeError) error {
	if e == nil {
		return nil
	}
	return e
}

// MinStreamWindow and MaxStreamWindow bound Config.StreamWindow: below
// 64 KiB one lane crawls on any link with a round trip; above 16 MiB one
// peer could make this node buffer more than half a GiB unread.
const (
	MinStreamWindow = 64 << 10
	MaxStreamWindow = 16 << 20
)

// windowLanes is how many of a peer's lanes the receive window is sized
// for, which this node's Hello announces: its own, at least the default.
func windowLanes(cfg Config) int { return max(cfg.Lanes, defaultLanes) }

// setReceiveWindows sets what quic-go buffers of a peer's data that this
// node has not read yet, part of the per-connection bound (readlimit.go).
//
// Streams that are not being read (a lane whose recipient's handler is
// slow, a large frame waiting for the read budget) must never use up the
// connection's window, or a stream being read gets no bytes: a few of them
// stalled every lane of the connection, and frames waiting for budget
// starved those holding it until the frame read timeout ended the
// connection. Each holds at most its stream's window; a peer has one
// stream for each lane and one for control, and writes on no more lanes
// than this node's Hello says its window is sized for (its Lanes, at
// least the default; a peer of an earlier release reads no such field,
// and a cluster upgrades before it raises Lanes). quic-go opens more of
// the connection's window only once a quarter of it has been read, so at
// worst three quarters of it is open: the connection's window is twice
// its streams' windows together, and fixed (quic-go would otherwise start
// it smaller and tune it up).
func setReceiveWindows(q *quic.Config, cfg Config) {
	sw := uint64(cfg.StreamWindow)
	q.InitialStreamReceiveWindow, q.MaxStreamReceiveWindow = sw, sw
	cw := 2 * uint64(windowLanes(cfg)+1) * sw
	q.InitialConnectionReceiveWindow, q.MaxConnectionReceiveWindow = cw, cw
}

// emissionSlack is room for the fields a reliable envelope gets each time
// it is sent (msg id, attempt, predecessor, epoch, remaining TTL): CheckSize
// keeps it free, so a message accepted once is never too large later.
const emissionSlack = 128

// CheckSize reports, wrapping ErrFrameTooLarge, an envelope whose frame
// would be larger than MaxFrameSize, with room left for what a reliable
// envelope gets added each time it is sent. A message that passes fits on
// the wire whenever it is sent.
func (t *Transport) CheckSize(env *pb.Envelope) error {
	return t.checkSize(env, t.cfg.MaxFrameSize, emissionSlack)
}

// CheckSizeTo is CheckSize against the frame limit node announced on the
// connection open to it now (ours when none is open), for a message to a
// node that just reached this one (a reliable reply).
func (t *Transport) CheckSizeTo(env *pb.Envelope, node string) error {
	return t.checkSizeTo(env, node, emissionSlack)
}

// CheckSendTo is CheckSizeTo for env exactly as it is, for a message sent
// once as it is (an ask's response).
func (t *Transport) CheckSendTo(env *pb.Envelope, node string) error {
	return t.checkSizeTo(env, node, 0)
}

func (t *Transport) checkSizeTo(env *pb.Envelope, node string, slack int) error {
	if t.checkSize(env, minFrameSize, slack) == nil {
		return nil // fits any limit a peer may have: no lock on the way of every reply
	}
	limit := t.cfg.MaxFrameSize
	t.mu.Lock()
	if p := t.peers[node]; p != nil && p.conn != nil && !p.conn.isClosed() {
		limit = p.conn.maxFrame
	}
	t.mu.Unlock()
	return t.checkSize(env, limit, slack)
}

// checkSize reports whether env's frame, with slack bytes to spare, fits
// limit.
func (t *Transport) checkSize(env *pb.Envelope, limit, slack int) error {
	n := 0
	if sz, ok := envcodec.Size(env); ok {
		n = sz.Total
	} else {
		n = proto.Size(env)
	}
	frame := protowire.SizeTag(frameFieldEnvelope) + protowire.SizeBytes(n) + slack
	switch {
	case frame <= limit:
		return nil
	case limit < t.cfg.MaxFrameSize:
		return &peerLimitError{size: n, limit: limit}
	}
	return fmt.Errorf("%w: a message of %d bytes encoded does not fit the %d-byte frame limit", ErrFrameTooLarge, n, limit)
}

// CheckSizeForwarded is CheckSize for env as it goes to a forwarder: with
// an origin naming node, carrying this transport's certificate, an outbox
// id and a signature. A message that passes can be forwarded whenever the
// direct path fails, so it never holds its stream behind it while a
// forwarder could carry the rest.
func (t *Transport) CheckSizeForwarded(env *pb.Envelope, node string) error {
	n := 0
	if sz, ok := envcodec.Size(env); ok {
		n = sz.Total
	} else {
		n = proto.Size(env)
	}
	certLen, sigLen := 0, 0
	if c := t.certs.Current(); c != nil && len(c.Certificate) > 0 {
		certLen, sigLen = len(c.Certificate[0]), maxSignatureLen(c)
	}
	origin := 1 + protowire.SizeBytes(len(node)) + 1 + protowire.SizeBytes(16) +
		1 + protowire.SizeBytes(certLen) + 1 + protowire.SizeBytes(sigLen)
	n += protowire.SizeTag(21) + protowire.SizeBytes(origin)
	frame := protowire.SizeTag(frameFieldEnvelope) + protowire.SizeBytes(n) + emissionSlack
	if frame > t.cfg.MaxFrameSize {
		return fmt.Errorf("%w: a message of %d bytes encoded with its origin does not fit the %d-byte frame limit", ErrFrameTooLarge, n, t.cfg.MaxFrameSize)
	}
	return nil
}

// enqueue resolves and connects to node, then queues envs on one lane. reg,
// when set, runs before the frames are queued (to register receipt waiters).
func (t *Transport) enqueue(ctx context.Context, node string, envs []*pb.Envelope, reg func(*conn) error) error {
	return t.onConn(ctx, node, func(c *conn) error {
		if reg != nil {
			if err := reg(c); err != nil {
				return err
			}
		}
		if err := c.laneFor(envs[0].GetRecipient()).enqueueEnvelopes(envs); err != nil {
			if reg != nil {
				c.removeWaitersSilently(envs)
			}
			return sendErr(node, err)
		}
		return nil
	})
}

// SendEncoded is Send for an envelope to recipient already encoded (env,
// the bytes proto.Marshal gives for it; the caller may reuse them once
// SendEncoded returns): a sender that encodes its own envelopes saves
// building one. body says where env's body is and its type, so that the
// type can be named once per lane stream instead of sent with every
// envelope (names.go); the zero Body sends env as it is.
func (t *Transport) SendEncoded(ctx context.Context, node, recipient string, env []byte, body Body) error {
	return t.onConn(ctx, node, func(c *conn) error {
		if err := c.laneFor(recipient).enqueueEncoded(env, body); err != nil {
			return sendErr(node, err)
		}
		return nil
	})
}

// onConn resolves and connects to node and runs queue on the connection;
// when that connection died between lookup and use (ErrConnLost), once
// more on a fresh one.
func (t *Transport) onConn(ctx context.Context, node string, queue func(*conn) error) error {
	for attempt := 0; ; attempt++ {
		c, err := t.connFor(ctx, node)
		if err != nil {
			return err
		}
		err = queue(c)
		if err == nil || !errors.Is(err, ErrConnLost) || attempt > 0 {
			return err
		}
	}
}

// sendErr is the error of a send to node that its lane refused.
func sendErr(node string, err error) error {
	if errors.Is(err, ErrConnLost) {
		return fmt.Errorf("transport: send to %s: %w: %w", node, ErrUnreachable, err)
	}
	return fmt.Errorf("transport: send to %s: %w", node, err)
}

// laneOf maps a recipient to a lane: FNV-1a of the recipient modulo lanes.
func laneOf(recipient string, lanes int) int {
	// hash/fnv's New32a by hand: no hasher and no []byte copy per send.
	const offset32, prime32 = 2166136261, 16777619
	h := uint32(offset32)
	for i := 0; i < len(recipient); i++ {
		h ^= uint32(recipient[i])
		h *= prime32
	}
	return int(h % uint32(lanes))
}

// connFor returns a live connection to node, dialing if needed.
func (t *Transport) connFor(ctx context.Context, node string) (*conn, error) {
	addr, err := t.r.Resolve(node)
	if err != nil {
		if errors.Is(err, ErrUnreachable) {
			return nil, fmt.Errorf("transport: resolve %s: %w", node, err)
		}
		return nil, fmt.Errorf("transport: resolve %s: %w: %w", node, ErrUnreachable, err)
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, ErrClosed
	}
	p := t.peerLocked(node)
	var stale *conn
	if c := p.conn; c != nil {
		if !c.staleFor(addr) {
			t.mu.Unlock()
			return c, nil
		}
		stale = c
		p.setConn(nil)
	}
	d := p.dialing
	if d == nil {
		d = &dialCall{done: make(chan struct{})}
		p.dialing = d
		t.wg.Add(1)
		go t.dial(p, d, addr)
	}
	t.mu.Unlock()
	if stale != nil {
		t.log.Info("peer address changed; replacing connection", "peer", node, "old", stale.qc.RemoteAddr(), "new", addr)
		stale.shutdown(CodeReplaced, "peer address changed", ErrConnLost)
	}
	select {
	case <-d.done:
		if d.err != nil {
			return nil, d.err
		}
		return d.c, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("transport: connect to %s: %w: %w", node, ErrUnreachable, ctx.Err())
	case <-t.ctx.Done():
		return nil, ErrClosed
	}
}

// peerLocked returns the peer entry for name, creating it. t.mu must be held.
func (t *Transport) peerLocked(name string) *peer {
	p := t.peers[name]
	if p == nil {
		p = &peer{name: name}
		t.peers[name] = p
	}
	return p
}

// dial runs one shared dial to p; its result goes to d.
func (t *Transport) dial(p *peer, d *dialCall, addr string) {
	defer t.wg.Done()
	t.mu.Lock()
	accepting := p.accepting > 0
	t.mu.Unlock()
	var c *conn
	var err error
	// While the peer's own connection is being set up (admitted), that one
	// serves: a second would close one of the two under what was sent on it.
	if !accepting || t.awaitAccepted(p) != nil {
		if c, err = t.dialConn(p.name, addr, d); errors.Is(err, errDuplicate) {
			// The peer kept the connection it dialed to us; wait for it to
			// be registered here too.
			err = t.awaitConn(p)
		}
	}
	t.mu.Lock()
	if err != nil && p.conn != nil && !p.conn.isClosed() {
		// The peer's connection came in meanwhile (this dial may have failed
		// only because this node cannot reach it, behind a NAT say).
		err = nil
	}
	if err == nil {
		c = p.conn // the winner of a simultaneous dial may be the incoming connection
		if c == nil {
			err = fmt.Errorf("transport: connect to %s: %w: connection closed during setup", p.name, ErrUnreachable)
		}
	}
	d.c, d.err = c, err
	p.dialing = nil
	t.mu.Unlock()
	close(d.done)
}

// awaitConn waits until p has a live connection, up to HandshakeTimeout.
func (t *Transport) awaitConn(p *peer) error { return t.await(p, false) }

// awaitAccepted waits for the connection of p's that is being set up
// (admitted): it returns nil once p has a live connection, an error at
// once if that setup failed and no other is being set up, or after
// HandshakeTimeout.
func (t *Transport) awaitAccepted(p *peer) error { return t.await(p, true) }

func (t *Transport) await(p *peer, accepted bool) error {
	timer := time.NewTimer(t.cfg.HandshakeTimeout)
	defer timer.Stop()
	t.mu.Lock()
	p.awaiting++
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		p.awaiting--
		t.mu.Unlock()
	}()
	for {
		t.mu.Lock()
		if p.conn != nil {
			t.mu.Unlock()
			return nil
		}
		if accepted && p.accepting == 0 {
			t.mu.Unlock()
			return fmt.Errorf("transport: connect to %s: %w: its connection to this node failed its setup", p.name, ErrUnreachable)
		}
		if p.registered == nil {
			p.registered = make(chan struct{})
		}
		ch := p.registered
		t.mu.Unlock()
		select {
		case <-ch:
		case <-timer.C:
			return fmt.Errorf("transport: connect to %s: %w: both ends dialed at once and this node's dial gave way to %s's, "+
				"whose connection did not arrive within the handshake timeout (%v); the next send dials again "+
				"(if this repeats, check that %s can reach this node's address)", p.name, ErrUnreachable, p.name, t.cfg.HandshakeTimeout, p.name)
		case <-t.ctx.Done():
			return ErrClosed
		}
	}
}

func (t *Transport) dialConn(node, addr string, d *dialCall) (*conn, error) {
	ctx, cancel := context.WithTimeout(t.ctx, t.cfg.HandshakeTimeout)
	defer cancel()
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("transport: dial %s at %s: %w: %w", node, addr, ErrUnreachable, err)
	}
	tc := t.clientTLS.Clone()
	tc.ServerName = node // the server's certificate must hold the name we dial
	qc, err := t.qt.Dial(ctx, ua, tc, t.qconf)
	if err != nil {
		if t.ctx.Err() != nil {
			return nil, ErrClosed
		}
		t.dialRefused(node, addr, err)
		return nil, fmt.Errorf("transport: dial %s at %s: %w: %w", node, addr, ErrUnreachable, err)
	}
	// Before this side's Hello: a connection of the peer's that was
	// admitted or registered meanwhile serves, and this one is dropped
	// unused. Otherwise this dial now counts against the peer's dials
	// (admitIncoming): under Transport.mu, one of the two decisions comes
	// first, so exactly one of the two connections goes on.
	t.mu.Lock()
	p := t.peers[node]
	meanwhile := p != nil && (p.accepting > 0 || p.conn != nil && !p.conn.isClosed())
	if !meanwhile {
		d.handshaken = true
	}
	t.mu.Unlock()
	if meanwhile {
		_ = qc.CloseWithError(CodeDuplicate, "duplicate connection (the peer's came in meanwhile)")
		return nil, errDuplicate
	}
	c, err := t.setup(ctx, qc, true, node)
	if err != nil {
		if t.ctx.Err() != nil {
			return nil, ErrClosed
		}
		return nil, fmt.Errorf("transport: dial %s at %s: %w: %w", node, addr, ErrUnreachable, err)
	}
	return c, nil
}

// admitIncoming decides, before this node answers the Hello h of an
// incoming connection, whether the connection may serve: not when the
// simultaneous-dial tie-break would close it at once, that is when this
// node's name is the smaller one and it has a dial to that peer past its
// QUIC handshake (so the peer is reachable that way), or a live connection
// it dialed that the peer neither replaced (a new boot id) nor names as
// gone. A dial still in its handshake does not count: this node may be
// unable to reach the peer (a NAT), and the peer's dial is then the only
// way; such a dial is dropped before its Hello if the peer's connection is
// registered first (dialConn). Refused before the answer, the dialer never
// sends on it: its dial fails as a duplicate and waits for this node's
// connection. Deciding at register instead, after the answer, lost what the
// dialer had already sent on it. An admitted connection counts as being
// set up (connFor waits for it rather than dialing a second one) until
// admitted is called.
func (t *Transport) admitIncoming(h *pb.Hello) bool {
	name := h.GetNodeName()
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.peerLocked(name)
	if t.cfg.NodeName < name {
		if p.dialing != nil && p.dialing.handshaken {
			return false
		}
		if c := p.conn; c != nil && c.dialed && !c.isClosed() && c.peer.BootID == h.GetBootId() && c.id != h.GetGoneConnection() {
			return false
		}
	}
	p.accepting++
	return true
}

// admitted ends what admitIncoming began for a connection from name,
// once it was registered or failed.
func (t *Transport) admitted(name string) {
	t.mu.Lock()
	if p := t.peers[name]; p != nil && p.accepting > 0 {
		p.accepting--
		if p.accepting == 0 && p.conn == nil && p.registered != nil {
			// Its setup failed: a dial waiting for it goes on at once.
			close(p.registered)
			p.registered = nil
		}
	}
	t.mu.Unlock()
}

// register installs c as the connection of its peer, resolving duplicates.
// It returns the connection to close (c or the one it replaces), if any.
//
// A connection the peer's Hello names as gone is dead, whoever dialed it:
// the peer shut it down, but its CONNECTION_CLOSE may have been lost (a
// partition), and until this side's idle timeout it looks live. Keeping it
// over c by the simultaneous-dial tie-break would leave the peer waiting
// for a connection it no longer has. A Hello names only a connection its
// sender has shut down, so this never drops a live one, nor the winner of
// a genuine simultaneous dial, which neither side shuts down: there the
// tie-break decides, the same way on both sides.
func (t *Transport) register(c *conn) (loser *conn, code quic.ApplicationErrorCode, reason string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return c, CodeGoAway, "node shutting down"
	}
	p := t.peerLocked(c.peer.Name)
	c.stats = p
	old := p.conn
	defer func() {
		if p.conn == c && p.registered != nil {
			close(p.registered)
			p.registered = nil
		}
	}()
	switch {
	case old == nil || old.isClosed():
		p.setConn(c)
		return old, CodeNormal, "replaced"
	case c.peerGone != 0 && c.peerGone == old.id:
		p.setConn(c)
		return old, CodeReplaced, "the peer no longer has this connection"
	case old.peer.BootID != c.peer.BootID:
		p.setConn(c)
		return old, CodeReplaced, "peer restarted with boot id " + c.peer.BootID
	case old.dialed != c.dialed:
		// Both sides dialed at once. Both keep the connection dialed by the
		// lexically smaller node name, so they agree without talking.
		winner := c
		if (t.cfg.NodeName < c.peer.Name) != c.dialed {
			winner = old
		}
		if winner == c {
			p.setConn(c)
			return old, CodeDuplicate, "duplicate connection (simultaneous dial)"
		}
		return c, CodeDuplicate, "duplicate connection (simultaneous dial)"
	default:
		// Same dialer twice: the peer re-dialed, so it considers the old one gone.
		p.setConn(c)
		return old, CodeReplaced, "superseded by a newer connection"
	}
}

// unregister removes c from its peer if it is still the current connection.
func (t *Transport) unregister(c *conn) {
	t.mu.Lock()
	if p := t.peers[c.peer.Name]; p != nil && p.conn == c {
		p.setConn(nil)
	}
	t.mu.Unlock()
}

// ClosePeer closes the connection to node (peer died or restarted) and fails
// its receipt waiters with ErrConnLost. The next send dials again.
func (t *Transport) ClosePeer(node, reason string) {
	t.mu.Lock()
	var c *conn
	if p := t.peers[node]; p != nil {
		c = p.conn
		p.setConn(nil)
	}
	t.mu.Unlock()
	if c != nil {
		// Debug: membership already said why at Info (a peer left, died or
		// restarted); the connection's end is a consequence.
		t.log.Debug("closing peer connection", "peer", node, "reason", reason)
		c.shutdown(CodeNormal, reason, ErrConnLost)
	}
}

// ForgetPeer drops the entry of node (its counters and connection slot)
// once it has left the cluster, so that peers coming and going do not grow
// the transport's memory. It reports whether it did: a peer with a
// connection, a dial in flight or a caller waiting for its connection is
// kept, and so is one whose last connection left less than MaxIdleTimeout
// ago: the peer may still hold that connection (its close lost on the way)
// until it idles out there, and the next Hello must name it as gone. A
// later send or an incoming connection makes a new entry.
func (t *Transport) ForgetPeer(node string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.peers[node]
	if p == nil {
		return true
	}
	if p.conn != nil || p.dialing != nil || p.awaiting > 0 || p.accepting > 0 {
		return false
	}
	if p.gone != 0 && time.Since(p.goneAt) < t.cfg.MaxIdleTimeout {
		return false
	}
	delete(t.peers, node)
	return true
}

// PeerStats returns the counters of every peer seen so far (a departed
// peer's until ForgetPeer drops them).
func (t *Transport) PeerStats() map[string]PeerStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]PeerStats, len(t.peers))
	for name, p := range t.peers {
		out[name] = PeerStats{
			FramesIn:  p.framesIn.Load(),
			FramesOut: p.framesOut.Load(),
			BytesIn:   p.bytesIn.Load(),
			BytesOut:  p.bytesOut.Load(),
			WritesOut: p.writesOut.Load(),
			Connected: p.conn != nil,
		}
	}
	return out
}

// goAwayWait bounds how long Close waits for GoAway frames to be written.
const goAwayWait = 200 * time.Millisecond

// Close sends GoAway to every peer, closes the connections and the socket,
// and waits for every goroutine to end. It is idempotent. Handlers that
// block forever keep Close from returning.
func (t *Transport) Close() error {
	t.closeOnce.Do(func() {
		t.mu.Lock()
		t.closed = true
		var conns []*conn
		for _, p := range t.peers {
			if p.conn != nil {
				conns = append(conns, p.conn)
				p.setConn(nil)
			}
		}
		t.mu.Unlock()
		t.cancel()
		// One deadline for all GoAways: it stays expired, so a second stuck
		// connection does not wait on its own.
		wait, stop := context.WithTimeout(context.Background(), goAwayWait)
		flushed := make([]<-chan struct{}, len(conns))
		for i, c := range conns {
			flushed[i] = c.lanes[len(c.lanes)-1].finish(&pb.GoAway{Code: uint32(CodeGoAway), Reason: "node shutting down"})
		}
		for _, f := range flushed {
			select {
			case <-f:
			case <-wait.Done():
			}
		}
		stop()
		var wg sync.WaitGroup
		for _, c := range conns {
			wg.Go(func() { c.shutdown(CodeGoAway, "node shutting down", ErrClosed) })
		}
		wg.Wait()
		_ = t.ln.Close()
		_ = t.qt.Close()
		_ = t.udp.Close()
		t.wg.Wait()
	})
	return nil
}

// remoteAddrPort is the peer's UDP address of qc, unmapped for comparison.
func remoteAddrPort(qc *quic.Conn) netip.AddrPort {
	if ua, ok := qc.RemoteAddr().(*net.UDPAddr); ok {
		ap := ua.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	return netip.AddrPort{}
}
