// Package partition routes outbox recipients to relay partitions (FNV-1a)
// and runs the partitioned relay that drains the outbox through a
// Deliverer.
//
// # Guarantees
//
//   - Each partition has one loop; it sleeps on a timer until the earliest
//     send_at of its recipients or a wake-up (enqueue, peer alive, a
//     finished delivery) and never busy-polls: an idle relay runs no
//     iterations (Stats.Iterations).
//   - At most one batch per recipient is awaiting receipts, so
//     per-recipient FIFO holds; recipients never wait for each other (one
//     goroutine per batch). Up to MaxAckPending fully positive batches per
//     recipient may still be committing their Ack meanwhile (pipelining).
//   - Deliveries to one node are bounded by its AIMD outbox.Limiter: +1 per
//     positive receipt, ÷2 on CAPACITY.
//   - Messages are acked only after PROCESSED or DUPLICATE receipts (rule 5).
//
// # Usage
//
//	r, err := partition.New(partition.DefaultConfig(), store, deliverer)
//	if err != nil { ... }
//	r.Start()
//	defer r.Close()
//	// from membership: r.NodeAlive("n2")
//
// # Decisions (the architecture and its numbered rules: docs/architecture.md)
//
//   - Peer down (Alive false): the recipient is deferred by DownRecheck
//     (10s) without counting anything (rule 3). NodeAlive wakes it at once
//     (rule 4); the recheck only covers a missed membership event.
//   - A batch that did not come back (nil receipt / error) while membership
//     still says the peer is alive counts as a transient failure of its
//     first message (backoff, counts toward MaxAttempts): an alive peer that
//     keeps losing batches is indistinguishable from a failing handler, and
//     not counting it could retry forever. If membership says the peer is
//     down by then, it is deferred uncounted instead.
//   - CAPACITY without retry_after_ms defers by 100ms.
//   - ACCEPTED or unknown receipt codes are treated as TRANSIENT: only
//     PROCESSED proves the handler ran.
//   - The first negative receipt of a batch decides; messages after it that
//     nevertheless came back PROCESSED/DUPLICATE are acked too, the others
//     stay queued uncounted.
//   - AIMD slots are released as soon as a batch's receipts are back, not
//     after its ack fsync: the limiter measures load on the peer.
//   - Ack pipelining: when every receipt of a batch is positive, the
//     recipient may send its next batch before that Ack has committed. The
//     acked sequences are kept in memory per recipient and skipped by
//     outbox.Store.HeadSkip; if the Ack fails they become deliverable again
//     and are redelivered (the receiver's dedupe answers DUPLICATE, since
//     it recorded their keys before sending PROCESSED). After any
//     non-positive receipt or a lost batch the recipient waits, as before,
//     until the failure and the acks are recorded, so the next batch starts
//     with the failed message and PrevSequence 0.
//   - No second unreceipted batch per recipient, even chained: the
//     receiver's chain rule detects a failed predecessor, not a missing
//     one. If batch k is lost with a broken connection and batch k+1
//     (PrevSequence = last of k) arrives on a new one, nothing marks the
//     chain broken and k+1 would be processed before k. Order would not be
//     provable, so the depth of unreceipted batches is fixed at one.
//   - The AIMD limit (default max 100 in-flight messages per node) bounds
//     a single recipient's drain to about 100 messages per round trip,
//     where a round trip includes the receiver's dedupe fsync (about 4.5
//     ms on the 2-core test machine: ~22k msgs/s). 100k msgs/s to one
//     recipient would need about 450 messages in flight (rate × round
//     trip); the default maximum of 100 is kept, so that is not reached.
//   - Close cancels in-flight deliveries; their messages stay queued. Close
//     does not close the store and always returns nil.
package partition
