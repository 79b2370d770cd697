package transport

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/quic-go/quic-go"
)

// readBufSize is the bufio buffer per received stream; frames up to this
// size are decoded without copying them out first. A peer may open up to
// 2 x maxLanes + 16 streams: they hold at most 8.25 MiB of buffers.
const readBufSize = 16 << 10

// conn is one established, Hello-verified connection to a peer.
type conn struct {
	t        *Transport
	qc       *quic.Conn
	peer     PeerInfo
	stats    *peer                  // set by register
	dialed   bool                   // this node dialed it
	id       uint64                 // the same at both ends (connID); 0 if TLS gave none
	peerGone uint64                 // the connection the peer's Hello said it no longer has (0: none)
	remote   netip.AddrPort         // the peer's UDP address
	done     chan struct{}          // closed by shutdown
	reads    *readBudget            // bytes of large frames being read, all streams together
	large    *largeGate             // lanes writing frames too large for the peer's stream buffer (isLarge)
	maxFrame int                    // the largest envelope frame sent on it: ours, or the peer's announced limit if lower
	born     time.Time              // when the peer's Hello (with its limits) came
	doubted  atomic.Int64           // unix ns an envelope was first found over the peer's unconfirmed limit; 0: never
	queued   atomic.Int64           // envelopes queued on all lanes, bounded by SendQueueSize
	qbytes   atomic.Int64           // their encoded bytes, bounded by SendQueueBytes
	crowded  atomic.Bool            // qbytes is within MaxFrameSize of its bound (noteQueue)
	wrate    atomic.Int64           // bytes/s the lanes have been writing (noteRate); 0 until measured
	writers  atomic.Int32           // lanes in their Writes now
	progress atomic.Int64           // unix ns a lane last began or finished a Write; 0 before any
	lanes    []*lane                // Lanes envelope lanes, then the control lane (receipts, GoAway)
	nlanes   int                    // of them, those used: ours, or the peer's announced lanes if fewer (laneFor)
	names    bool                   // the peer's Hello lists FeatureTypeNames: lanes may name body types (names.go)
	routes   bool                   // the peer's Hello lists FeatureRouteNames: lanes may name routes (names.go)
	origins  bool                   // the peer's Hello lists FeatureOriginNames: lanes may name forwarded envelopes' origins (names.go)
	signers  bool                   // the peer's Hello lists FeatureSignerNames: the control lane may name receipts' signers (names.go)
	fresh    atomic.Pointer[string] // last address staleFor found equal to remote
	idle     atomic.Bool            // being closed for idleness (idle.go)

	closeOnce sync.Once

	// mu guards the fields below.
	mu       sync.Mutex
	closed   bool
	closeErr error
	waiters  map[string]*waiter
}

// waiter is a request waiting for one receipt. The waiters of one
// RequestBatch share a waitBatch: its caller wakes once, when the last of
// them is set, not once per receipt of an emission.
type waiter struct {
	batch *waitBatch
	rc    *pb.Receipt
	err   error
	set   atomic.Bool // rc or err is set (and may be read)
}

// waitBatch counts the waiters of one request that are not set yet.
type waitBatch struct {
	left atomic.Int64
	done chan struct{} // closed when every waiter is set
}

// newWaiters returns n waiters sharing one batch, and the channel that
// closes when all of them are set.
func newWaiters(n int) ([]*waiter, <-chan struct{}) {
	b := &waitBatch{done: make(chan struct{})}
	b.left.Store(int64(n))
	ws, all := make([]*waiter, n), make([]waiter, n)
	for i := range all {
		all[i].batch = b
		ws[i] = &all[i]
	}
	return ws, b.done
}

// finish marks w set, once its rc or err is: whoever removed w from the
// connection's waiters (complete, shutdown) calls it, exactly once.
func (w *waiter) finish() {
	w.set.Store(true)
	if w.batch.left.Add(-1) == 0 {
		close(w.batch.done)
	}
}

