package node

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshnode/meshnode/internal/envcodec"
	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
	"google.golang.org/protobuf/proto"
)

// SpawnOption configures one actor.
type SpawnOption func(*spawnOptions)

type spawnOptions struct {
	capacity int
	overflow mailbox.Overflow
	bytes    int64
	batch    BatchHandler // WithBatch; nil: every message runs through the Handler
	batchMax int
	applied  func(StreamID) uint64 // WithApplied
}

// WithApplied is for a handler that stores Message.Stream() and
// Message.Sequence() with its effects and skips what it has applied (the
// way to exactly-once effects across a crash): applied returns the
// highest sequence of a stream whose effects are durable (0: none). A
// crash between the handler's commit and the node's can leave the handler
// ahead of the stream's watermark; so can outbox.db restored from a backup.
// When the node loads a stream and applied is ahead, the stream's receipts
// report applied's sequence until the watermark passes it. The messages
// still run (the handler skips those it applied; their keys and replies
// are recorded as for any other), but a sender whose state went back (a
// restored backup) learns that it is sending new messages under
// sequences the handler has taken, and starts a new epoch instead of
// having them skipped as copies. applied runs under the node's stream
// lock: it must be quick and must not call the node.
func WithApplied(applied func(StreamID) uint64) SpawnOption {
	return func(o *spawnOptions) { o.applied = applied }
}

// WithMailbox sets the actor's mailbox capacity and overflow strategy.
func WithMailbox(capacity int, overflow mailbox.Overflow) SpawnOption {
	return func(o *spawnOptions) { o.capacity, o.overflow = capacity, overflow }
}

// actor is one spawned handler with its bounded mailbox. The mailbox runs
// handle on at most one goroutine at a time, and none while idle: that
// goroutine is the one owner of every decision about the actor's reliable
// streams.
type actor struct {
	n       *Node
	name    string
	handler Handler
	mb      *mailbox.Mailbox[*delivery]

	// opts is nil unless spawned WithBatch or WithApplied: most actors
	// have neither, and the struct stays within 64 bytes.
	opts *streamOpts

	// Room kept for reliable messages (post). streamsQueued counts the
	// reliable deliveries in the mailbox; waiting is set while one refused
	// or dropped for room is expected back (nil: none).
	streamsQueued atomic.Int32
	waiting       atomic.Pointer[roomWait]
}

// streamOpts are an actor's options for its reliable streams.
type streamOpts struct {
	batch    BatchHandler // nil unless spawned WithBatch
	batchMax int
	applied  func(StreamID) uint64 // nil unless spawned WithApplied
}

// batch returns the actor's BatchHandler, or nil.
func (a *actor) batch() BatchHandler {
	if a.opts == nil {
		return nil
	}
	return a.opts.batch
}

// applied returns the actor's WithApplied function, or nil.
func (a *actor) applied() func(StreamID) uint64 {
	if a.opts == nil {
		return nil
	}
	return a.opts.applied
}

// roomWait is how long reliable messages refused for room are expected
// back, and the room in bytes the largest of them needs until its own
// window ends. Replaced whole, never changed: a refusal and the lapse
// cannot mix two states.
type roomWait struct {
	untilMs      int64 // the store's elapsed clock (ms)
	bytes        int64
	bytesUntilMs int64
}

// delivery is one message in an actor's mailbox.
type delivery struct {
	// Message is what the handler gets (envelope, the local sender's
	// value, the stream, the node that sent it as verified by TLS). It
	// lives in the delivery so that handing it over allocates nothing.
	Message
	receipt    func(*pb.Receipt) // reliable: receipt to the sender; nil otherwise
	replyCh    chan<- localReply // local ask: where the reply goes
	remoteAsk  bool              // remote ask: reply goes back as a RESPONSE envelope
	queued     bool              // a reliable delivery counted in its actor's streamsQueued
	evicted    bool              // a reliable delivery evicted by DropOldest, counted in Node.evictions until its drop is answered
	deadlineMs int64             // the store's elapsed clock when its TTL runs out (0 = none)
	deadline   time.Time         // local tell or ask: the caller's deadline (zero = none)
	values     context.Context   // local tell or ask: the caller's context, for its values
	charged    *atomic.Int64     // the sending peer's queued bytes, until uncharge (limits.go)
	size       int64             // what it was charged
	lazy       *deadlineCtx      // a remote ask's handler context, allocated with it (askDelivery); nil otherwise
	ownsEnv    bool              // only this delivery refers to env (decoded from a peer's frame, or made for a local send): reused after its handler (finish)
	pooled     bool              // a local tell or ask, or a tell from a peer: the delivery itself is reused after its handler (finish)
}

