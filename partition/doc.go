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
//   - At most one batch per recipient is in flight, so per-recipient FIFO
//     holds; recipients never wait for each other (one goroutine per batch).
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
// # Decisions where DESIGN.md is silent
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
//     after its ack fsync: the limiter measures load on the peer. The
//     recipient stays in flight until the ack committed (FIFO, no
//     redelivery). This tripled drain throughput.
//   - Close cancels in-flight deliveries; their messages stay queued. Close
//     does not close the store and always returns nil.
package partition