// setup exchanges and checks Hello frames on a new QUIC connection and, on
// success, registers it and starts its goroutines. The dialer speaks first;
// the acceptor answers only when the dialer's Hello is acceptable, so a
// refused dialer learns why from the close code instead of a later failure.
func (t *Transport) setup(ctx context.Context, qc *quic.Conn, dialed bool, expect string) (*conn, error) {
	leaf := qc.ConnectionState().TLS.PeerCertificates
	if len(leaf) == 0 { // cannot happen with RequireAndVerifyClientCert; be safe
		_ = qc.CloseWithError(CodeNameMismatch, "no certificate")
		return nil, fmt.Errorf("%w: peer sent no certificate", ErrIncompatible)
	}
	certNames := leaf[0].DNSNames
	if p := qc.ConnectionState().TLS.NegotiatedProtocol; p != ALPN {
		err := fmt.Errorf("%w: peer speaks %q, this node %q: run the same meshnode release on both", ErrIncompatible, p, ALPN)
		t.log.Warn("peer refused", "remote", qc.RemoteAddr(), "err", err)
		_ = qc.CloseWithError(CodeIncompatible, err.Error())
		return nil, err
	}
	var ctrl *quic.SendStream
	var ph *pb.Hello
	var br *bufio.Reader
	var ctrlStream *quic.ReceiveStream
	var err error
	if dialed {
		if ctrl, err = t.sendHello(ctx, qc, expect); err != nil {
			return nil, err
		}
		if ph, br, ctrlStream, err = t.readHello(ctx, qc); err != nil {
			return nil, err
		}
	} else if ph, br, ctrlStream, err = t.readHello(ctx, qc); err != nil {
		return nil, err
	}
	if code, err := t.checkHello(ph, certNames, expect); err != nil {
		if code == CodeNameMismatch {
			t.countRefusal(kindIdentity, hostOf(qc.RemoteAddr()), err)
		} else {
			t.log.Warn("peer refused", "remote", qc.RemoteAddr(), "err", err)
		}
		_ = qc.CloseWithError(code, err.Error())
		return nil, err
	}
	if !dialed {
		// Decided before this side's Hello: a dialer that hears no Hello
		// never sends on a connection that will be closed under it.
		if !t.admitIncoming(ph) {
			_ = qc.CloseWithError(CodeDuplicate, "duplicate connection (simultaneous dial)")
			return nil, nil // this node's own connection serves; not an error
		}
		defer t.admitted(ph.GetNodeName())
		if ctrl, err = t.sendHello(ctx, qc, ph.GetNodeName()); err != nil {
			return nil, err
		}
	}
	c := &conn{
		t:       t,
		qc:      qc,
		peer:    PeerInfo{Name: ph.GetNodeName(), BootID: ph.GetBootId(), OutboxID: [16]byte(ph.GetOutboxId())},
		dialed:  dialed,
		remote:  remoteAddrPort(qc),
		id:      connID(qc),
		done:    make(chan struct{}),
		reads:   newReadBudget(t.cfg.MaxReadBytes),
		waiters: make(map[string]*waiter),

		maxFrame: frameLimit(t.cfg.MaxFrameSize, ph.GetMaxFrameSize()),
		nlanes:   lanesTo(t.cfg.Lanes, ph.GetLanes()),
		names:    slices.Contains(ph.GetFeatures(), FeatureTypeNames),
		routes:   slices.Contains(ph.GetFeatures(), FeatureRouteNames),
		origins:  slices.Contains(ph.GetFeatures(), FeatureOriginNames),
		signers:  slices.Contains(ph.GetFeatures(), FeatureSignerNames),
		born:     time.Now(),
		peerGone: ph.GetGoneConnection(),
	}
	c.large = newLargeGate(largeSlots(t.cfg.MaxReadBytes, ph.GetMaxReadBytes(), c.maxFrame), t.cfg.largeStall)
	c.lanes = make([]*lane, t.cfg.Lanes+1)
	for i := range c.lanes {
		c.lanes[i] = &lane{c: c, wake: make(chan struct{}, 1)}
		c.lanes[i].packed = c.lanes[i].pack
	}
	c.lanes[t.cfg.Lanes].stream = ctrl
	c.lanes[t.cfg.Lanes].control = true

	loser, code, reason := t.register(c)
	if loser == c {
		c.shutdown(code, reason, ErrConnLost)
		if code == CodeGoAway {
			return nil, ErrClosed
		}
		return c, nil // the other connection serves; not an error
	}
	// Start goroutines before closing the loser so its waiters, failing
	// with ErrConnLost, can retry on c at once.
	t.wg.Add(len(c.lanes) + 2)
	for _, l := range c.lanes {
		go l.run()
	}
	go c.readControl(c.streamReader(br, ctrlStream))
	go c.acceptStreams()
	if loser != nil {
		t.log.Info("replacing connection", "peer", c.peer.Name, "reason", reason)
		loser.shutdown(code, reason, ErrConnLost)
	}
	t.log.Debug("connected", "peer", c.peer.Name, "boot", c.peer.BootID, "dialed", dialed, "remote", qc.RemoteAddr())
	return c, nil
}