// deliveryPool holds the deliveries of local tells and asks and of tells
// from peers, reused with their envelopes: the two were most of the bytes
// a tell allocated, and their garbage collection a fifth of its CPU.
var deliveryPool = sync.Pool{New: func() any { return new(delivery) }}

// finish ends a tell's or an ask's delivery once its actor has answered:
// it gives back what it charged and hands back for reuse an envelope only
// it refers to and a pooled delivery (not a remote ask's: it holds the
// handler's context, which the handler may have passed on). Nothing may
// refer to what it hands back.
func (d *delivery) finish() {
	d.uncharge()
	if d.ownsEnv {
		envcodec.Recycle(d.env)
	}
	if d.pooled {
		*d = delivery{}
		deliveryPool.Put(d)
	}
}

// askDelivery is a remote ask's delivery with its handler's deadline
// context in the same allocation: one allocation per ask instead of two.
// The pointer field keeps every other delivery in its size class.
type askDelivery struct {
	delivery
	lazy deadlineCtx
}

type localReply struct {
	msg proto.Message
	err error
}

// Spawn starts an actor named name on this node and returns its address.
func (n *Node) Spawn(name string, h Handler, opts ...SpawnOption) (Address, error) {
	if n.closed.Load() || n.draining.Load() {
		return Address{}, ErrClosed
	}
	if h == nil {
		return Address{}, fmt.Errorf("node: spawn %q: nil handler", name)
	}
	addr := Address{Actor: name, Node: n.name}
	if err := addr.Validate(); err != nil {
		return Address{}, fmt.Errorf("node: spawn: %w", err)
	}
	o := spawnOptions{capacity: n.cfg.MailboxCapacity, overflow: n.cfg.Overflow, bytes: n.cfg.MailboxBytes}
	for _, opt := range opts {
		opt(&o)
	}
	a := &actor{n: n, name: name, handler: chainServer(n.serverInterceptors, h)}
	if o.batch != nil || o.applied != nil {
		a.opts = &streamOpts{batch: o.batch, batchMax: o.batchMax, applied: o.applied}
	}
	mb, err := mailbox.New(mailbox.Config[*delivery]{
		Capacity: o.capacity,
		MaxBytes: o.bytes,
		Size:     deliverySize,
		Overflow: o.overflow,
		Handle:   a.handle,
		OnDrop:   a.dropped,
		OnEvict:  a.evicting,
	})
	if err != nil {
		return Address{}, fmt.Errorf("node: spawn %q: %w", name, err)
	}
	a.mb = mb
	n.actorsMu.Lock()
	defer n.actorsMu.Unlock()
	if n.closed.Load() {
		mb.Close()
		return Address{}, ErrClosed
	}
	if _, ok := n.actors[name]; ok {
		mb.Close()
		return Address{}, fmt.Errorf("%w: %q", ErrActorExists, name)
	}
	n.actors[name] = a
	delete(n.stopped, name)
	return addr, nil
}

// Stop removes an actor; messages still in its mailbox are dropped (and
// reliable ones are sent again by their senders later). The name can be
// spawned again once Stop returns, not before: until then the old actor
// may still be handling a message of its streams.
func (n *Node) Stop(name string) error {
	n.actorsMu.RLock()
	a, ok := n.actors[name]
	n.actorsMu.RUnlock()
	if !ok {
		return fmt.Errorf("%w: %q", ErrNoSuchActor, name)
	}
	a.mb.Close()
	n.actorsMu.Lock()
	if n.actors[name] == a {
		delete(n.actors, name)
		n.noteStoppedLocked(name)
	}
	n.actorsMu.Unlock()
	return nil
}

