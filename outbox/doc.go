// Package outbox is meshnode's durable store for reliable messages: one
// bbolt file holding per-recipient FIFO queues, the coalescing index, the
// dead-letter queue and the receiver's dedupe window, plus the per-node
// AIMD Limiter and the full-jitter backoff policy used by the relay
// (package partition).
//
// # Guarantees
//
//   - Enqueue returns only after the transaction holding the message was
//     fsynced. Concurrent callers share one transaction (group commit): a
//     single committer goroutine owns every write transaction. NoSync is
//     never used.
//   - Per-recipient FIFO: a new message always goes behind the waiting ones
//     (rule 1), even if its caller-chosen sequence is lower (it is
//     then re-sequenced).
//   - A message leaves its queue only by Ack (positive receipt), by being
//     dead-lettered (expired, permanent failure, MaxAttempts counted
//     attempts), or by being replaced by a newer OVERWRITE message. A crash
//     at any point loses nothing that Enqueue reported stored (rule 5).
//   - Expired messages are never returned by Head; they go to the DLQ with
//     reason "expired" (rule 8).
//   - Memory holds only small per-recipient state (count, head, send_at)
//     and the dedupe keys of the window, never message bodies.
//
// # Usage
//
//	s, err := outbox.Open(outbox.DefaultConfig(filepath.Join(dir, "outbox.db")))
//	if err != nil { ... }            // errors.Is(err, outbox.ErrLocked): another node owns the file
//	defer s.Close()
//	err = s.Enqueue(ctx, env)         // durable when it returns nil
//	due, next := s.DueRecipients(time.Now(), keep, 64)
//	msgs, _ := s.Head(due[0], 32)     // deliver them, then:
//	_ = s.Ack(due[0], []uint64{msgs[0].Envelope.Sequence})
//
// # Layout of the file
//
//	q/<recipient>   nested bucket: big-endian sequence -> 8-byte first_enqueued ms + StoredMessage
//	coalesce        recipient\x00key -> highest sequence seen for an OVERWRITE key
//	dlq             big-endian id -> StoredMessage (dead-letter fields set)
//	dedupe          sender\x00key -> recorded unix ms
//	meta            "seq" -> sequence high-water
//
// # Decisions (the architecture and its numbered rules: docs/architecture.md)
//
//   - Coalescing (rule 7): a newer OVERWRITE message deletes the waiting one
//     and is appended at the tail (it does not take the old one's place).
//     The coalesce index keeps the highest sequence per (recipient, key) even
//     after delivery, so an older message arriving after a newer one was
//     delivered is still dropped as superseded (EnqueueResult reports it).
//     Its entries are never pruned (one small disk record per distinct key).
//   - If a message being delivered is replaced meanwhile, the old one may
//     still arrive; its Ack is a no-op. OVERWRITE promises "the newest
//     wins", not "exactly one".
//   - Sequences are the queue keys. A zero env.Sequence is assigned at
//     commit time, so the FIFO order of concurrent callers is their commit
//     order; Enqueue writes the final sequence back into env.Sequence.
//   - If ctx ends while a caller waits for its commit, the message may still
//     be stored; retrying with the same idempotency key is safe.
//   - Defer and send_at are in memory only: after a restart every queue is
//     due at once, which is what a restarted sender should do anyway.
//   - Expiry is checked at Enqueue and when a message reaches Head. A queue
//     for a peer that is down keeps its expired messages until it is
//     looked at again; they are never delivered.
//   - DLQFilter.Reason matches by prefix; Replay and Purge with a zero Limit
//     act on every match and refuse an empty filter unless All is set (for
//     Replay too, for symmetry). Replay appends at the tail with a fresh
//     sequence and does not take part in coalescing.
//   - RecordAsync makes a key pending in memory at once (Seen is true for
//     it), joins the next group commit, and calls done from the committer
//     after that commit; a failed commit forgets the pending key. It is how
//     a receiver records keys without a goroutine per message.
//   - HeadSkip passes over given sequences (the relay's positively
//     receipted messages whose Ack is still committing), so the relay can
//     send the next batch without waiting for that fsync.
//   - Group commit lingers: after a commit the committer waits up to
//     CommitLinger (200µs) for as many callers as the last commit released
//     plus those that queued meanwhile, so looping concurrent callers share
//     one fsync instead of alternating between two half batches. It never
//     waits when there was only one caller.
//   - bbolt runs with NoFreelistSync and the hashmap freelist: every commit
//     is still fsynced, the freelist is rebuilt by scanning the file at
//     Open (slower Open for a very large file, fewer pages per commit).
//   - Close is idempotent: the first call commits what callers already
//     handed to the committer and closes the file; later calls return
//     ErrClosed, as does every other method.
package outbox
