package node

import (
	"context"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/mailbox/pb"
	"google.golang.org/protobuf/proto"
)

// SpawnOption configures one actor.
type SpawnOption func(*spawnOptions)

type spawnOptions struct {
	capacity int
	overflow mailbox.Overflow
}

// WithMailbox sets the actor's mailbox capacity and overflow strategy.
func WithMailbox(capacity int, overflow mailbox.Overflow) SpawnOption {
	return func(o *spawnOptions) { o.capacity, o.overflow = capacity, overflow }
}

// actor is one spawned handler with its bounded mailbox. The mailbox runs
// handle on at most one goroutine at a time, and none while idle.
type actor struct {
	n       *Node
	name    string
	handler Handler
	mb      *mailbox.Mailbox[*delivery]

	// chainMu guards the field below: per sender node, the sequence of the
	// last reliable message that failed here. A chained message whose
	// predecessor failed is refused unprocessed, so the sender's retry keeps
	// FIFO order (see pb.Envelope.prev_sequence).
	chainMu    sync.Mutex
	lastFailed map[string]uint64
}

// delivery is one message in an actor's mailbox.
type delivery struct {
	env        *pb.Envelope
	body       proto.Message     // local path: the sender's value
	senderNode string            // node that sent it (dedupe and chain scope)
	receipt    func(*pb.Receipt) // reliable: receipt to the sender; nil otherwise
	replyCh    chan<- localReply // local ask: where the reply goes
	remoteAsk  bool              // remote ask: reply goes back as a RESPONSE envelope
}

type localReply struct {
	msg proto.Message
	err error
}