// noteStoppedLocked records that the actor name stopped now, for
// stopGraceLeft, and drops the records older than SpawnGrace whenever
// their number has doubled since the last time (so a node that stops
// many actors keeps no more than twice those of one grace). Called with
// actorsMu held.
func (n *Node) noteStoppedLocked(name string) {
	if n.cfg.SpawnGrace <= 0 {
		return
	}
	now := n.store.ElapsedMs()
	if n.stopped == nil {
		n.stopped = map[string]int64{}
	}
	n.stopped[name] = now
	if len(n.stopped) < max(n.pruneAt, 64) {
		return
	}
	for k, at := range n.stopped {
		if now-at >= n.cfg.SpawnGrace.Milliseconds() {
			delete(n.stopped, k)
		}
	}
	n.pruneAt = 2 * len(n.stopped)
}

// stopGraceLeft is how much of SpawnGrace is left since the actor name
// stopped (a redeploy: stopped, then spawned again), at most a second, as
// spawnGraceLeft is for the node's start: a reliable message for it is
// answered "not yet" meanwhile, and its sender waits without counting an
// attempt. 0 when it did not stop within the grace.
func (n *Node) stopGraceLeft(name string) time.Duration {
	n.actorsMu.RLock()
	at, ok := n.stopped[name]
	n.actorsMu.RUnlock()
	if !ok {
		return 0
	}
	left := time.Duration(at+n.cfg.SpawnGrace.Milliseconds()-n.store.ElapsedMs()) * time.Millisecond
	return min(max(left, 0), time.Second)
}

func (n *Node) actor(name string) *actor {
	n.actorsMu.RLock()
	a := n.actors[name]
	n.actorsMu.RUnlock()
	return a
}

// post puts a tell's or an ask's delivery into the actor's mailbox. While
// a reliable message is queued there or expected back after a refusal for
// room, tells and asks may take only half of the mailbox (and leave room
// for the size of the one expected back): a flood of tells that keeps a
// mailbox full would otherwise take every slot the handler frees before
// the reliable message's next attempt arrives, or, under DropOldest,
// evict it again, and starve its stream for as long as the flood lasts.
func (a *actor) post(d *delivery) error {
	if keep, keepBytes := a.keepsRoom(); keep {
		return a.mb.PostLow(d, keepBytes)
	}
	return a.mb.Post(d)
}

// keepsRoom reports whether room is kept for reliable messages, and how
// many bytes of it for one expected back.
func (a *actor) keepsRoom() (keep bool, keepBytes int64) {
	if w := a.waiting.Load(); w != nil {
		now := a.n.store.ElapsedMs()
		if now < w.untilMs {
			if now < w.bytesUntilMs {
				keepBytes = w.bytes
			}
			return true, keepBytes
		}
		a.waiting.CompareAndSwap(w, nil) // lapsed: later tells skip the clock
	}
	return a.streamsQueued.Load() > 0, 0
}

// postStream puts a reliable message's delivery into the actor's mailbox.
func (a *actor) postStream(d *delivery) error {
	d.queued = true
	a.streamsQueued.Add(1)
	err := a.mb.Post(d)
	if err != nil {
		a.left(d) // not queued (or already dropped, under DropNewest)
	}
	var ce *CapacityError
	if errors.As(err, &ce) {
		a.expectBack(d, ce.RetryAfter)
	}
	return err
}

// left is called when a reliable delivery leaves the mailbox: taken to
// be handled, dropped, or never queued. Idempotent.
func (a *actor) left(d *delivery) {
	if d.queued {
		d.queued = false
		a.streamsQueued.Add(-1)
	}
}

// expectBack keeps room for a reliable message refused or dropped for
// room while it waits the hint it was given: twice the hint and a second
// more, since its sender may be slower to come back. A refusal extends
// the window, never shortens it; the room in bytes is the largest waiting
// message's, for its own window only. Once the message is queued again,
// streamsQueued keeps the room until it is handled.
func (a *actor) expectBack(d *delivery, hint time.Duration) {
	now := a.n.store.ElapsedMs()
	next := &roomWait{untilMs: now + (2*hint + time.Second).Milliseconds(), bytes: deliverySize(d)}
	next.bytesUntilMs = next.untilMs
	for {
		w := a.waiting.Load()
		n := *next
		if w != nil && now < w.untilMs {
			n.untilMs = max(n.untilMs, w.untilMs)
			if now < w.bytesUntilMs && w.bytes >= n.bytes {
				n.bytes, n.bytesUntilMs = w.bytes, w.bytesUntilMs
			}
		}
		if a.waiting.CompareAndSwap(w, &n) {
			return
		}
	}
}

