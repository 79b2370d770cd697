// Package partition is the sending side of meshnode's reliable streams:
// the Relay, which owns every decision about a reliable message between
// the caller and the receiver's verdict, over the durable store of package
// outbox and a Deliverer (the network).
//
// A stream is the ordered flow of reliable messages from this node's
// outbox to one recipient actor. The relay numbers its messages (sequences
// from the store), chooses between a direct attempt and the outbox, sends
// each stream in order, reads the receiver's verdicts, decides what counts
// against a message, and paces every peer node with an AIMD limiter.
// Recipients are spread over Partitions loops by FNV-1a (PartitionOf).
//
// # Guarantees
//
//   - Per-stream order: a stream's messages are sent in sequence order, in
//     emissions (one Deliver call each) whose first message has
//     prev_sequence 0 and whose others name the message before them, so
//     the receiver never runs a message after a later one. A sequence still
//     being stored holds back every higher one of its stream
//     (HeadRequest.Below); the stream waits for that commit rather than
//     polling.
//   - At most two emissions per stream await their receipts. While one
//     does, the stream's next emission is read ahead, and sent once the
//     Deliverer says the first is queued on its path (internal/queued:
//     the transport and local delivery do), its first message naming the
//     first's last: the receiver runs none of it unless all of the first
//     ran. Its receipts are read only if the first's were all positive;
//     otherwise they are dropped like lost ones and the stream waits for
//     it to come back. A watermark of the second in the first's receipts
//     is one the stream set. Only a stream that has had an emission come
//     back clean since it was loaded (or since its epoch began) sends
//     early: a restored sender shows in its first emission, which goes
//     alone, where a watermark of a sequence sent early, its receipts
//     lost, could not be told from one of its own. Emissions of a drain
//     are then half of BatchSize.
//     When all an emission's receipts are positive, the next may go while
//     its Ack still commits (up to MaxAckPending of them), starting after
//     the acked messages; otherwise the stream waits until the verdict and
//     the acks are recorded and starts again from its frontier.
//   - Send makes a direct attempt only when the stream is settled: nothing
//     of it stored, being stored, sent or being acked. Meanwhile later
//     Sends of the stream are stored and nothing of it is emitted. An
//     attempt without a final verdict stores the message under the same
//     sequence, so the receiver recognises a copy that already ran.
//   - Only the receiver's verdict on the message itself counts toward
//     MaxAttempts: TRANSIENT (the handler failed) and NO_SUCH_ACTOR without
//     retry_after. Capacity, a lost receipt or connection, a full local
//     send queue (ErrCongested; a *CongestedError's RetryAfter is
//     waited out before the stream's next emission), a down peer, OUT_OF_ORDER (sent again at
//     once from the frontier), NO_SUCH_ACTOR within the spawn grace, and
//     codes this build does not know are deferred and never counted: a
//     healthy message does not reach the dead-letter queue.
//   - PROCESSED and DUPLICATE ack. An Ack whose commit fails (a full or
//     failing disk) is retried by the sweeper, backing off from 100 ms to
//     10 s; until it commits its messages are neither sent again nor
//     given up at their TTL (the receiver ran them), and the stream stops
//     once MaxAckPending of its Acks wait.
//   - REJECTED and an envelope the Deliverer
//     could not put on the wire (*UnsendableError: only that one; the rest
//     of the emission is sent) are dead-lettered as poison; EXPIRED as
//     expired.
//   - A DUPLICATE or OUT_OF_ORDER whose watermark is above both everything
//     the stream emitted before and the message itself means this sender's
//     state went back (a restored backup): the stream starts a new random
//     epoch (Stats.Restores) and nothing more of that emission is acked.
//     So does a watermark between two of the emission's messages, above
//     everything the stream emitted before, that is none of them (the
//     restored outbox gave that sequence to another recipient's message).
//     So does DIVERGED anywhere in an emission (the receiver ran another
//     message under the sequence of its watermark): then nothing of the
//     emission is acked but what came back PROCESSED.
//   - FORGOTTEN (the receiver forgot the stream, idle past its retention,
//     and the message is older than what it forgot) dead-letters a message
//     that was on the wire before with outbox.ReasonForgotten: it may have
//     run, and sending it again could run it twice. On a message never
//     sent before it can only mean this outbox's sequences went back: a
//     new epoch, as above.
//   - "Emitted before" counts what may have run: messages whose receipts
//     said they did not (NO_SUCH_ACTOR, OUT_OF_ORDER, EXPIRED, which
//     package node answers only for a message it did not run), in the
//     last emission the stream sent, do not count, as if never sent. A
//     restored sender whose first emission was refused that way (its
//     receiver back before the actor) still finds out from the next. Not
//     CAPACITY: a receiver whose disk refused the watermark or the reply
//     of a message that ran answers it CAPACITY too. A CAPACITY refusal
//     for room carries the stream's watermark (that one has none), judged
//     as a DUPLICATE's: a restored sender whose first emission met a full
//     receiver finds out from it.
//   - Messages in flight to a node never exceed its AIMD limit: +1 per
//     positive receipt, halved once per emission refused for capacity.
//   - A peer alive in membership that emissions cannot reach (ErrUnreachable
//     from the Deliverer, Forward.After times in a row) is sent to through
//     a forwarder when the Deliverer is a Router: emissions keep their
//     order and rules, only the path changes; a forwarder whose emissions
//     bring no receipt twice in a row is replaced by the next; with none,
//     the stream waits as for a down peer (deferred, uncounted). While
//     forwarded, Send makes no direct attempt, and a fresh direct
//     connection is tried every Forward.Probe while there is traffic; when
//     it works the streams go direct again (Routes, Stats.Forwarded,
//     Stats.Reroutes).
//   - An idle relay does no work (Stats.Iterations stays flat): loops sleep
//     until the earliest send_at or a wake-up (enqueue, NodeAlive, the end
//     of an emission or of a commit they wait for). A sweeper gives up
//     expired messages also while their peer is down.
//   - Close cancels emissions and direct attempts in flight and waits for
//     the relay's goroutines; their messages stay queued with nothing
//     counted against them. It does not close the store.
//
// # Usage
//
//	r, err := partition.New(partition.DefaultConfig(), store, deliverer)
//	if err != nil { ... }
//	r.Start()
//	defer r.Close()
//	res, err := r.Send(ctx, sm, true) // Delivered, Queued or DeadLettered
//	// from membership: r.NodeAlive("n2"), r.ForgetPeer("n3")
//
// # Decisions
//
//   - One owner per decision: a stream's mutex serialises its sequence
//     reservations, the choice of path and the start of its emissions;
//     verdicts are judged in one place (judge) from the receipts alone.
//     Replay in the store takes its sequences from the relay (it is the
//     store's Sequencer), so a replayed message is held back and holds
//     back like any other being stored; and the relay hands a replay its
//     sequence only once the sends being stored below it are committed,
//     so that the coalesce index the replay's commit checks knows every
//     version those sends carry. A direct attempt of an OVERWRITE message
//     notes its version in that index under the stream's mutex, before
//     anything of it is sent.
//   - The receiver decides duplicates and order from its persisted
//     watermark; the sender keeps only what it needs to chain emissions and
//     to recognise a watermark it cannot have caused (the emitted
//     high-water, reloaded from the store's stream record after a
//     restart). A stream is kept in memory only while something of it is
//     unresolved or deferred.
//   - A peer that membership reports down is deferred by DownRecheck;
//     NodeAlive makes its queues due at once. Other deferrals back off with
//     full jitter (Backoff), at least retry_after when the receiver gave one
//     (a minute at most: the receiver's word, which must not park a stream);
//     the first deferral after progress waits only the receiver's hint when
//     it gave one (the AIMD limit has halved already).
//   - AIMD slots are released when an emission's receipts are back, not
//     after its Ack's fsync: the limiter measures load on the peer.
//   - DeliverTimeout bounds an emission's wait for receipts, so a receipt
//     lost on a live connection cannot hold a stream (and its peer's slots)
//     for ever; DirectTimeout bounds the caller's wait in Send.
//   - The choice of path per peer has one owner, routes (route.go): it is
//     derived from what emissions report (a receipt resets it; an
//     unreachable peer that membership holds alive counts toward
//     Forward.After; a forwarder without receipts is rotated), under its
//     own mutex, which no other relay lock is held with; under it only the
//     Deliverer's Alive and Forwarders are asked (fast, non-blocking).
//   - Finding what to send costs O(log n) per recipient found, not a walk
//     of every due recipient (scan.go): the store indexes due queues per
//     node (a btree of nodes by their earliest send_at, each with a btree
//     of its queues), and a node at its AIMD limit is excluded from the
//     scans as a whole (outbox.Store.ExcludeNode) until the release of its
//     slots includes it again; the loops are woken then anyway. With a
//     thousand peers full, a wake-up no longer walks their queues only to
//     skip them. A node is excluded only while it holds slots, and the
//     check of its limiter and the exclusion are one step under xmu, so
//     the last release always includes it.
//   - ForgetPeer drops a departed peer's limiter, route and streams, and
//     refuses while anything is queued or in flight to it; the node calls
//     it a grace period after membership reported the peer gone. The
//     relay's maps are rebuilt smaller once they fall to a quarter of
//     their peak (shrink.go), so churn does not leave them at their
//     largest.
//   - Lock order: stream.mu, then xmu, then the store's locks, then part.mu
//     (the loops' filter runs under the store's read lock and looks
//     streams up).
package partition
