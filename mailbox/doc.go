// Package mailbox holds meshnode's per-actor building blocks: the bounded
// Mailbox with its overflow strategies, the ResponseRegistry that matches
// ask responses to waiters, status headers that carry handler errors across
// the wire, and message IDs and idempotency keys. It knows nothing of the
// network. Routing by (service, method) lives in node (ServiceMux), which
// knows both of the paths a message takes to a handler.
//
// # Guarantees
//
//   - A Mailbox is bounded by a count of items and, with MaxBytes, by the
//     bytes of its queued items (as Size counts them; an item larger than
//     MaxBytes only enters an empty mailbox). "Full" is never silent: Reject and DropNewest
//     return a *CapacityError (errors.Is(err, ErrMailboxFull)) with a
//     positive RetryAfter; every dropped item (DropOldest, DropNewest, Close,
//     a panicking Handle) reaches OnDrop and is counted in Stats.
//   - PostLow is Post for items of low priority: the queued items that
//     came by it take at most half of the capacity (at least one item) and
//     of MaxBytes, and leave room for a given size; over that, or when the
//     mailbox is full, it refuses under every strategy and never drops a
//     queued item. Post's items may still fill the whole mailbox.
//   - Handle runs for one item at a time, in FIFO order; items of one poster
//     are handled in the order that poster's Posts succeeded.
//   - An idle Mailbox holds no goroutine and no queue buffer (about 240 bytes
//     fresh, about 300 bytes after use; see TestIdleMailboxMemory). Post
//     starts one handler goroutine when it finds the mailbox idle; it exits
//     when the queue is empty. Close waits for it.
//   - ResponseRegistry.Deliver and RegisterChan never block (a caller's
//     channel found full loses the response, counted in Dropped), and
//     Deliver hands a response only to a waiter that named the peer it
//     came from: another member cannot answer in the asked peer's place.
//     Responses without a waiter are kept for a Register by the same peer
//     within bounds in bytes, per peer and in all (RegistryConfig), for
//     EarlyTTL; ForgetPeer drops a peer's at once.
//   - ErrorOf never panics on malformed headers.
//
// # Usage
//
//	m, err := mailbox.New(mailbox.Config[*pb.Envelope]{
//		Capacity: 256,
//		Overflow: mailbox.Reject,
//		Handle:   func(env *pb.Envelope) { reply, err := handle(ctx, env); ... },
//		OnDrop:   func(env *pb.Envelope, r mailbox.DropReason) { deadLetters.Add(env, r) },
//	})
//	if err != nil { ... }
//	defer m.Close()
//	if err := m.Post(env); err != nil {
//		var ce *mailbox.CapacityError
//		if errors.As(err, &ce) { /* tell the sender: retry after ce.RetryAfter */ }
//	}
//
//	// Ask: register before sending, then wait; only peer's response counts.
//	ch, err := reg.Register(env.Rpc.CorrelationId, peer)
//	send(env)
//	select { case resp, ok := <-ch: ... /* !ok: pruned after TTL */; case <-ctx.Done(): reg.Cancel(id) }
//
//	// The same with a channel of the caller's (RegisterChan): once a
//	// response was received from it, it can wait for the next one.
//
// # Decisions (the architecture and its numbered rules: docs/architecture.md)
//
//   - Capacity counts queued items only, not the one being handled, so a
//     mailbox of capacity N holds up to N+1 accepted items.
//   - RetryAfter = EWMA(handle time per item, weight 0.2) × depth / 2 (a
//     Handle that took k more items with TakeIf counts as k+1 items), clamped to
//     [1 ms, 10 s]; 10 ms before the first sample. A remote hint decoded by
//     ErrorOf is clamped to 10 s, and a missing or non-positive one becomes
//     10 ms, so a hint is always positive.
//   - A panicking Handle is recovered, counted (Stats.Panicked) and its item
//     goes to OnDrop with the added reason DroppedPanicked; the actor keeps
//     running. A Handle that ends its goroutine (runtime.Goexit) is not
//     counted and its item reaches no OnDrop; the items behind it are
//     handled by a new goroutine.
//   - Under DropOldest, OnEvict (optional) sees each evicted item under
//     the mailbox's lock, before the items behind it can be handed over;
//     OnDrop sees it after the lock is released, when Handle may already
//     run them.
//   - After Close, Post returns ErrClosed and does not call OnDrop (the
//     caller holds the item). Close takes queued items at once, waits for the
//     running Handle, then calls OnDrop(DroppedClosed) for each. Close and
//     Drain must not be called from Handle or OnDrop (they would wait for
//     themselves).
//   - An OnDrop that panics does not cost the other items one Post (several
//     evicted) or Close drops their OnDrop: they are handed to it while
//     the panic unwinds, and the panic then reaches the caller (the last
//     one, should several OnDrop calls panic).
//   - The ring buffer starts at 8 slots, doubles up to Capacity, and is
//     released when the queue drains if it grew beyond 8 slots.
//   - ResponseRegistry: waiters in 16 shards by FNV-1a of the correlation
//     id. Early responses are charged their encoded size plus 256 bytes;
//     over a peer's bound its oldest go, over the total bound the oldest of
//     the peer holding the most, so a flooding peer evicts its own. Prune
//     closes pruned waiters' channels so a waiter without a deadline wakes
//     (receives nil, false); Cancel does not close. A response without a
//     correlation id is dropped (Deliver returns false).
//   - Status codes map to sentinels both ways; added: Expired <-> ErrExpired,
//     ErrClosed -> Unavailable, Unimplemented <-> ErrUnknownMethod.
//     Permanent takes precedence in CodeOf (Rejected) over everything but
//     ErrUnknownMethod, and a decoded Rejected or Unimplemented RemoteError
//     is IsPermanent, so "do not retry" survives the wire. A non-nil error
//     never encodes as OK.
//   - NewID: 22 base64url characters: AES-256, under a key made at start-up,
//     of a random per-process epoch and a counter. Unique (a permutation of
//     distinct blocks) and unpredictable to whoever has seen other ids, with
//     no syscall per call (about 70 ns more than a plain counter).
//   - DeterministicID: 8-byte big-endian length before each part.
package mailbox