// evicting is the mailbox's eviction hook, called under its lock: a
// reliable message's stream counts a drop not yet answered (evictions)
// before the message behind it can be taken.
func (a *actor) evicting(d *delivery) {
	if d.stream != (StreamID{}) && d.receipt != nil {
		d.evicted = true
		a.n.evictions.evicted(d.stream)
	}
}

// dropped is the mailbox's dead-letter hook: count it and answer whoever
// waits. A reliable message dropped for room is answered as one refused
// for room (refuseForRoom): CAPACITY, its sender waits and sends it again,
// and what was chained behind it is refused by the watermark check, since
// the watermark stays behind it; or, another message at the watermark's
// sequence (a sender restored from a backup), DIVERGED with the stream
// marked, so that nothing chained behind it runs in the old epoch.
func (a *actor) dropped(d *delivery, r mailbox.DropReason) {
	if d.evicted {
		// Deferred: a stream left counted would have every later message
		// of it refused.
		defer a.n.evictions.answered(d.stream)
	}
	d.uncharge()
	a.left(d)
	a.n.stats.dropped.Add(1)
	a.n.log.Debug("message dropped", "actor", a.name, "reason", r.String(), "msg", d.env.GetMsgId())
	if r == mailbox.DroppedOldest && d.stream != (StreamID{}) {
		a.expectBack(d, a.mb.RetryAfter())
		if d.receipt != nil {
			a.n.refuseForRoom(d.stream, a.applied(), d.env, d.receipt, "dropped: "+r.String(), 10*time.Millisecond)
			return
		}
	}
	if r == mailbox.DroppedNewest {
		// Post also returns the error for the incoming message, and its
		// caller answers; answering here too would send two receipts.
		return
	}
	var err error = &CapacityError{RetryAfter: 10 * time.Millisecond}
	code, retry := pb.Receipt_CAPACITY, int64(10)
	switch r {
	case mailbox.DroppedPanicked: // the handler's own recover normally catches it first
		err, code, retry = Permanent(fmt.Errorf("node: handler of %q panicked", a.name)), pb.Receipt_REJECTED, 0
	case mailbox.DroppedClosed:
		// The actor or the node is stopping: not the message's fault.
		code, retry = pb.Receipt_NO_SUCH_ACTOR, 1000
		err = fmt.Errorf("node: actor %q stopped: %w", a.name, ErrNoSuchActor)
	}
	switch {
	case d.receipt != nil:
		d.receipt(&pb.Receipt{MsgId: d.env.GetMsgId(), Code: code, RetryAfterMs: retry, Message: "dropped: " + r.String()})
	case d.replyCh != nil:
		d.replyCh <- localReply{err: err}
	case d.remoteAsk:
		a.n.respond(d.from, d.env, nil, err)
	}
}

// handle runs on the mailbox goroutine, one delivery at a time.
func (a *actor) handle(d *delivery) {
	if d.remoteAsk {
		growForReply()
	}
	a.left(d)
	if a.n.ctx.Err() != nil {
		// The node is closing: what is still queued is dropped and counted
		// (a reliable message is sent again), not run with a dead context.
		a.dropped(d, mailbox.DroppedClosed)
		return
	}
	if d.receipt != nil {
		defer d.uncharge()
		if a.batch() != nil && batchable(d) {
			a.handleBatch(d)
			return
		}
		a.handleStream(d)
		return
	}
	// finish runs on the paths below, not deferred: a panic escaping here
	// (not the handler's, which call recovers) leaves d to the mailbox's
	// drop, which must not meet it reused. A handler that ends its
	// goroutine (runtime.Goexit) skips them; its charge is given back here.
	finished := false
	defer func() {
		if !finished {
			d.uncharge()
		}
	}()
	n, env := a.n, d.env
	ctx := n.ctx
	if d.deadlineMs > 0 {
		now := time.Now()
		dl := d.deadline
		if dl.IsZero() {
			dl = now.Add(time.Duration(d.deadlineMs-n.store.ElapsedMs()) * time.Millisecond)
		}
		var lazy *deadlineCtx
		if d.lazy != nil {
			lazy = d.lazy.init(ctx, dl)
		} else {
			lazy = withLazyDeadline(ctx, dl)
		}
		defer lazy.release()
		ctx = lazy
		if !now.Before(lazy.deadline) {
			// Its caller's deadline passed while it waited in the mailbox:
			// nobody waits for the outcome any more.
			n.stats.expired.Add(1)
			a.answer(d, nil, fmt.Errorf("node: %s expired in the mailbox of %q: %w", env.GetMsgId(), a.name, context.DeadlineExceeded))
			finished = true
			d.finish()
			return
		}
	}
	if d.values != nil {
		ctx = valueContext{Context: ctx, values: d.values}
	}
	reply, err := a.call(ctx, &d.Message)
	a.answer(d, reply, err)
	finished = true
	d.finish()
}

