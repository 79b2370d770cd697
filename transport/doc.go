// Package transport carries meshnode frames between nodes over QUIC with
// mutual TLS. It knows nothing of membership: a Resolver tells it where a
// node is and whether it is down, and a Handler receives envelopes.
//
// # Guarantees
//
//   - One UDP socket and one quic.Transport per node, for listening and
//     dialing. TLS 1.3 only, mutual, ALPN "meshnode/2"; a peer's name is the
//     DNS SAN of its certificate from the cluster CA, and its Hello must
//     claim that same name, the same cluster and a common protocol version,
//     else the connection is closed with a distinct application error code
//     (CodeNameMismatch, CodeIncompatible) and the dialer gets ErrIncompatible.
//   - Who is refused is counted (Refusals: identity mismatches, unknown CA,
//     no certificate, bad certificate) and logged at WARN once a minute per
//     address or peer and kind, on the refusing side: the client's
//     certificate is verified by the transport (refusals.go), not inside
//     crypto/tls, which would refuse it without a word.
//   - At most one connection per peer pair. Envelopes for one recipient
//     always use the same lane (FNV-1a of the recipient modulo Lanes, or
//     modulo the lanes the peer's Hello says its receive window is sized
//     for, if fewer), one unidirectional stream per direction, so order
//     per (sender node, recipient) holds and a slow recipient does not
//     block others.
//   - Every queue is bounded: Send returns ErrQueueFull instead of blocking,
//     and frames above MaxFrameSize are refused, on send and before
//     allocating on receive. Each side announces its MaxFrameSize in its
//     Hello, and an envelope over a peer's smaller one is refused here
//     (ErrFrameTooLarge; in a RequestBatch, an EncodeError for it alone):
//     nodes configured apart never make each other close the connection.
//     Such an entry is confirmed only by the peer's Hello during the same
//     call, a receipt of the batch on that connection, or the connection's
//     outliving MaxIdleTimeout since its limit was first doubted; otherwise
//     it also wraps ErrLimitUnconfirmed (the peer may have restarted in
//     place).
//     A receipt's text longer than the peer's limit is cut to fit.
//     A peer that announces none (an older version) is taken to share ours.
//   - Bad bytes from a peer close that connection only (CodeProtocol,
//     CodeFrameTooLarge), logged with the reason; other peers are unaffected.
//     A stream that ends inside a frame, or a frame not complete within
//     FrameReadTimeout of its first byte, is bad bytes.
//   - What a member can make this node hold while reading is bounded per
//     connection (readlimit.go): quic-go's receive window, 16 KiB per
//     received stream, MaxReadBytes of large frames in progress; an
//     envelope with more than MaxHeaders headers or MaxHeaderBytes of them
//     is refused before it is decoded.
//   - Request waiters end with the receipt, ErrConnLost when their
//     connection fails or is closed, or the context error. RequestBatch
//     tells a caller that asks (internal/queued) when the batch is queued
//     on its lane, before the receipts: a batch queued after that one for
//     the same recipient and connection reaches the peer after it.
//   - A connection that carried no frame either way for IdleConnTimeout
//     (2 min; QUIC's keep-alive PINGs do not count) is closed with a GoAway
//     of CodeIdle, never while a request waits for a receipt on it or
//     envelopes are queued on it; the next send dials again (idle.go).
//     A fleet member keeps open only the connections it uses.
//   - Close sends GoAway, closes every connection and the socket, and waits
//     for every goroutine; it is idempotent.
//
// # Usage
//
//	ca, _ := transport.NewCA("my-cluster", 10*365*24*time.Hour)
//	id, _ := ca.NewIdentity("n1")
//	cfg := transport.DefaultConfig("n1")
//	cfg.Identity = id
//	cfg.ListenAddr = "0.0.0.0:7947"
//	cfg.DataDir = "/var/lib/meshnode"
//	t, err := transport.New(cfg, resolver, handler)
//	if err != nil { ... }
//	defer t.Close()
//	err = t.Send(ctx, "n2", env)                  // tell
//	rc, err := t.Request(ctx, "n2", envWithReceipt) // wait for the receipt
//
// # Decisions (the architecture and its numbered rules: docs/architecture.md)
//
//   - Streams: each side opens a control stream first and sends its Hello
//     on it; receipts and GoAway follow on the same stream ("receipts on
//     their own lane"). Envelope lanes are opened lazily on first use. The
//     dialer speaks first; the acceptor answers only after accepting the
//     dialer's Hello, so a refused dialer learns why from the close code.
//   - Writers: one goroutine per lane. Senders encode frames on their own
//     goroutine, without a lock, into a pooled scratch buffer (so the caller
//     may reuse env as soon as Send returns), then copy them under the
//     lane's mutex into pooled 64 KiB chunks (frames of a RequestBatch are
//     contiguous); the writer takes all chunks at once and writes each with
//     one Write. No allocation per frame, and an idle lane holds no buffer.
//     After a write the writer yields its core once before waiting again:
//     callers woken together (askers released by one burst of replies)
//     then queue their frames before it runs, and one write and one QUIC
//     packet carry many of them instead of one each. PeerStats.WritesOut
//     counts the writes (FramesOut / WritesOut frames per write).
//   - Frame encoding writes the pb.Frame wrapper (oneof tag and length) by
//     hand around the envelope or receipt, computing its size once; the
//     bytes are identical to marshalling a pb.Frame. Lane readers decode
//     the envelope straight out of the frame bytes (no pb.Frame, no oneof
//     wrapper) and fall back to the generic decoder for any other form, so
//     what they accept is exactly what proto.Unmarshal accepts (fuzzed).
//   - Body types are named once per lane stream (names.go). A peer whose
//     Hello lists FeatureTypeNames reads TypeName frames (ref → type URL)
//     on its lane streams; an envelope (one a node encoded itself with
//     SendEncoded and a Body, or any the codec writes for Send, Request
//     and RequestBatch) then goes with a body that says no type and
//     Frame.body_type = ref, and the receiver puts the URL back before
//     anything else sees the envelope. A tell of 128 bytes goes from 242
//     to 196 bytes on the wire. Up to 64 types and 4 KiB of their URLs
//     per stream; others, forwarded envelopes, and everything sent to an
//     older peer, go in full.
//     A bad name or ref closes the connection (CodeProtocol).
//   - Routes are named once per lane stream too (names.go). A peer whose
//     Hello lists FeatureRouteNames reads RouteName frames (ref → sender
//     and recipient); an envelope the codec wrote with both then goes
//     without either and with Frame.route = ref, and the receiver puts
//     them back before anything else sees it. Up to 64 routes and 4 KiB
//     of their names per stream; others, forwarded envelopes, and
//     everything sent to a peer without the feature, go in full.
//   - So are forwarded envelopes' origins (names.go): to a peer whose
//     Hello lists FeatureOriginNames, an OriginName frame names an
//     origin's node, outbox id and certificate, and an envelope the codec
//     left to proto whose origin opens with them (a certificate at least)
//     goes without them and with Frame.origin = ref; its signature, its
//     own, stays. Up to 16 origins and 8 KiB of them per stream.
//   - And signed receipts' signers, on the control stream (names.go): to
//     a peer whose Hello lists FeatureSignerNames, a SignerName frame
//     names a signer's node and certificate, and a receipt whose
//     signature says both goes with neither and with Frame.signer = ref.
//     Up to 16 signers and 8 KiB of them per control stream.
//   - Envelopes have a hand-written codec (envcodec.go), because the
//     generated one was a fifth of the receiver's CPU. The encoder writes
//     proto.Marshal's bytes, with headers in sorted key order (the order
//     Deterministic uses; proto.Marshal's own order is random); an
//     envelope with unknown fields or invalid UTF-8 takes proto.Marshal.
//     The decoder copies the envelope bytes once and points every string
//     and the body value into that copy (unsafe.String over bytes never
//     written again; a handler may write into its body, whose bytes no
//     string shares, and an append to it copies), so an envelope costs two
//     allocations. A frame larger than the
//     stream's read buffer was read into a buffer of its own: then the
//     body is that buffer's bytes and the strings are small copies, so a
//     4 MiB envelope holds 4 MiB, not 8, and a kept message id does not pin
//     its body. Unknown or repeated
//     fields, wire types that do
//     not match, reordered map entries or invalid UTF-8 go to
//     proto.Unmarshal. Both directions are checked against the generated
//     code: byte equality over random envelopes (rapid) and a fuzz test
//     that compares the decoders with proto.Equal.
//   - Receipts, the other frame of every reliable delivery, are written
//     and read by hand too (receiptcodec.go), with the generic codec for
//     a signed receipt, unknown fields or invalid UTF-8; fuzzing checks
//     the bytes against the generic encoder's and the decoder against
//     proto.Unmarshal. The waiters of one RequestBatch share one counter
//     and one channel, so its caller wakes once for all its receipts; a
//     batch whose context ends returns the receipts that came, in order.
//   - SendQueueSize counts envelopes and SendQueueBytes their encoded bytes
//     queued on all lanes of a peer's connection (a 64 KiB piece leaves
//     the queue as soon as QUIC has taken it); either bound refuses with a
//     *QueueFullError, which wraps ErrQueueFull and says when to retry: the
//     time to write the excess at the rate the connection has been writing,
//     and at least as long as no write has completed (1 ms to 1 s). One
//     frame, and one batch of any count (a relay emission larger than
//     SendQueueSize), always fits an empty queue. Near the byte
//     bound a send is refused before its frame is encoded, and Admit lets
//     a caller ask before it marshals a body, so senders retrying large
//     messages cost the connection they wait for nothing. Receipts are
//     never refused for room while the peer reads them: they answer
//     envelopes already taken, and a group commit answers hundreds at once,
//     more than the peer's send queue bounds (a receipt dropped there left
//     its request waiting for its timeout on a healthy connection). Their
//     queue on the control lane holds at least 65,536 (or SendQueueSize)
//     and at most SendQueueBytes of them, counted until written; only a
//     peer that stops reading them fills it, and that connection is
//     closed (CodeProtocol), failing the peer's waiting requests at once,
//     because reply must not block.
//   - Simultaneous dials: both sides keep the connection dialed by the
//     lexically smaller node name and close the other with CodeDuplicate;
//     a dial that lost the tie-break waits for the winning connection
//     instead of failing. The node with the smaller name decides before it
//     answers the larger one's Hello (admitIncoming): with its own dial
//     past its QUIC handshake, or a live connection it dialed, it refuses
//     the incoming one unanswered, so the larger never sends on a
//     connection that is then closed under what it sent (decided after the
//     answer, those frames were lost: tells, and asks that waited out their
//     deadline). A dial that finds, after its QUIC handshake, a connection
//     of the peer's admitted or registered meanwhile is dropped before its
//     Hello (dialConn); both decisions are taken under Transport.mu, so
//     exactly one of the two connections goes on, which need not be the one
//     the smaller name dialed. A dial still in its handshake refuses
//     nothing: a node that cannot reach its peer (a NAT) is reached by the
//     peer's dial, and its own failed dial returns that connection. A node
//     setting up a peer's incoming connection waits for it instead of
//     dialing a second. Races left to the tie-break at registration fail
//     the losing connection's waiters with ErrConnLost.
//     A connection from a peer with a new boot id replaces the old one
//     (CodeReplaced), as does a second connection dialed by the same side.
//   - A connection's id is 8 bytes of its TLS exporter, the same at both
//     ends. Each Hello names the last connection with the receiver that
//     the sender no longer has (ClosePeer, idle, lost, replaced): a node
//     that still holds it as live, because its CONNECTION_CLOSE was lost
//     in a partition, replaces it with the new connection (CodeReplaced)
//     whoever dialed it, rather than keeping it by the tie-break and
//     leaving the peer's dial waiting for a connection the peer closed.
//     With a node of an earlier release, which neither sends nor reads
//     the name, the tie-break decides as before: the peer's dial fails
//     after HandshakeTimeout until the stale connection ends (within
//     MaxIdleTimeout).
//   - A connection we dialed is replaced when the Resolver returns a
//     different IP:port for the peer (it restarted elsewhere). Connections
//     the peer dialed are not judged by address (their source address need
//     not be the advertised one); the node layer calls ClosePeer when
//     membership reports a restart, and the stateless reset or idle timeout
//     catch the rest.
//   - The stateless-reset key is 32 random bytes in DataDir/quic-reset.key
//     (mode 0600, written atomically); with DataDir "" it is random per run.
//   - Send resolves the peer on every call, so a peer the Resolver reports
//     down fails with ErrUnreachable at once even if a connection is open.
//   - Handlers run on the lane's reader goroutine; a handler that blocks
//     stalls that lane only (QUIC flow control then pushes back on the
//     sender, whose queue fills and returns ErrQueueFull). Close waits for
//     handlers to return.
//   - Frames larger than a stream's read buffer (16 KiB) are written by as
//     many lanes of a connection at once as the peer's read budget holds
//     frames of the largest size sent to it (its MaxReadBytes over that
//     size, both as its Hello announced them, or ours for a peer that
//     announced none; two by default), so they never wait on each other
//     for budget at the receiver; smaller frames flow around them. A lane
//     takes a place for each large frame, in turn with the lanes waiting
//     for one. A lane none of whose bytes QUIC has sent for a second, in
//     the middle of a large frame (its recipient's handler is slow, so its
//     stream is not read), gives its place to a waiting lane; a lane merely
//     slow (a slow link or machine) keeps it, as its bytes keep going out.
//   - A reply after its connection is gone is dropped with a log.
package transport
