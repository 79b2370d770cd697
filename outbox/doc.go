// Package outbox is meshnode's durable store for reliable streams, one
// bbolt file per node holding both ends of them: on the sending side the
// per-recipient queues, the coalescing index, the expiry index and the
// dead-letter queue; on the receiving side one watermark per stream and
// the window of application idempotency keys.
//
// The store executes; it decides nothing about delivery. What is due,
// whether a failure counts, when a message has expired and which sequence
// a message gets are decided by the relay (package partition), which calls
// Head, Ack, Fail, Expire, Defer and Sequencer.Reserve accordingly.
//
// # Guarantees
//
//   - Every write returns only after the transaction holding it was
//     fsynced. One committer goroutine owns every write transaction and
//     lets concurrent callers share one (group commit); NoSync is never
//     used. A transaction holds at most MaxBatch records and about
//     MaxBatchBytes of message bytes: fan-outs, drops and replays are cut
//     into several, and the dead-letter queue is replayed or purged in
//     pages of a few hundred records.
//   - ReserveSequence returns sequences above every sequence this file
//     ever handed out, across crashes and whatever the wall clock does:
//     the high-water is reserved durably in blocks of SequenceBlock before
//     any of a block is returned. It is recorded beside the file too
//     (outbox.db.seq, before the file's own record), so a file restored
//     from a backup continues above what it handed out since, as long as
//     that record was kept: no sequence peers may have run goes to
//     another message. A record the disk refuses is logged, not fatal.
//     Each block also starts no lower than the wall clock in microseconds
//     since 1970, and is at most 65,536 long while the clock is set: far
//     fewer than a million sequences go out a second, so they stay below
//     the clock but for the rest of a block each start skips (at most
//     65 ms ahead of it, for each start sooner than that after the one
//     before), and a file restored together with that record, once the
//     clock is later than it read while the file was last open, still
//     continues above what it handed out. A clock before 1970 (one that
//     was never set) puts no floor under them; one that ran fast and was
//     set back is behind as far.
//   - A message is stored at its envelope's sequence and never renumbered;
//     a queue is ordered by sequence, also when a lower sequence is stored
//     after a higher one. It leaves its queue only by Ack, by replacement
//     with a newer OVERWRITE version, or into the dead-letter queue (Fail,
//     Expire, DropQueue, or Head giving it up for age).
//   - Head never returns a message whose TTL or age has run out, and what
//     it returns is a prefix of the queue as it stood at one moment:
//     commits running meanwhile never make it skip a waiting message and
//     return one behind it (a commit that keeps changing the queue below
//     what it read may make the prefix shorter than Max).
//   - Sequences run from 1 to MaxSequence; Enqueue refuses others, and
//     Open sets aside a stored record above it, so the sequences handed
//     out after a restart never run out.
//   - The file is checked before bbolt reads it (internal/storecheck): a
//     damaged structure is refused with ErrDamaged instead of crashing the
//     process; a file that disappeared or was emptied while outbox.db.id
//     records the outbox's id is refused with ErrLost instead of starting
//     empty; another outbox's file with ErrReplaced. The structure is
//     checked at every Open (about as long as bbolt's own scan of the file
//     at open), the key order too when outbox.db.clean, written by Close and
//     removed by Open, is missing: the last run did not end cleanly. The
//     errors name `meshnode doctor`, which salvages or accepts the loss.
//   - A receiver's watermark never goes back, and is durable together
//     with the keys that took effect with it (one transaction).
//   - Memory holds small per-queue state (count, head, send_at), each
//     queue's order (about 4 bytes per queued message) and the keys of stream
//     commits not yet committed; never message bodies, watermarks or the
//     key window.
//
// # Usage
//
//	s, err := outbox.Open(outbox.DefaultConfig(filepath.Join(dir, "outbox.db")))
//	if err != nil { ... }         // errors.Is(err, outbox.ErrLocked): another node owns the file
//	defer s.Close()
//	seq, _ := s.ReserveSequence()
//	sm.Envelope.Sequence = seq
//	_, err = s.Enqueue(ctx, sm)    // durable when it returns nil
//	msgs, _, _ := s.Head(outbox.HeadRequest{Recipient: r, Max: 64})
//	_ = s.Ack(r, []uint64{msgs[0].GetEnvelope().GetSequence()})
//
// # Layout of the file
//
//	meta              "format" (3), "seq" (reserved high-water), "outbox_id" (16 random bytes),
//	                  "clock" (elapsed ms and wall ms of the last checkpoint), "forwarded"
//	                  (MarkForwarding's mark; absent until a relay forwarded)
//	m                 8-byte sequence -> header + StoredMessage: every queue's records in one
//	                  bucket; the header (created elapsed ms, TTL deadline elapsed ms, flags,
//	                  recipient) lets the committer keep its indexes, and Open rebuild the
//	                  queues, without decoding the message
//	out               recipient -> OutStream (epoch, high-water, persisted send_at)
//	exp               TTL deadline ms | sequence | recipient -> nothing: the expiry index
//	coalesce          recipient NUL coalesce key -> newest version's sequence | last change ms
//	dlq               8-byte id -> StoredMessage with the dead-letter fields set
//	in                StreamKey -> watermark | last change ms
//	indigest          StreamKey -> watermark | digest of the message at it (absent, or another watermark: unknown)
//	forgot            sender part of a StreamKey (node, outbox id, epoch) -> highest watermark forgotten
//	keys              ScopedKey -> recorded ms;  keyage: recorded ms | ScopedKey -> nothing
//
// Every time in the file is on the elapsed clock except the fields named
// unix_ms, which are for operators.
//
// # Decisions
//
//   - Layout: the records of every queue share one bucket keyed by the
//     outbox-wide sequence, and each queue's order is kept in memory
//     (rebuilt at Open by one scan). Sequences grow across all queues, so
//     a commit appending to many recipients writes the same few pages at
//     the bucket's end as a commit appending to one. Format 2 kept a
//     bucket per recipient: a commit touching k recipients wrote about two
//     pages for each (their last leaf and their root), which made 64
//     callers to 64 recipients 2–3 times slower than to one.
//   - Time: ages, TTLs, deferrals, the key window and stream retention are
//     measured on an elapsed clock: the monotonic clock while the store is
//     open; across a restart within one boot of the machine, the same
//     clock (on Linux the kernel's boot id and CLOCK_MONOTONIC, kept with
//     the checkpoint), which no wall-clock step moves and which leaves time
//     suspended out, running or stopped; across a reboot, the
//     wall-clock difference clamped to [0, MaxDowntime]. A wall clock
//     stepped by years neither expires every message nor stops ages from
//     counting, and one stepped while the node restarts (NTP on a device
//     without a real-time clock) makes up no time: a day of made-up
//     downtime would expire healthy messages and forget the idempotency
//     keys of the last day. It is checkpointed with every commit and every
//     CheckpointInterval while idle.
//   - Expiry: a message whose TTL ran out and that was never on the wire
//     (sequence above HeadRequest.EmittedHW) is given up at once; one that
//     may have been is given up only after TTL + MaxClockSkew, since the
//     receiver counts the TTL from the arrival of a copy. Meanwhile Head
//     stops before it and returns when to look again, so nothing behind
//     it overtakes it. A message older than MaxAge (StreamRetention -
//     RetentionMargin) is given up too, so no sender holds a message for
//     a stream its receiver may already have forgotten (ReasonTooOld, or
//     ReasonTooOldUnknown when it was sent: TooOldReason). ExpiryCandidates
//     serves the relay's sweeper, which expires messages of queues nobody
//     reads (a peer that is down): it lists each at its TTL deadline, and
//     the relay gives up one never sent at once and one that was sent
//     MaxClockSkew later; ExpiryCandidatesAfter lets it go on past
//     candidates it cannot give up yet, however many.
//   - Coalescing: a newer OVERWRITE version replaces the waiting one and
//     sits at its own (newer) sequence; an older version arriving later is
//     dropped as Superseded. The index entry outlives the delivery, and
//     versions never queued are in it too: NoteVersion adds one durably
//     before it is delivered without being stored (a direct attempt; the
//     message stored afterwards under that sequence is not its own
//     superseded version), and a dead letter of a version never queued
//     adds it. So an older version stays refused, also by Replay (which
//     replays the newest of several dead-lettered versions and leaves
//     the older ones), for MaxAge after the newest last changed; then
//     entries pointing at nothing are pruned.
//   - Failures: Fail counts an attempt only when the relay says the
//     failure counts; at MaxAttempts the message is dead-lettered with
//     reason "max attempts: <reason>", a permanent failure at once.
//   - Dead letters: Replay makes each a new message (a new sequence from
//     the installed Sequencer, attempts reset, TTL counting again from the
//     replay or ReplayTTL's) at the tail of its queue; it refuses an
//     OVERWRITE dead letter that a newer version superseded. Replay and
//     Purge refuse a filter that selects everything unless All is set.
//   - Deferrals: Defer and WakeNode change send_at in memory at once; Defer
//     persists it asynchronously, so a restart keeps a deferral, and the
//     late write never undoes a WakeNode. Persisted send_at and high-water
//     are dropped when a queue empties; a non-zero epoch is kept.
//   - Receiver: CommitStream makes its keys seen at once (pending) and
//     durable with the watermark after the commit, and forgets them if the
//     commit fails. Each commit also prunes, a bounded amount, keys older
//     than KeyWindow and streams idle longer than StreamRetention. A
//     forgotten stream leaves its watermark in the horizon of its sender
//     outbox and epoch (Watermark returns it for a stream without a
//     record): sequences of an outbox grow with time, so a message at or
//     below it is older than something that ran StreamRetention ago, and
//     its receiver refuses it (it may have run) instead of running it a
//     second time. A sender whose clock counted less than its real
//     downtime (MaxDowntime) can otherwise still hold such a message.
//     StreamKey and ScopedKey length-prefix every name, so no two tuples
//     share a key whatever characters names contain.
//   - A message refused by the committer (sequence taken, not encodable)
//     fails alone, before anything of it is written; the others of its
//     transaction commit.
//   - A file of format 2 is migrated at Open, MaxBatch records per
//     transaction (a large backlog needs no huge transaction); the first
//     sets format 3, so an older meshnode refuses the file from then on,
//     and each record leaves its old queue in the transaction that writes
//     it to the new bucket, so a crash leaves it in exactly one of the two
//     and the next Open goes on. A record that cannot be moved (two queues
//     holding one sequence, a record too short for its header) goes to the
//     dead-letter queue, as does, at any Open, a record whose header names
//     no queue.
//   - A file of the first format (no "format" key) is migrated at Open in
//     the transaction that opens it: records get the new header, absolute
//     expiries become TTLs relative to when each message was stored, an
//     OVERWRITE message's idempotency key becomes its coalesce key, the old
//     coalesce index is kept, and the dedupe window becomes the key window.
//     The elapsed clock then starts late enough that every migrated time
//     is positive. A newer format is refused with ErrFormat.
//   - bbolt runs with NoFreelistSync and the hashmap freelist: every commit
//     is still fsynced; the freelist is rebuilt by scanning the file at
//     Open (a slower Open for a large file, fewer pages per commit).
//   - A commit the disk refuses before bbolt writes its meta page changes
//     nothing: its callers get the disk's error and the store goes on (a
//     full disk). One that fails after (the meta page's fsync failing) is
//     what the file shows from then on, yet the disk has just said it may
//     not keep it, and a later fsync that succeeds says nothing of what the
//     failed one lost. So the store stops: memory follows the file, that
//     commit's callers and every later write and Head get ErrFailed (Err
//     and Stats.Failure say why), reads for operators still work, and the
//     next Open (a restart) reads what the file holds. Its callers cannot
//     know whether their operation survives: a message whose Enqueue
//     failed this way may still be delivered after the restart.
//   - A caller whose ctx ends while it waits for its commit gets an error
//     although the operation may still commit. Close commits what callers
//     already handed over, then closes the file; every later call returns
//     ErrClosed.
package outbox