// replyStack is about what answering a remote ask takes of the stack
// below an actor's handle: the response built, encoded and queued into
// the transport.
const replyStack = 3 << 10

// growForReply makes room on the stack for a reply's send, here where the
// stack holds a few frames. An idle actor has no goroutine: a message
// starts one, with Go's smallest stack (2 KiB), and a reply's path into
// the transport runs deeper, so every ask to an idle actor copied its
// stack, frame by frame, as it grew deep in that path (about 3 µs of a
// 23 µs round trip on loopback). Grown here the copy is a few frames;
// on a goroutine that has grown already, this is a call that clears
// 3 KiB.
//
//go:noinline
func growForReply() {
	var room [replyStack]byte
	touchLast(room[:])
}

// touchLast keeps growForReply's frame from being optimised away.
//
//go:noinline
func touchLast(b []byte) { b[len(b)-1] = 1 }

// answer sends a tell's or an ask's outcome to whoever waits for it.
func (a *actor) answer(d *delivery, reply proto.Message, err error) {
	switch {
	case d.replyCh != nil:
		d.replyCh <- localReply{msg: reply, err: err}
	case d.remoteAsk:
		a.n.respondUntil(d.from, d.env, reply, err, d.deadlineMs)
	case err != nil:
		a.n.log.Debug("tell handler failed", "actor", a.name, "msg", d.env.GetMsgId(), "err", err)
	}
}

// handleStream decides a reliable message when the actor takes it, from
// the stream's watermark W (this goroutine is its only writer):
//
//   - sequence <= W: already processed: DUPLICATE, not run;
//   - prev_sequence neither 0 nor W: its predecessor has not run here:
//     OUT_OF_ORDER, not run (the sender resends from its frontier);
//   - its TTL ran out: EXPIRED;
//   - its idempotency key was seen: DUPLICATE, and W moves to it;
//   - else the handler runs; on success W moves to it.
//
// PROCESSED and DUPLICATE go out only once a W covering the message is
// durable; a failed commit is answered as onDurable says.
func (a *actor) handleStream(d *delivery) {
	n, env := a.n, d.env
	if a.refuseWhileStoreFailed(d) {
		return
	}
	st, err := n.in.acquire(d.stream, a.applied())
	if err != nil {
		a.receipt(d, nil, &pb.Receipt{Code: pb.Receipt_NO_SUCH_ACTOR, RetryAfterMs: 1000, Message: "node is stopping"})
		return
	}
	defer n.in.release(st)
	id, rc := env.GetMsgId(), func(r *pb.Receipt) { a.receipt(d, st, r) }
	positive := func(code pb.Receipt_Code) func(error, uint64) { return n.in.onDurable(st, rc, code) }
	seq, prev, w := env.GetSequence(), env.GetPrevSequence(), st.w.Load()
	// A request whose handler ran on an earlier copy, its reply refused by
	// the disk: what remains is storing that reply.
	held := n.held.get(st.key, seq, env)
	switch {
	case n.evictions.pending(d.stream):
		a.refuseWhileEvicting(d, rc)
		return
	case n.in.divergent(st, env):
		n.stats.diverged.Add(1)
		n.in.answerDiverged(st, rc)
		return
	case seq <= w:
		n.stats.dedupeHits.Add(1)
		n.in.afterDurable(st, seq, positive(pb.Receipt_DUPLICATE))
		return
	case w == 0 && seq <= st.horizon():
		// This node forgot the stream (idle past its retention) and the
		// message is older than what it forgot: it may have run. Its
		// sender undercounted its age; it gives it up.
		n.stats.forgotten.Add(1)
		rc(&pb.Receipt{Code: pb.Receipt_FORGOTTEN, Watermark: st.horizon(),
			Message: "this node forgot the stream (idle past its retention) and the message is older than what it forgot"})
		return
	case prev != 0 && prev != w:
		n.stats.outOfOrder.Add(1)
		rc(&pb.Receipt{Code: pb.Receipt_OUT_OF_ORDER, Watermark: w})
		return
	case held == nil && d.deadlineMs > 0 && n.store.ElapsedMs() >= d.deadlineMs:
		n.stats.expired.Add(1)
		rc(&pb.Receipt{Code: pb.Receipt_EXPIRED, Message: "expired before processing"})
		return
	}
	var keys [][]byte
	if k := env.GetIdempotencyKey(); k != "" {
		scoped := outbox.ScopedKey(d.from, a.name, k)
		seen, err := n.store.KeySeen(scoped)
		if err != nil {
			rc(&pb.Receipt{Code: pb.Receipt_NO_SUCH_ACTOR, RetryAfterMs: 1000, Message: "node is stopping"})
			return
		}
		if seen {
			// The application sent this key before (a retry of its own):
			// it took effect then. W moves on as for a success.
			n.stats.dedupeHits.Add(1)
			n.in.advance(st, seq, pb.StreamDigest(env), nil, positive(pb.Receipt_DUPLICATE))
			return
		}
		keys = [][]byte{scoped}
	}
	herr, ok := a.runStream(d, st, held)
	if !ok {
		return
	}
	if herr == nil {
		// A nil return is success, even after the deadline.
		n.in.advance(st, seq, pb.StreamDigest(env), keys, positive(pb.Receipt_PROCESSED))
		return
	}
	r := &pb.Receipt{MsgId: id, Code: pb.Receipt_TRANSIENT, Message: herr.Error()}
	var ce *CapacityError
	switch {
	case mailbox.IsPermanent(herr):
		r.Code = pb.Receipt_REJECTED
	case errors.As(herr, &ce):
		// A handler that is itself full (a bounded store behind it) is
		// congestion, not poison: the sender backs off without counting.
		r.Code, r.RetryAfterMs = pb.Receipt_CAPACITY, max(ce.RetryAfter.Milliseconds(), 1)
	}
	rc(r)
}