// frameLimit is the largest frame to send to a peer whose Hello
// announced the limit announced: ours when it announced none (a peer of
// an older version) or a larger one, and never below the smallest
// MaxFrameSize a config may set, so a peer cannot make its own connection
// useless by mistake.
func frameLimit(own int, announced uint32) int {
	if announced == 0 {
		return own
	}
	return min(own, max(int(min(announced, maxFrameSize)), minFrameSize))
}

// lanesTo is how many of its lanes a node with own lanes writes to a peer
// that announced its receive window is sized for announced (0: none
// announced): more would let the peer's stalled lanes use up its window
// (setReceiveWindows).
func lanesTo(own int, announced uint32) int {
	if announced == 0 {
		return own
	}
	return int(min(uint32(own), announced))
}

// laneFor is the lane that carries recipient's envelopes on c.
func (c *conn) laneFor(recipient string) *lane {
	return c.lanes[laneOf(recipient, c.nlanes)]
}

// largeSlots is how many large frames may be written to a peer at once:
// as many of the largest frame sent to it as its read budget holds (its
// announced MaxReadBytes, or ours if it announced none), at least one. A
// frame the peer cannot start reading within its budget waits, and one
// waiting longer than its FrameReadTimeout closes the connection.
func largeSlots(ownRead int, announced uint64, maxFrame int) int {
	read := uint64(ownRead)
	if announced > 0 {
		read = announced
	}
	return int(max(1, min(read/uint64(maxFrame), maxLanes+1)))
}

// connIDLabel names the TLS exporter output that is a connection's id.
const connIDLabel = "EXPORTER-meshnode-connection-id"

// connID is 8 bytes of qc's TLS exporter: both ends derive the same value
// from the handshake, with no extra round trip, and every connection
// another (but by a 2^-64 chance). 0 when TLS gives none; a Hello naming 0
// names no connection.
func connID(qc *quic.Conn) uint64 {
	cs := qc.ConnectionState().TLS
	b, err := cs.ExportKeyingMaterial(connIDLabel, nil, 8)
	if err != nil || len(b) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(b)
}

// hello is the Hello this node sends peer.
func (t *Transport) hello(peer string) *pb.Hello {
	h := &pb.Hello{
		NodeName:         t.cfg.NodeName,
		BootId:           t.cfg.BootID,
		ProtocolVersions: pb.SupportedVersions(),
		Cluster:          t.cfg.Cluster,
		OutboxId:         t.cfg.OutboxID[:],
		MaxFrameSize:     uint32(t.cfg.MaxFrameSize),
		MaxReadBytes:     uint64(t.cfg.MaxReadBytes),
		GoneConnection:   t.goneFor(peer),
		Lanes:            uint32(windowLanes(t.cfg)),
		Features:         []string{FeatureTypeNames, FeatureRouteNames, FeatureOriginNames, FeatureSignerNames},
	}
	if t.cfg.helloHook != nil {
		t.cfg.helloHook(h)
	}
	return h
}

// sendHello opens the control stream and writes our Hello to peer on it.
func (t *Transport) sendHello(ctx context.Context, qc *quic.Conn, peer string) (*quic.SendStream, error) {
	s, err := qc.OpenUniStreamSync(ctx)
	if err != nil {
		_ = qc.CloseWithError(CodeProtocol, "cannot open control stream")
		return nil, fmt.Errorf("transport: open control stream: %w", closeCause(qc, err))
	}
	b, err := AppendFrame(nil, &pb.Frame{Kind: &pb.Frame_Hello{Hello: t.hello(peer)}})
	if err == nil {
		_, err = s.Write(b)
	}
	if err != nil {
		_ = qc.CloseWithError(CodeProtocol, "cannot send hello")
		return nil, fmt.Errorf("transport: send hello: %w", closeCause(qc, err))
	}
	return s, nil
}

