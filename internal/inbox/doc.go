// Package inbox is the daemon's durable inbox for programs in any language:
// named queues on their own bbolt file (DataDir/inbox.db) implementing the
// Send / Pull / AckUpTo contract of the mailbox seed document.
//
// The daemon spawns one actor per declared inbox; its handler calls Append,
// which returns only after the message is fsynced, so a reliable sender is
// told Delivered only for messages that are on disk. A program pulls
// messages after a cursor (long-polling) and acknowledges up to a cursor.
//
//	s, err := inbox.Open(inbox.DefaultConfig(filepath.Join(dataDir, "inbox.db")))
//	if err != nil { ... }
//	defer s.Close()
//	_, _ = s.Declare("orders")
//	cur, err := s.Append(ctx, "orders", env)           // durable before return
//	msgs, err := s.Pull(ctx, "orders", 0, 100, 30*time.Second)
//	n, err := s.AckUpTo("orders", msgs[len(msgs)-1].GetEventSeq())
//
// # Guarantees
//
//   - Cursors are per inbox, start at 1 and only grow, across restarts and
//     after everything was acknowledged (bbolt's bucket sequence).
//   - Pull returns every stored message with a cursor greater than after,
//     acknowledged or not pulled before, so a program that restarts from
//     its last acknowledged cursor sees the unacknowledged ones again.
//   - AckUpTo deletes messages with cursor <= up_to. Acking past the last
//     stored message is refused (ErrAckBeyond): the watermark never passes
//     durable work. Acks are idempotent.
//   - Each inbox is bounded (MaxMessages); Append on a full inbox returns
//     ErrFull and stores nothing. A Pull returns at most MaxPullBytes of
//     messages (at least one).
//   - The file is checked before bbolt reads it, as the outbox's is
//     (ErrDamaged, ErrLost with inbox.db.id, ErrReplaced, inbox.db.clean).
//
// # Decisions (the architecture and its numbered rules: docs/architecture.md)
//
//   - AckUpTo(c) deletes cursors <= c (not only those < c); the
//     daemon's HTTP API says up_to, and a program acks the cursor of the last
//     message it finished, which reads more naturally.
//   - Messages are stored as the wire Envelope with event_seq set to the
//     cursor, so ids, sender, headers and the idempotency key survive.
//   - The daemon's inbox actor stores the reliable messages waiting in its
//     mailbox with AppendBatch: one commit (one fsync) for all of them,
//     each acknowledged only after it (node.WithBatch).
//   - Write transactions run one at a time under the store's own lock
//     (bbolt runs one at a time anyway): after a failed commit, the file's
//     transaction then says whether bbolt had written it. One that it had
//     (the meta page's fsync failing) stops the store: every write and
//     Pull fails with ErrFailed until a restart reopens the file (a
//     waiting long poll is woken to say so), Applied reports nothing, and
//     Close, which waits for a write in progress to learn this, does not
//     mark it clean. Appends share commits without a delay
//     (group): one that finds no commit running commits at once, those
//     arriving meanwhile share the next. bbolt's Batch waited 2 ms for
//     company that one inbox actor, appending one message at a time, never
//     brings. A panic in one append (a bad argument) is that append's
//     error, whichever caller's goroutine ran it.
//   - Pull returns no message above the highest cursor whose append has
//     returned: a commit shared by several appends is in the file before
//     each has counted it, and a program must never be handed a cursor
//     that its next Pull would call beyond the last stored message.
//   - Duplicates: a reliable message is stored once. The node dedupes by
//     its stream watermark and idempotency keys before the handler runs,
//     but a receiver killed after an append's commit and before the
//     watermark covering it is committed gets those messages again, under
//     new msg ids. The inbox actor passes each message's stream and
//     sequence (Mark); the store keeps each stream's last stored sequence
//     in the same commit as the messages and does not store a copy again
//     (the node's own rule for handlers that want exactly-once effects).
//     Tells and asks carry no Mark and are stored as they come. The actor
//     is spawned with node.WithApplied(Applied(store)), so the receipts of
//     a stream loaded after a crash (or after outbox.db was restored from a
//     backup) report what the inbox stored: a sender restored from a
//     backup learns that those sequences ran, and does not send new
//     messages under them (the inbox would skip them as copies). A
//     stream's record goes when the node forgets the stream (idle past its
//     retention; outbox.Config.OnForget, a Forgetter in the daemon).
package inbox