// runStream runs the handler of the stream message d and, for a reliable
// request, stores its reply (or, with held, stores the reply an earlier
// copy's run made instead of running the handler again). It returns the
// handler's error, and false when it answered d itself because the reply
// could not be stored: that is not the message's fault, so the sender
// waits without counting and sends it again.
func (a *actor) runStream(d *delivery, st *inStream, held *heldReply) (herr error, ok bool) {
	n, env, seq := a.n, d.env, d.env.GetSequence()
	// The handler ran (now or on an earlier copy) and the disk refused its
	// reply: CAPACITY, as for a watermark the disk refused. The sender
	// waits, uncounted; NO_SUCH_ACTOR would tell it the message never ran.
	refused := func(err error) (error, bool) {
		d.receipt(&pb.Receipt{MsgId: env.GetMsgId(), Code: pb.Receipt_CAPACITY, RetryAfterMs: notDurableRetry.Milliseconds(),
			Message: "reply not stored: " + err.Error()})
		return nil, false
	}
	if held != nil {
		if err := n.storeReply(held.sm); err != nil {
			n.held.touch(held)
			return refused(err)
		}
		n.held.drop(st.key, seq)
		return held.herr, true
	}
	timeout := n.cfg.HandlerTimeout
	if d.deadlineMs > 0 {
		timeout = min(timeout, time.Duration(d.deadlineMs-n.store.ElapsedMs())*time.Millisecond)
	}
	ctx := withLazyDeadline(n.ctx, time.Now().Add(timeout))
	reply, herr := a.call(ctx, &d.Message)
	ctx.release()
	if !isRequest(env) || (herr != nil && !mailbox.IsPermanent(herr)) {
		return herr, true
	}
	sm := a.replyMessage(d, reply, herr)
	if sm == nil {
		return herr, true
	}
	if err := n.storeReply(sm); err != nil {
		// Keep the reply, so that the copy the sender sends again stores
		// it instead of running the handler a second time.
		if !n.held.put(d.from, st.key, seq, env, sm, herr) {
			n.log.Warn("reply not kept for the request's next copy (too many waiting for the disk, from this sender or in all): the handler will run again",
				"actor", a.name, "sender", d.from, "msg", env.GetMsgId())
		}
		return refused(err)
	}
	return herr, true
}