// readHello accepts the peer's control stream and reads its Hello.
func (t *Transport) readHello(ctx context.Context, qc *quic.Conn) (*pb.Hello, *bufio.Reader, *quic.ReceiveStream, error) {
	rs, err := qc.AcceptUniStream(ctx)
	if err != nil {
		_ = qc.CloseWithError(CodeProtocol, "no control stream")
		return nil, nil, nil, fmt.Errorf("transport: await hello: %w", closeCause(qc, err))
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = rs.SetReadDeadline(dl)
	}
	br := bufio.NewReaderSize(rs, readBufSize)
	var f pb.Frame
	if _, err := ReadFrame(br, t.cfg.MaxFrameSize, &f); err != nil {
		_ = qc.CloseWithError(CodeProtocol, "bad hello")
		return nil, nil, nil, fmt.Errorf("transport: read hello: %w", closeCause(qc, err))
	}
	_ = rs.SetReadDeadline(time.Time{})
	h := f.GetHello()
	if h == nil {
		_ = qc.CloseWithError(CodeProtocol, "first frame is not a hello")
		return nil, nil, nil, fmt.Errorf("%w: first frame from %s is not a hello", ErrBadFrame, qc.RemoteAddr())
	}
	return h, br, rs, nil
}

// checkHello validates the peer's Hello against its certificate and our
// cluster; it returns the close code to use when it fails.
func (t *Transport) checkHello(h *pb.Hello, certNames []string, expect string) (quic.ApplicationErrorCode, error) {
	name := h.GetNodeName()
	if !slices.Contains(certNames, name) {
		certName := "(none)"
		if len(certNames) > 0 {
			certName = certNames[0]
		}
		return CodeNameMismatch, fmt.Errorf("%w: peer claims %s but certificate is for %s", ErrIncompatible, name, certName)
	}
	if expect != "" && name != expect {
		return CodeNameMismatch, fmt.Errorf("%w: dialed %s but peer is %s", ErrIncompatible, expect, name)
	}
	if name == t.cfg.NodeName {
		return CodeNameMismatch, fmt.Errorf("%w: peer claims our own name %s", ErrIncompatible, name)
	}
	if h.GetCluster() != t.cfg.Cluster {
		return CodeIncompatible, fmt.Errorf("%w: peer %s is in cluster %q, we are in %q", ErrIncompatible, name, h.GetCluster(), t.cfg.Cluster)
	}
	if !pb.Compatible(h.GetProtocolVersions()) {
		return CodeIncompatible, fmt.Errorf("%w: peer %s speaks protocol versions %v, we speak %v: run the same meshnode release on both",
			ErrIncompatible, name, h.GetProtocolVersions(), pb.SupportedVersions())
	}
	if h.GetBootId() == "" {
		return CodeProtocol, fmt.Errorf("%w: peer %s sent no boot id", ErrIncompatible, name)
	}
	if len(h.GetOutboxId()) != 16 || [16]byte(h.GetOutboxId()) == ([16]byte{}) {
		return CodeProtocol, fmt.Errorf("%w: peer %s sent no valid outbox id", ErrIncompatible, name)
	}
	return 0, nil
}

// closeCause turns the error of a failed stream operation into the reason
// the connection ended: a *CloseError when the peer closed it with one of
// our codes, else QUIC's own cause.
func closeCause(qc *quic.Conn, err error) error {
	cause := context.Cause(qc.Context())
	if cause == nil {
		return err
	}
	var ae *quic.ApplicationError
	if errors.As(cause, &ae) && ae.Remote {
		return &CloseError{Code: ae.ErrorCode, Reason: ae.ErrorMessage, Remote: true}
	}
	return cause
}

// staleFor reports whether c, dialed by us, points to another address than
// the resolver now gives (the peer restarted elsewhere). Connections the
// peer dialed are never judged by address: their source address need not
// be the advertised one. A closed c is stale too, which is read without
// mu (on every send): shutdown takes c out of the peer table before it
// marks it closed, and closes done right after.
func (c *conn) staleFor(addr string) bool {
	if c.isClosedFast() {
		return true
	}
	if !c.dialed {
		return false
	}
	if last := c.fresh.Load(); last != nil && *last == addr {
		return false // the resolver gives the same string on every send: parse it once
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return false // a host name: do not resolve on the send path
	}
	ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	if ap.Addr().IsUnspecified() {
		return false
	}
	if ap != c.remote {
		return true
	}
	fresh := addr // a copy, so that only this path allocates (not every call)
	c.fresh.Store(&fresh)
	return false
}

