// Package node is meshnode's public API: one Node per device, actors with
// bounded mailboxes, and three sends.
//
//	cfg := node.DefaultConfig("n1")
//	cfg.DataDir, cfg.TLS, cfg.Join = "/var/lib/meshnode", identity, []string{"10.0.0.2:7946"}
//	n, err := node.New(cfg)
//	if err != nil { ... }
//	defer n.Close()
//
//	n.Spawn("worker", func(ctx context.Context, m *node.Message) (proto.Message, error) {
//		var job pb.Job
//		if err := m.Decode(&job); err != nil { return nil, err } // undecodable: permanent
//		return &pb.Done{}, work(ctx, &job)
//	}, node.WithMailbox(256, mailbox.DropOldest))
//
//	err = n.Tell(ctx, node.Addr("worker", "n2"), job)                  // at most once
//	err = n.Ask(ctx, node.Addr("worker", "n2"), job, &done)            // reply or error
//	out, err := n.TellReliable(ctx, node.Addr("worker", "n2"), job,   // Delivered or Queued
//		node.WithIdempotencyKey(job.Id), node.WithTTL(time.Hour))
//
// # Guarantees
//
//   - Tell: at most once, FIFO per (sender node, recipient). Returns once the
//     message is in a local mailbox or handed to the peer's connection.
//   - Ask: at most once, with a reply or a typed error (*CapacityError,
//     ErrNoSuchActor, *RemoteError, ErrUnreachable, the context's error).
//   - TellReliable: at least once; exactly-once effect per idempotency key
//     within the receiver's dedupe window. Delivered means the recipient's
//     handler returned nil; Queued means fsynced in the local outbox, from
//     which the relay delivers it, paced by the peer's AIMD limit, FIFO per
//     (sender node, recipient) across the direct and the outbox path.
//
// # Decisions (the architecture and its numbered rules: docs/architecture.md)
//
//   - Messages sent from the node API (not from inside an actor) carry the
//     sender "@node".
//   - A reliable message without a key gets "auto:<msg id>", stored with it,
//     so its retries share it. Dedupe keys are scoped by sender node and
//     recipient actor; an OVERWRITE key plus the sequence names one version,
//     so a stream of heartbeats with one key is never deduped away.
//   - Order across retries: the relay sends a recipient's queue in batches
//     chained by prev_sequence; the receiver refuses a message whose
//     predecessor failed, so a retry never lets a later message overtake.
//   - The direct attempt of TellReliable is bounded by DirectAttemptTimeout;
//     a slow handler makes the call return Queued (the key dedupes the copy).
//     Each attempt carries its own msg id; the idempotency key is the stable
//     name. A direct attempt refused as poison goes to the dead-letter queue.
//   - The idempotency key is recorded (group-committed) before PROCESSED is
//     sent. A crash between the handler's return and that commit can run the
//     handler twice: the at-least-once window no library can close without
//     the handler's effect and the key sharing one transaction.
//   - Local messages are passed by pointer, not copied: do not modify a
//     message after sending it.
package node