// refuseWhileStoreFailed answers d, a stream message, when this node's
// store stopped (the disk failed a sync): no watermark can be made durable
// before the node restarts, so a handler run now would run again after
// it. The sender waits, uncounted, as for a full disk.
func (a *actor) refuseWhileStoreFailed(d *delivery) bool {
	err := a.n.store.Err()
	if err == nil {
		return false
	}
	a.n.stats.storeFailed.Add(1)
	a.receipt(d, nil, &pb.Receipt{Code: pb.Receipt_CAPACITY, RetryAfterMs: notDurableRetry.Milliseconds(),
		Message: "not run: this node's store stopped until it restarts: " + err.Error()})
	return true
}

// notDurableRetry is what a sender is told to wait when this node could
// not make a watermark durable.
const notDurableRetry = time.Second

// onDurable returns the callback of a watermark commit that answers a
// stream message with code (PROCESSED or DUPLICATE) through rc once the
// watermark covering it is durable. A commit the node's disk refused (full
// or failing) is this node's trouble, not the message's: it is answered
// CAPACITY, which the sender waits out without counting and slows down
// for, where TRANSIENT would count toward its MaxAttempts and dead-letter
// a message whose handler succeeded while the disk stays full. A copy sent
// again is recognised from the watermark in memory and answered once the
// disk takes the commit.
func (in *inbound) onDurable(st *inStream, rc func(*pb.Receipt), code pb.Receipt_Code) func(error, uint64) {
	return func(err error, w uint64) {
		if err != nil {
			rc(&pb.Receipt{Code: pb.Receipt_CAPACITY, RetryAfterMs: notDurableRetry.Milliseconds(), Message: "watermark not durable: " + err.Error()})
			return
		}
		rc(&pb.Receipt{Code: code, Watermark: in.reported(st, w)})
	}
}

// receipt answers d, a message of the stream st (nil: not known), with r,
// saying how many more messages like d a's mailbox could take as it is
// written (its places and bytes, and what d's sender may still queue at
// this node), and the highest sequence of st that had reached it by then:
// its sender sizes what it sends ahead of its receipts by them.
func (a *actor) receipt(d *delivery, st *inStream, r *pb.Receipt) {
	switch {
	case st == nil || !digestSaid(r.GetCode()):
	case r.GetCode() == pb.Receipt_DUPLICATE:
		var marked bool
		if r.Watermark, r.WatermarkDigest, marked = a.n.in.copyWatermark(st); marked {
			// Decided a copy before the stream was marked divergent,
			// answered after (answerDiverged says why not DUPLICATE).
			a.n.in.answerDiverged(st, func(r *pb.Receipt) { a.receipt(d, st, r) })
			return
		}
	default:
		r.WatermarkDigest = a.n.in.digestAt(st, r.GetWatermark())
	}
	if st != nil {
		switch r.GetCode() {
		case pb.Receipt_PROCESSED, pb.Receipt_DUPLICATE, pb.Receipt_DIVERGED:
		default:
			a.n.in.notRun(st, d.stream.Node, d.env)
		}
	}
	r.MsgId = d.env.GetMsgId()
	size := envBytes(d.env)
	room := min(a.mb.Room(size), a.n.peerRoom(d.from, size))
	r.Room = uint32(min(uint64(max(room, 0)), math.MaxUint32)) // an int has 32 bits on some platforms
	if st != nil {
		r.Arrived = st.arrived.Load()
	}
	d.receipt(r)
}

// digestSaid reports whether a receipt of code says the digest of the
// message at its watermark: those that answer a message without running
// it, as a copy or out of order, or refuse it for room. A sender restored
// from a backup compares it with the message it holds there.
func digestSaid(code pb.Receipt_Code) bool {
	switch code {
	case pb.Receipt_DUPLICATE, pb.Receipt_OUT_OF_ORDER, pb.Receipt_CAPACITY:
		return true
	}
	return false
}

// call runs the handler, turning a panic into a permanent error.
func (a *actor) call(ctx context.Context, m *Message) (reply proto.Message, err error) {
	defer func() {
		if r := recover(); r != nil {
			a.n.stats.panics.Add(1)
			a.n.log.Error("handler panicked", "actor", a.name, "msg", m.ID(), "panic", r, "stack", string(debug.Stack()))
			reply, err = nil, Permanent(fmt.Errorf("node: handler of %q panicked: %v", a.name, r))
		}
	}()
	return a.handler(ctx, m)
}