// isClosedFast reports whether shutdown has begun, without taking mu.
func (c *conn) isClosedFast() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

func (c *conn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// shutdown closes the connection once: it leaves the peer table, closes
// the QUIC connection with code, and fails receipt waiters with cause.
func (c *conn) shutdown(code quic.ApplicationErrorCode, reason string, cause error) {
	c.closeOnce.Do(func() {
		c.t.unregister(c)
		c.mu.Lock()
		c.closed = true
		c.closeErr = cause
		ws := c.waiters
		c.waiters = nil
		c.mu.Unlock()
		close(c.done)
		c.uncrowd() // after done: noteQueue looks at done after it sets crowded
		for _, w := range ws {
			w.err = cause
			w.finish()
		}
		_ = c.qc.CloseWithError(code, reason)
	})
}

// lost is shutdown after an I/O failure: the reason comes from QUIC.
func (c *conn) lost(err error) {
	select {
	case <-c.done:
		return
	default:
	}
	cause := closeCause(c.qc, err)
	if c.idle.Load() || closedIdle(cause) {
		c.t.log.Debug("peer closed an idle connection", "peer", c.peer.Name)
	} else {
		c.t.log.Info("connection lost", "peer", c.peer.Name, "err", cause)
	}

	if !errors.Is(cause, ErrConnLost) {
		cause = fmt.Errorf("%w: %w", ErrConnLost, cause)
	}
	c.shutdown(CodeNormal, "connection lost", cause)
}

// addWaiters registers receipt waiters for envs; it fails with ErrConnLost
// when the connection is already closed.
func (c *conn) addWaiters(envs []*pb.Envelope, ws []*waiter) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fmt.Errorf("%w: %w", ErrConnLost, c.closeErr)
	}
	for _, e := range envs {
		if _, dup := c.waiters[e.GetMsgId()]; dup {
			return fmt.Errorf("%w: msg id %q is already waiting for a receipt", ErrBadEnvelope, e.GetMsgId())
		}
	}
	for i, e := range envs {
		c.waiters[e.GetMsgId()] = ws[i]
	}
	return nil
}

// removeWaiters drops the waiters of envs that are still registered.
func (c *conn) removeWaiters(envs []*pb.Envelope, ws []*waiter) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, e := range envs {
		if c.waiters[e.GetMsgId()] == ws[i] {
			delete(c.waiters, e.GetMsgId())
		}
	}
}

func (c *conn) removeWaitersSilently(envs []*pb.Envelope) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range envs {
		delete(c.waiters, e.GetMsgId())
	}
}

func (c *conn) complete(rc *pb.Receipt) {
	c.mu.Lock()
	w := c.waiters[rc.GetMsgId()]
	delete(c.waiters, rc.GetMsgId())
	c.mu.Unlock()
	if w == nil {
		c.t.log.Debug("receipt without waiter (late or duplicate)", "peer", c.peer.Name, "msg_id", rc.GetMsgId())
		return
	}
	w.rc = rc
	w.finish()
}

// streamReader reads frames from one of the peer's streams within the
// connection's limits.
func (c *conn) streamReader(br *bufio.Reader, rs deadliner) *streamReader {
	return &streamReader{br: br, rs: rs, budget: c.reads, done: c.done,
		max: c.t.cfg.MaxFrameSize, timeout: c.t.cfg.FrameReadTimeout}
}

// readControl reads receipts, the names of their signers and GoAway from
// the peer's control stream.
func (c *conn) readControl(sr *streamReader) {
	defer c.t.wg.Done()
	var named names
	for {
		rc, signer, other, n, err := sr.readControlFrame()
		if err != nil {
			c.readFailed("control", err)
			return
		}
		c.stats.framesIn.Add(1)
		c.stats.bytesIn.Add(uint64(n))
		if rc != nil {
			if signer != 0 {
				if err := named.applySigner(rc, signer); err != nil {
					c.protocolError(CodeProtocol, err.Error())
					return
				}
			}
			c.complete(rc)
			continue
		}
		switch k := other.(type) {
		case *pb.Frame_SignerName:
			if err := named.addSigner(k.SignerName); err != nil {
				c.protocolError(CodeProtocol, err.Error())
				return
			}
		case *pb.Frame_Goaway:
			if quic.ApplicationErrorCode(k.Goaway.GetCode()) == CodeIdle {
				c.t.log.Debug("peer closed an idle connection", "peer", c.peer.Name)
			} else {
				c.t.log.Info("peer going away", "peer", c.peer.Name, "reason", k.Goaway.GetReason())
			}
			c.shutdown(CodeNormal, "goaway received", fmt.Errorf("%w: peer going away: %s", ErrConnLost, k.Goaway.GetReason()))
			return
		default:
			c.protocolError(CodeProtocol, fmt.Sprintf("unexpected %T on the control stream", other))
			return
		}
	}
}

