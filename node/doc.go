// Package node is meshnode's public API: one Node per device, actors with
// bounded mailboxes, and three sends. docs/architecture.md in the
// repository shows how the packages underneath fit together.
//
// # Typed services
//
// Define a service in a .proto file and generate its client and server
// with protoc-gen-meshnode (make generate; examples/device is a complete
// application with its tests):
//
//	cfg := node.DefaultConfig("device-1")
//	cfg.DataDir, cfg.TLS, cfg.Join = "/var/lib/meshnode", identity, []string{"10.0.0.2:7946"}
//	n, err := node.Open(cfg) // not visible to the cluster yet
//	if err != nil { ... }
//	mux := node.NewServiceMux()
//	devicepb.RegisterDeviceCommandsServer(mux, dev) // dev implements DeviceCommandsServer
//	n.Spawn("commands", mux.Serve)
//	err = n.Start(ctx)                              // joins, with its actors in place
//	defer n.Shutdown(ctx)                           // drains the mailboxes, then leaves
//
//	// on the operator's node: each method in the three sends
//	c := devicepb.NewDeviceCommandsClient(op, node.Addr("commands", "device-1"))
//	res, err := c.Run(ctx, cmd)                     // Ask: the result or a typed error
//	err = c.RunTell(ctx, cmd)                       // Tell: at most once
//	out, err := c.RunReliable(ctx, cmd,             // TellReliable: runs once, even after hours offline,
//		node.WithReplyTo(node.Addr("replies", op.Name())), // and its result comes back to "replies"
//		node.WithCorrelationID(cmd.GetId()))               // with the command's id
//
// The "replies" actor is a ServiceMux with the generated
// RegisterDeviceCommandsReplies, which calls RunReply(ctx, correlationID,
// result, err) once per request. An unknown method is answered with
// ErrUnknownMethod (permanent: a reliable one is dead-lettered, not
// retried).
//
// # Configuration
//
// DefaultConfig sets every field. The top-level fields (Name, Cluster,
// DataDir, addresses, Join, GossipKey, TLS, Logger) are the one source of
// what they set: the node copies them into the embedded configs of the
// layers below (Mesh, Transport, Outbox, Relay, Responses), which hold only
// tuning. The embedded fields the node sets are listed on Config; they are
// zero in DefaultConfig, and Validate refuses one set to another value
// instead of overwriting it. Mesh.OnEvent is chained after the node's own
// reaction. Validate checks the whole tree: every failure wraps
// ErrBadConfig, and a sub-config's also wraps its package's sentinel
// (errors.Is(err, outbox.ErrBadConfig)), in a message that reads once:
// "node: bad config: Outbox: MaxBatch must be >= 1".
//
// Logs: a nil Logger discards them, as in every package of the module.
// Each line carries node=Name once and component=node, mesh, transport,
// outbox or relay (memberlist's own lines add lib=memberlist).
//
// # Untyped sends
//
// The same sends take any proto.Message, for dynamic use:
//
//	n.Spawn("worker", func(ctx context.Context, m *node.Message) (proto.Message, error) {
//		var job pb.Job
//		if err := m.Decode(&job); err != nil { return nil, err } // undecodable: permanent
//		return &pb.Done{}, work(ctx, &job)
//	}, node.WithMailbox(256, mailbox.DropOldest))
//
//	err = n.Tell(ctx, node.Addr("worker", "n2"), job)                  // at most once
//	err = n.Ask(ctx, node.Addr("worker", "n2"), job, &done)            // reply or error
//	out, err := n.TellReliable(ctx, node.Addr("worker", "n2"), job,   // Delivered, Queued or DeadLettered
//		node.WithTTL(time.Hour))
//
// A handler's *Message, its Envelope() and the envelope's parts are valid
// only during the call: a tell's or an ask's are reused for a later message
// once the handler returns (they were most of what a message allocated).
// What the handler reads from them stays valid: strings, the body's bytes,
// the headers map, a message decoded with Decode (and, on this node, the
// sender's own value that Body returns).
//
// # Around every send
//
//   - Headers (WithHeaders), a type (WithType) and a method (WithMethod)
//     go with every send; the reliable-only options on Tell or Ask are
//     ErrBadOption.
//   - The caller's deadline bounds the handler's context for Tell and Ask,
//     across the wire as the time left; on this node the handler also sees
//     the caller's context values (not its cancellation: a Tell returns
//     before its handler runs). A message whose deadline passed while it
//     waited in a mailbox is not run (Stats.Expired). A reliable message,
//     perhaps delivered hours later, has its TTL and HandlerTimeout.
//   - Config.ClientInterceptors run around every Tell, Ask and
//     TellReliable, Config.ServerInterceptors around every handler run,
//     the first outermost; a no-op interceptor costs about 10 ns.
//     metrics.Calls are such interceptors.
//   - Config.TracerProvider makes a span per send and per handler run and
//     carries W3C trace context (and baggage) in the headers, so one trace
//     spans the nodes a request crosses; without it nothing is added.
//
// # Membership and lifecycle
//
//   - MemberEvents (a channel) and Config.Mesh.OnEvent (a callback, run
//     after the node's own reaction, on a goroutine of its own) report
//     join, alive, suspect, dead, left, restart and update. Neither can
//     block gossip: a subscriber that does not keep up loses events,
//     counted in the next event's Missed. Config.Tags and SetTags gossip
//     member tags (Member.Tags), checked against memberlist's 512 bytes.
//   - Open, Spawn, Start puts actors in place before the cluster sees the
//     node. Shutdown(ctx) stops accepting, drains the mailboxes and leaves;
//     Close is the fast path. Either way a tell still queued is counted as
//     dropped and a reliable message not yet handled is sent again.
//
// node/nodetest starts clusters of real nodes in one process for an
// application's tests.
//
// # Guarantees
//
//   - Tell: at most once, FIFO per (sender node, recipient). Returns once the
//     message is in a local mailbox or handed to the peer's connection.
//   - Ask: at most once, with a reply or a typed error (*CapacityError,
//     ErrNoSuchActor, *RemoteError, ErrUnreachable, the context's error).
//   - TellReliable: at least once delivery with an exactly-once effect per
//     stream, in the order sent. A stream is the flow of reliable messages
//     from one sender outbox to one actor. Delivered means the recipient's
//     handler returned nil; Queued means fsynced in the local outbox, from
//     which the relay delivers it, paced by the peer's AIMD limit; it waits
//     there while the peer is down, across restarts of either side, until
//     its TTL (or, without one, 23 days).
//   - TellReliableAsync: TellReliable without waiting and without a direct
//     attempt, for producers that pipeline. Its Pending resolves Queued only
//     after the fsync of the commit that holds the message, so many messages
//     share one fsync; one goroutine's messages to a recipient keep their
//     call order. After that, the guarantees are TellReliable's.
//   - Exactly once: the receiver keeps a durable watermark per stream (the
//     highest sequence whose handler succeeded) and never runs a message at
//     or below it, however long the sender kept it, whatever the clocks do.
//     It never runs a message whose predecessor in the stream has not run
//     (unless the sender gave that one up: poison, expired, dropped).
//   - Nothing healthy is dead-lettered: only a handler's own failures (or
//     "no such actor" after the receiver's SpawnGrace) count toward
//     MaxAttempts; a full peer, a lost receipt, a full send queue, a peer
//     down, a receiver whose disk refuses to record the outcome are waited
//     out. A receiver whose store stopped (its disk failed a sync) runs no
//     reliable message until it restarts, since it could not record the
//     outcome and would run it again after; it is waited out the same way.
//     It still answers copies of messages at or below its durable
//     watermark DUPLICATE, so that what ran is not given up as unknown.
//     A message too large for the wire is refused at
//     the call with ErrTooLarge; with forwarding on, so is one too large to
//     go through a forwarder with its origin (certificate and signature),
//     which would otherwise hold its stream for as long as the direct path
//     fails.
//   - A disk that fails an outbox commit after writing it (its fsync)
//     stops the outbox until the node restarts: TellReliable and
//     TellReliableAsync return ErrStoreFailed (a message whose commit
//     failed this way may still be delivered after the restart), the
//     relay sends nothing more, the node runs no reliable message,
//     Outbox().Err says why, and the daemon's /readyz and /healthz fail.
//     The restart reads what the file holds.
//   - A peer that membership holds alive but that this node cannot reach
//     (a partial partition: gossip reaches it through others) gets its
//     reliable messages through another member that can, one hop, with
//     the same guarantees: the recipient runs them as this node's, in
//     their stream's order, once. See Forwarding below.
//   - WithIdempotencyKey is for the application's own retries (it called
//     TellReliable twice for one thing, say after a crash): a key runs once
//     per (sender node, recipient) within the receiver's key window (24 h by
//     default), kept on disk.
//
// # What is outside the guarantees
//
//   - The crash window: a receiver that crashes after a handler returned
//     and before the watermark covering it was committed runs that handler
//     again when the message is redelivered. PROCESSED is only sent after
//     the commit, so the sender never acks such a message; but the effect
//     is exactly once only for handlers that store Message.Stream() and
//     Message.Sequence() with their own effects (in the same transaction)
//     and skip what they have seen, or whose effects die with the node.
//     Such a handler should also be spawned WithApplied, so that the
//     stream's receipts report what it applied: a sender restored from a
//     backup then learns that those sequences ran, instead of sending new
//     messages under sequences the handler would skip as copies.
//   - A receiver restored from a backup keeps order (streams restart from
//     their senders' frontiers and acknowledged messages are never resent)
//     but loses the effects and the key window since the backup.
//   - A sender whose outbox.db alone was restored from a backup hands out no
//     sequence again: outbox.db.seq beside the file records the highest one
//     reserved, and the restored file continues above it; messages queued in
//     the backup and delivered after it may run again. Each block of
//     sequences also starts no lower than the wall clock in microseconds
//     (an outbox hands out far fewer than a million a second, so its
//     sequences stay below the clock, but for the rest of a block, at
//     most 65 ms, that each start skips): a sender restored with an older
//     outbox.db.seq too (the whole data directory from a backup) hands out
//     no sequence again either, when its clock is later than it read when
//     the sender last ran. Only one whose clock is behind (a device without
//     a battery-backed clock, before its first time sync, or a clock that
//     ran fast and was set back) reuses sequences in such a restore. It finds out from the receiver and starts a new
//     epoch of the stream (messages it had sent after the backup and that
//     ran are unknown to it, and anything still queued in the backup runs
//     again). The receiver keeps a digest of the message at its watermark
//     (what its sender stored: creation time, correlation id, type, key and
//     body) and answers another message under the watermark's sequence
//     DIVERGED (Stats.Diverged), not run, with every later one of the
//     stream, also when its mailbox has no room for it or drops it for a
//     newer message (DropOldest); the answer waits
//     until the stream's mark of divergence is on disk (CAPACITY while
//     the disk refuses it). A message refused for room above the
//     watermark, or answered by the actor without its effect, is kept in
//     memory by its digest until the watermark passes its sequence:
//     another message moving the watermark there (the old sender's,
//     queued or running when the restored one's was refused) marks the
//     stream so too. Every receipt that
//     answers a message without running it (a copy, out of order, refused
//     for room) gives the watermark with that digest (kept for the newest
//     watermark and the durable one). The sender compares the digest with
//     the message it holds under that sequence, in the emission or in its
//     outbox: another message, or one for another recipient, is a
//     restore, even when the emission stopped below the watermark. A
//     watermark above everything the stream sent, or between two messages
//     of an emission and none of them, is one too. Not found out: a
//     watermark whose sequence has left the restored outbox while the
//     stream counts it as sent (the stream's own message there replaced
//     or given up before it was sent; or, after a restart of the sender,
//     which counts everything stored as sent, a message for another actor
//     that was delivered), and a restore on top of a handler record ahead
//     of the watermark (WithApplied) whose sequence the emission holds;
//     their reused sequences below are counted delivered without running.
//     Receipts that come through a forwarder carry no digest (an origin of
//     an older release could not check it): there the watermark alone
//     tells. A first emission refused as full is found out from its
//     refusals (CAPACITY for room carries the stream's watermark), one
//     refused because the actor was not back yet (NO_SUCH_ACTOR) from the
//     next emission. So on such a device restore outbox.db alone, keeping
//     outbox.db.seq, or start the node with an empty outbox: a new outbox
//     id begins new streams at every peer, and nothing is mistaken for a
//     duplicate.
//   - A message given up after it was sent (its TTL plus MaxClockSkew ran
//     out without a receipt) may have run: its dead letter says "outcome
//     unknown", as does one given up for its age (older than the retention
//     limit) after it was sent. So does one given up (expired, failed or
//     rejected) while a copy sent through a forwarder got no answer: the
//     forwarder may still hold that copy, which runs if it arrives.
//   - A restart within one boot of the machine counts the time the node
//     was stopped on the boot's clock (on Linux), whatever the wall clock
//     did meanwhile. Across a reboot, a wall-clock difference counts as
//     elapsed time only up to Outbox.MaxDowntime (a day by default), so
//     that a clock stepped by years neither expires every message nor
//     keeps them for ever: a device off for a week counts a day of it
//     against its messages' TTLs (and logs a warning). If a sender really
//     was off longer than MaxDowntime plus the outbox's RetentionMargin (8
//     days by default), a message it had sent just before it stopped,
//     whose receipt was lost, may reach a receiver that has forgotten the
//     stream (receivers forget a stream 30 days after its watermark last
//     moved). The receiver keeps
//     the highest watermark it forgot per sender outbox and epoch and
//     answers such a message FORGOTTEN instead of running it again; the
//     sender dead-letters it with outbox.ReasonForgotten ("outcome
//     unknown"). Devices that keep good time may raise MaxDowntime, so
//     that fewer messages end there.
//
// # Forwarding
//
// When the direct path to a live peer fails (Relay.Forward), the relay
// sends its reliable messages through a forwarder: an alive member that
// advertises FeatureForward, to a recipient that does too. This node signs
// each forwarded envelope with its certificate's key (Envelope.origin,
// over a canonical digest of its fields); the forwarder carries only a
// member's own envelopes, stores nothing and passes the receipts back
// unchanged; the recipient verifies the certificate (cluster CA, names
// origin.node) and the signature, then treats the message exactly as if
// the origin had sent it directly (stream, order, dedupe, claims,
// Message.From, replies), and signs its receipts. This node acts only on
// receipts the recipient signed, so a forwarder can neither make it ack
// a message nor dead-letter one; an origin that does not verify is
// refused without a verdict (the sender tries another forwarder) and
// counted in Stats.Forward.Refused. Only reliable messages are forwarded.
// With no forwarder, messages wait as before. Node.Routes shows which
// peers are forwarded now; Relay.Forward.After 0 opts the node out
// (neither forwarding nor forwarded to). docs/threat-model.md says what a
// forwarder can and cannot do (it can read what it carries).
//
// # Decisions
//
//   - Messages sent from the node API (not from inside an actor) carry the
//     sender "@node". The node part of a received message's sender is the
//     peer verified by TLS (Message.From): an envelope naming another node
//     as its sender, or a request whose reply_to names another node, is
//     refused and counted (Stats.SenderMismatch), never run. A response is
//     taken only from the node that was asked, and a request is answered
//     only to the node that sent it. docs/threat-model.md says what a
//     member can and cannot do to another.
//   - The direct attempt of TellReliable is bounded by the relay's
//     DirectTimeout (2 s); a slower handler makes the call return Queued
//     (the watermark recognises the copy if it ran). Each send of a message
//     carries its own msg id; the sequence is the message's stable name.
//   - A NO_SUCH_ACTOR answer while the receiver is within its SpawnGrace (2
//     min after Start) tells the sender to wait, uncounted. A copy of a
//     message that ran before its actor stopped (its receipt lost) is
//     answered DUPLICATE from the stream's durable watermark, not
//     NO_SUCH_ACTOR: the sender counts it delivered.
//   - While reliable messages are queued in an actor's mailbox, or one
//     refused or dropped for room is expected back (for twice the retry
//     hint it was given and a second more), tells and asks to that actor
//     take at most half of its mailbox (at least one message), leave room
//     in bytes for the one expected back, and under DropOldest evict
//     nothing: a flood of tells cannot starve a stream, nor reliable
//     traffic the tells.
//   - Local messages are passed by pointer, not copied: do not modify a
//     message after sending it.
//   - A reliable request's reply (WithReplyTo) goes only to an actor of the
//     node that sent the request, as TLS verified it. It is stored in the
//     responder's outbox before the request's watermark moves, under an
//     idempotency key made from the correlation id, so a request re-run in
//     the crash window still gives one reply at the requester. A reply the
//     disk refuses (full) is kept in memory and the request is not
//     acknowledged (answered CAPACITY, as a watermark the disk refuses:
//     it ran); the copy its sender sends again stores that reply
//     instead of running the handler again (only a copy of that request:
//     another message at its place runs). Kept replies are bounded (1,024
//     and 16 MiB in all, a quarter of each per requesting node, dropped
//     when their request has not come back for an hour) and lost on a restart: past a bound, or after a restart,
//     the request runs again when it comes back.
//   - Memory held for another node is bounded in bytes and charged to it:
//     each mailbox holds at most MailboxBytes (WithMailboxBytes) besides its
//     count, all mailboxes together at most PeerQueuedBytes of one peer's
//     messages (past it the peer is answered "full", others still get
//     in), ask responses without a waiter at most Responses.EarlyBytesPerPeer
//     of one peer's for Responses.EarlyTTL, and the transport bounds what a
//     connection reads (transport.Config.MaxReadBytes, FrameReadTimeout,
//     MaxHeaders).
package node