// Spawn starts an actor named name on this node and returns its address.
func (n *Node) Spawn(name string, h Handler, opts ...SpawnOption) (Address, error) {
	if n.closed.Load() {
		return Address{}, ErrClosed
	}
	if h == nil {
		return Address{}, fmt.Errorf("node: spawn %q: nil handler", name)
	}
	addr := Address{Actor: name, Node: n.name}
	if err := addr.Validate(); err != nil {
		return Address{}, fmt.Errorf("node: spawn: %w", err)
	}
	o := spawnOptions{capacity: n.cfg.MailboxCapacity, overflow: n.cfg.Overflow}
	for _, opt := range opts {
		opt(&o)
	}
	a := &actor{n: n, name: name, handler: h}
	mb, err := mailbox.New(mailbox.Config[*delivery]{
		Capacity: o.capacity,
		Overflow: o.overflow,
		Handle:   a.handle,
		OnDrop:   a.dropped,
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
	return addr, nil
}

// Stop removes an actor; messages still in its mailbox are dropped (and
// reliable ones are redelivered by their senders later).
func (n *Node) Stop(name string) error {
	n.actorsMu.Lock()
	a, ok := n.actors[name]
	delete(n.actors, name)
	n.actorsMu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %q", ErrNoSuchActor, name)
	}
	a.mb.Close()
	return nil
}

func (n *Node) actor(name string) *actor {
	n.actorsMu.RLock()
	a := n.actors[name]
	n.actorsMu.RUnlock()
	return a
}

// post puts d into the actor's mailbox, applying the chain rule first.
func (a *actor) post(d *delivery) error {
	if d.receipt != nil && d.env.GetPrevSequence() != 0 && a.chainBroken(d) {
		return errChainBroken
	}
	chained := d.receipt != nil && d.env.GetSequence() != 0
	if chained {
		// A retry of the failed message is under way again. Cleared before
		// Post: once posted, the actor may fail it anew at any moment, and
		// that fresh mark must not be erased.
		a.clearFailed(d)
	}
	err := a.mb.Post(d)
	if err != nil && chained {
		a.markFailed(d)
	}
	return err
}

// chainBroken reports (and records) that d's predecessor failed here.
func (a *actor) chainBroken(d *delivery) bool {
	a.chainMu.Lock()
	defer a.chainMu.Unlock()
	if a.lastFailed[d.senderNode] != d.env.GetPrevSequence() {
		return false
	}
	a.lastFailed[d.senderNode] = d.env.GetSequence()
	return true
}

// clearFailed forgets d's failure mark: the message was accepted again, so
// what is chained behind it must not be refused for its old failure.
func (a *actor) clearFailed(d *delivery) {
	a.chainMu.Lock()
	if s, ok := a.lastFailed[d.senderNode]; ok && s == d.env.GetSequence() {
		delete(a.lastFailed, d.senderNode)
	}
	a.chainMu.Unlock()
}

func (a *actor) markFailed(d *delivery) {
	a.chainMu.Lock()
	if a.lastFailed == nil {
		a.lastFailed = make(map[string]uint64)
	}
	a.lastFailed[d.senderNode] = d.env.GetSequence()
	a.chainMu.Unlock()
}

// dropped is the mailbox's dead-letter hook: count it and answer whoever waits.
func (a *actor) dropped(d *delivery, r mailbox.DropReason) {
	a.n.stats.dropped.Add(1)
	a.n.log.Debug("message dropped", "actor", a.name, "reason", r.String(), "msg", d.env.GetMsgId())
	if r == mailbox.DroppedNewest {
		// Post also returns the error for the incoming message, and its
		// caller answers (and marks the chain); answering here too would
		// send two receipts for one message.
		return
	}
	var err error = &CapacityError{RetryAfter: 10 * time.Millisecond}
	code := pb.Receipt_CAPACITY
	if r == mailbox.DroppedPanicked { // the handler's own recover normally catches it first
		err, code = Permanent(fmt.Errorf("node: handler of %q panicked", a.name)), pb.Receipt_REJECTED
	}
	switch {
	case d.receipt != nil:
		a.markFailed(d)
		d.receipt(&pb.Receipt{MsgId: d.env.GetMsgId(), Code: code, RetryAfterMs: 10, Message: "dropped: " + r.String()})
	case d.replyCh != nil:
		d.replyCh <- localReply{err: err}
	case d.remoteAsk:
		a.n.respond(d.env, nil, err)
	}
}

// handle runs on the mailbox goroutine, one delivery at a time.
func (a *actor) handle(d *delivery) {
	env := d.env
	if d.receipt != nil {
		if env.GetPrevSequence() != 0 && a.chainBroken(d) {
			d.receipt(&pb.Receipt{MsgId: env.GetMsgId(), Code: pb.Receipt_TRANSIENT, Message: errChainBroken.Error()})
			return
		}
		if expired(env, time.Now()) {
			a.markFailed(d)
			d.receipt(&pb.Receipt{MsgId: env.GetMsgId(), Code: pb.Receipt_EXPIRED, Message: "expired before processing"})
			return
		}
		if scope, k := dedupeKey(d.senderNode, env); a.n.store.Seen(scope, k) {
			d.receipt(&pb.Receipt{MsgId: env.GetMsgId(), Code: pb.Receipt_DUPLICATE})
			return
		}
	}
	ctx := a.n.ctx
	if ms := env.GetExpiresAtUnixMs(); ms > 0 && (d.replyCh != nil || d.remoteAsk) {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, time.UnixMilli(ms))
		defer cancel()
	}
	reply, err := a.call(ctx, &Message{env: env, body: d.body})
	switch {
	case d.replyCh != nil:
		d.replyCh <- localReply{msg: reply, err: err}
	case d.remoteAsk:
		a.n.respond(env, reply, err)
	case d.receipt != nil:
		a.n.finishReliable(a, d, err)
	case err != nil:
		a.n.log.Debug("tell handler failed", "actor", a.name, "msg", env.GetMsgId(), "err", err)
	}
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

func expired(env *pb.Envelope, now time.Time) bool {
	ms := env.GetExpiresAtUnixMs()
	return ms > 0 && now.UnixMilli() >= ms
}