// acceptStreams accepts the peer's lane streams and reads each.
func (c *conn) acceptStreams() {
	defer c.t.wg.Done()
	for {
		rs, err := c.qc.AcceptUniStream(c.qc.Context())
		if err != nil {
			c.lost(err)
			return
		}
		c.t.wg.Add(1)
		go c.readLane(rs)
	}
}

// readLane delivers the envelopes of one lane stream to the handler, in order.
func (c *conn) readLane(rs *quic.ReceiveStream) {
	defer c.t.wg.Done()
	sr := c.streamReader(bufio.NewReaderSize(rs, readBufSize), rs)
	var named names
	for {
		env, refs, other, n, err := sr.readEnvelopeFrame(c.t.cfg.MaxHeaders, c.t.cfg.MaxHeaderBytes)
		if err != nil {
			c.readFailed("lane", err)
			return
		}
		c.stats.framesIn.Add(1)
		c.stats.bytesIn.Add(uint64(n))
		if env, err = named.take(env, refs, other); err != nil {
			c.protocolError(CodeProtocol, err.Error())
			return
		}
		if env == nil {
			continue // a type, a route or an origin named
		}
		var reply func(*pb.Receipt)
		if env.GetReceipt() != pb.Envelope_RECEIPT_NONE {
			reply = c.replyFunc(env.GetMsgId())
		}
		c.t.h.HandleEnvelope(c.peer, env, reply)
	}
}

func (c *conn) readFailed(stream string, err error) {
	switch {
	case errors.Is(err, io.EOF):
		// The peer finished the stream (it sends FIN before GoAway); the
		// connection ends through the other paths.
	case errors.Is(err, ErrFrameTooLarge):
		c.protocolError(CodeFrameTooLarge, err.Error())
	case errors.Is(err, errFrameTimeout):
		c.protocolError(CodeProtocol, fmt.Sprintf("a frame on the %s stream was not complete within %v", stream, c.t.cfg.FrameReadTimeout))
	case errors.Is(err, ErrBadFrame):
		c.protocolError(CodeProtocol, err.Error())
	default:
		c.lost(err)
	}
}

// protocolError closes only this connection after bad input from the peer.
func (c *conn) protocolError(code quic.ApplicationErrorCode, reason string) {
	c.t.log.Warn("closing connection: bad input from peer", "peer", c.peer.Name, "reason", reason)
	c.shutdown(code, reason, fmt.Errorf("%w: %s", ErrConnLost, reason))
}

// replyFunc returns the reply callback for one envelope: exactly once,
// never blocking, dropping with a log when the connection is gone or busy.
func (c *conn) replyFunc(msgID string) func(*pb.Receipt) {
	var used atomic.Bool
	return func(rc *pb.Receipt) {
		if !used.CompareAndSwap(false, true) {
			c.t.log.Warn("reply called twice; ignored", "peer", c.peer.Name, "msg_id", msgID)
			return
		}
		if rc == nil {
			c.t.log.Warn("reply called with nil receipt; ignored", "peer", c.peer.Name, "msg_id", msgID)
			return
		}
		if rc.GetMsgId() != msgID {
			rc = &pb.Receipt{MsgId: msgID, Code: rc.GetCode(), RetryAfterMs: rc.GetRetryAfterMs(), Message: rc.GetMessage(), Watermark: rc.GetWatermark()}
		}
		if err := c.lanes[len(c.lanes)-1].enqueueReceipt(rc); err != nil {
			c.t.log.Warn("receipt dropped", "peer", c.peer.Name, "msg_id", msgID, "err", err)
		}
	}
}
