package node

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshnode/meshnode/internal/envcodec"
	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/mesh"
	"github.com/meshnode/meshnode/partition"
	"github.com/meshnode/meshnode/transport"
	"google.golang.org/protobuf/proto"
)

// Tell sends msg to an actor, at most once. It returns once the message is
// in a local mailbox or handed to the peer's connection. A full local
// mailbox gives *CapacityError (errors.Is ErrMailboxFull); a remote one drops
// the message and counts it at the receiver. A full send queue to the
// peer gives *CapacityError too, whose RetryAfter is the connection's
// estimate of when the message fits (errors.Is transport.ErrQueueFull). A
// peer known to be down gives ErrUnreachable at once, without a dial. A
// message over the frame limit, ours or the one the peer's node announced,
// gives ErrTooLarge.
//
// The handler's context carries the deadline of ctx (across the wire as
// the time left) and, on this node, its values; it is not canceled with
// ctx, since Tell returns before the handler runs. A message whose
// deadline passed before its handler could run is not run (counted in
// Stats.Expired). Options: WithHeaders, WithType, WithMethod.
func (n *Node) Tell(ctx context.Context, to Address, msg proto.Message, opts ...SendOption) error {
	if len(opts) == 0 && n.invoke == nil {
		c := Call{Kind: CallTell, To: to, Request: msg}
		return n.tell(ctx, &c)
	}
	c, err := n.newCall(CallTell, to, msg, nil, opts)
	defer putCall(c)
	if err != nil {
		n.stats.tellFailed.Add(1)
		return fmt.Errorf("node: tell %s: %w", to, err)
	}
	if n.invoke == nil {
		return n.tell(ctx, c)
	}
	return n.invoke(ctx, c)
}

// tell is Tell without interceptors. It does not keep c.
func (n *Node) tell(ctx context.Context, c *Call) error {
	to := c.To
	// Not check: a remote tell's peer is looked up once, by the transport,
	// which refuses one known to be down as check does, without a dial.
	if err := n.checkAddress(to); err != nil {
		n.stats.tellFailed.Add(1)
		return err
	}
	if to.Node != n.name {
		return n.tellRemote(ctx, c)
	}
	a, err := n.localActor(to.Actor)
	if err != nil {
		n.stats.tellFailed.Add(1)
		return fmt.Errorf("node: tell %s: %w", to, err)
	}
	d := n.localDelivery(c, pb.RpcMeta_EVENT)
	n.localDeadline(ctx, d)
	if err := a.post(d); err != nil {
		n.stats.tellFailed.Add(1)
		return fmt.Errorf("node: tell %s: %w", to, err)
	}
	n.stats.tellSent.Add(1)
	return nil
}

// wallBase is a time.Now reading (wall and monotonic) that wallNow counts
// from, taken again once it is a second old.
var wallBase atomic.Pointer[time.Time]

// wallNow is time.Now at the cost of a monotonic reading alone (half of
// one here): the wall time of the last second's reading plus the
// monotonic time since, so a step of the wall clock shows within a
// second. The result keeps its monotonic reading, as time.Now's does.
func wallNow() time.Time {
	if b := wallBase.Load(); b != nil {
		if d := time.Since(*b); d >= 0 && d < time.Second {
			return b.Add(d)
		}
	}
	t := time.Now()
	wallBase.Store(&t)
	return t
}

// tellRemote is Tell to another node. Its envelope comes from a pool: the
// transport has encoded it by the time Send returns.
func (n *Node) tellRemote(ctx context.Context, c *Call) error {
	// A full send queue refuses before the body is marshalled: callers
	// retrying large messages against it would otherwise spend a copy of
	// each on every attempt, and starve the connection that drains it.
	if err := n.transport.Admit(c.To.Node, c.Request); err != nil {
		n.stats.tellFailed.Add(1)
		return fmt.Errorf("node: tell %s: %w", c.To, n.mapSendErr(err))
	}
	o := getOutEnv()
	defer o.release()
	now := wallNow()
	var ttl int64
	if dl, ok := ctx.Deadline(); ok {
		// The time left, not the deadline: the two clocks need not agree.
		ttl = max(dl.Sub(now).Milliseconds(), 1)
	}
	var err error
	if wire, ok := o.encodePlain(n.name, c, pb.RpcMeta_EVENT, now, ttl); ok {
		err = n.transport.SendEncoded(ctx, c.To.Node, o.toStr, wire, o.named)
	} else {
		if err := o.fill(n.name, c.To, pb.RpcMeta_EVENT, c.Request, now); err != nil {
			return err
		}
		o.setCall(c)
		o.env.TtlMs = ttl
		err = n.transport.Send(ctx, c.To.Node, &o.env)
	}
	if err != nil {
		n.stats.tellFailed.Add(1)
		return fmt.Errorf("node: tell %s: %w", c.To, n.mapSendErr(err))
	}
	n.stats.tellSent.Add(1)
	return nil
}

// Ask sends req to an actor and waits for its reply, which it decodes into
// resp (resp may be nil to ignore the reply). Without a deadline in ctx,
// Config.AskTimeout applies. Errors: *CapacityError when the actor's mailbox
// is full, ErrNoSuchActor, *RemoteError for a handler error (or a reply too
// large for the wire), ErrUnreachable, ErrTooLarge for a request over a
// frame limit, or the context's error.
//
// The handler's context carries the deadline (across the wire as the time
// left) and, on this node, the values of ctx. Options: WithHeaders,
// WithType, WithMethod.
func (n *Node) Ask(ctx context.Context, to Address, req proto.Message, resp proto.Message, opts ...SendOption) error {
	start := time.Now()
	var err error
	switch {
	case len(opts) == 0 && n.invoke == nil:
		c := Call{Kind: CallAsk, To: to, Request: req, Reply: resp}
		err = n.ask(ctx, &c, start)
	default:
		var c *Call
		if c, err = n.newCall(CallAsk, to, req, resp, opts); err != nil {
			err = fmt.Errorf("node: ask %s: %w", to, err)
		} else if n.invoke == nil {
			err = n.ask(ctx, c, start)
		} else {
			err = n.invoke(ctx, c)
		}
		putCall(c)
	}
	n.stats.observeAsk(time.Since(start), err)
	return err
}

// ask is Ask without interceptors. It does not keep c.
func (n *Node) ask(ctx context.Context, c *Call, now time.Time) error {
	to := c.To
	if err := n.check("ask", to); err != nil {
		return err
	}
	dl, hasDL := ctx.Deadline()
	var expired <-chan time.Time // AskTimeout's, when ctx has no deadline
	switch {
	case hasDL:
	case to.Node == n.name || n.cfg.AskTimeout < 2*n.cfg.Transport.HandshakeTimeout:
		// The deadline must reach the handler's context here, or bound
		// a dial that could outlast AskTimeout.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, n.cfg.AskTimeout)
		defer cancel()
		dl, _ = ctx.Deadline()
	default:
		// A pooled timer instead of a context per ask (four allocations):
		// Send waits for a dial at most twice HandshakeTimeout (the dial,
		// then the peer's own connection if that won the tie-break),
		// which is within AskTimeout here, and the timer runs from here,
		// so the ask still ends at AskTimeout.
		t := getAskTimer(n.cfg.AskTimeout)
		defer putAskTimer(t)
		expired, dl = t.C, now.Add(n.cfg.AskTimeout)
	}
	if to.Node == n.name {
		return n.askLocal(ctx, c)
	}
	// The envelope is pooled: the transport has encoded it when Send
	// returns, and only its msg id (an immutable string) is kept after.
	if err := n.transport.Admit(to.Node, c.Request); err != nil {
		return fmt.Errorf("node: ask %s: %w", to, n.mapSendErr(err))
	}
	o := getOutEnv()
	defer func() { o.release() }() // o is released early, on the success path
	if err := o.fill(n.name, to, pb.RpcMeta_REQUEST, c.Request, now); err != nil {
		return err
	}
	o.setCall(c)
	env := &o.env
	// The time left, not the deadline: the two clocks need not agree.
	env.TtlMs = max(dl.Sub(now).Milliseconds(), 1)
	corr := env.GetMsgId()
	o.rpc.CorrelationId = corr
	o.rpc.ReplyTo = env.GetSender() // "@node": the node, not an actor, receives the RESPONSE
	// Only to.Node may answer it: another member's response is refused.
	ch := getAskChan()
	if err := n.responses.RegisterChan(corr, to.Node, ch); err != nil {
		return fmt.Errorf("node: ask %s: %w", to, err)
	}
	n.trackAsk(to.Node, corr)
	defer n.untrackAsk(to.Node, corr)
	err := n.transport.Send(ctx, to.Node, env)
	o.release() // before the wait: another send can reuse it meanwhile
	o = nil
	if err != nil {
		n.responses.Cancel(corr)
		return fmt.Errorf("node: ask %s: %w", to, n.mapSendErr(err))
	}
	select {
	case r, ok := <-ch:
		if !ok {
			// Pruned: the ask outlived AskResponseTTL, after which the
			// registry no longer keeps a waiter.
			return fmt.Errorf("node: ask %s: no response within AskResponseTTL (%v): %w", to, n.cfg.AskResponseTTL, context.DeadlineExceeded)
		}
		askChans.Put(ch) // received: the registry holds ch no more
		err := readResponse(to, r, c.Reply)
		envcodec.Recycle(r) // nothing refers to it: what was read from it is copied or keeps no part of it
		return err
	case <-ctx.Done():
		n.responses.Cancel(corr)
		return fmt.Errorf("node: ask %s: %w", to, ctx.Err())
	case <-expired:
		n.responses.Cancel(corr)
		return fmt.Errorf("node: ask %s: %w", to, context.DeadlineExceeded)
	case <-n.ctx.Done():
		n.responses.Cancel(corr)
		return fmt.Errorf("node: ask %s: %w", to, ErrClosed)
	}
}

// readResponse returns an ask's outcome from its response r, decoding a
// reply into resp (when not nil).
func readResponse(to Address, r *pb.Envelope, resp proto.Message) error {
	if err := mailbox.ErrorOf(r); err != nil {
		var re *RemoteError
		if errors.As(err, &re) && re.Code == mailbox.Unavailable {
			return fmt.Errorf("node: ask %s: %w: %w", to, ErrUnreachable, err)
		}
		return fmt.Errorf("node: ask %s: %w", to, err)
	}
	if resp != nil {
		if r.GetBody() == nil {
			return fmt.Errorf("node: ask %s: reply has no body", to)
		}
		if err := r.GetBody().UnmarshalTo(resp); err != nil {
			return fmt.Errorf("node: ask %s: decode reply: %w", to, err)
		}
	}
	return nil
}

// askChans are the response channels of asks that received their
// response: empty, and no longer held by the registry.
var askChans sync.Pool

func getAskChan() chan *pb.Envelope {
	if ch, ok := askChans.Get().(chan *pb.Envelope); ok {
		return ch
	}
	return make(chan *pb.Envelope, 1)
}

// askTimers are the stopped timers of asks without a deadline. A stopped
// timer's channel holds nothing (Go 1.23 timers), so one can be reused.
var askTimers sync.Pool

func getAskTimer(d time.Duration) *time.Timer {
	if t, ok := askTimers.Get().(*time.Timer); ok {
		t.Reset(d)
		return t
	}
	return time.NewTimer(d)
}

func putAskTimer(t *time.Timer) {
	t.Stop()
	askTimers.Put(t)
}

func (n *Node) askLocal(ctx context.Context, c *Call) error {
	to := c.To
	a, err := n.localActor(to.Actor)
	if err != nil {
		return fmt.Errorf("node: ask %s: %w", to, err)
	}
	ch := make(chan localReply, 1) // buffered: the actor never blocks on a gone asker
	d := n.localDelivery(c, pb.RpcMeta_REQUEST)
	d.replyCh = ch
	n.localDeadline(ctx, d)
	if err := a.post(d); err != nil {
		return fmt.Errorf("node: ask %s: %w", to, err)
	}
	select {
	case r := <-ch:
		if r.err != nil {
			return fmt.Errorf("node: ask %s: %w", to, r.err)
		}
		if resp := c.Reply; resp != nil && r.msg != nil {
			if r.msg.ProtoReflect().Descriptor().FullName() != resp.ProtoReflect().Descriptor().FullName() {
				return fmt.Errorf("node: ask %s: reply is %s, not %s", to,
					r.msg.ProtoReflect().Descriptor().FullName(), resp.ProtoReflect().Descriptor().FullName())
			}
			proto.Reset(resp)
			proto.Merge(resp, r.msg)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("node: ask %s: %w", to, ctx.Err())
	case <-n.ctx.Done():
		return fmt.Errorf("node: ask %s: %w", to, ErrClosed)
	}
}

// localDeadline gives a local delivery its caller's deadline and values.
func (n *Node) localDeadline(ctx context.Context, d *delivery) {
	if dl, ok := ctx.Deadline(); ok {
		d.deadline = dl
		d.deadlineMs = n.store.ElapsedMs() + max(time.Until(dl).Milliseconds(), 1)
	}
	if ctx != context.Background() && ctx != context.TODO() {
		d.values = ctx
	}
}

// localActor is actor for a local Tell or Ask; while the node stops
// (Shutdown) it refuses with ErrClosed, so nothing new enters a mailbox
// being drained.
func (n *Node) localActor(name string) (*actor, error) {
	if n.draining.Load() {
		return nil, ErrClosed
	}
	if a := n.actor(name); a != nil {
		return a, nil
	}
	return nil, ErrNoSuchActor
}

// check validates a destination and refuses sends to dead peers at once
// (and to every other node before Start); op names the send in errors.
func (n *Node) check(op string, to Address) error {
	if err := n.checkAddress(to); err != nil {
		return err
	}
	if !n.alive(to.Node) {
		return fmt.Errorf("node: %s %s: %w", op, to, ErrUnreachable)
	}
	return nil
}

// checkAddress is check without the liveness of to's node.
func (n *Node) checkAddress(to Address) error {
	if n.closed.Load() {
		return ErrClosed
	}
	return to.Validate()
}

// callEnvelope builds the envelope of a local Tell or Ask.
func (n *Node) callEnvelope(c *Call, kind pb.RpcMeta_Kind) *pb.Envelope {
	env := envcodec.NewEnvelope()
	env.ProtocolVersion = pb.ProtocolVersion
	env.MsgId = mailbox.NewID()
	env.Sender = n.sender
	env.Recipient = c.To.String()
	env.CreatedAtUnixMs = time.Now().UnixMilli()
	env.Type = c.o.msgType
	env.Headers = c.Headers
	env.Rpc.Kind, env.Rpc.Service, env.Rpc.Method = kind, c.Service, c.Method
	return env
}

// localDelivery is the delivery of a local tell or ask: from a pool, with
// its envelope, both reused once the actor has answered (finish).
func (n *Node) localDelivery(c *Call, kind pb.RpcMeta_Kind) *delivery {
	d := deliveryPool.Get().(*delivery)
	d.Message = Message{env: n.callEnvelope(c, kind), body: c.Request, from: n.name}
	d.ownsEnv, d.pooled = true, true
	return d
}

// sendQueueFull is a refusal by this node's own send queue to the peer: a
// *CapacityError (errors.As finds it, with the transport's RetryAfter) that
// does not read as the recipient's mailbox being full.
type sendQueueFull struct {
	ce  *CapacityError
	err error // the transport's refusal
}

func (e *sendQueueFull) Error() string {
	return fmt.Sprintf("node: send queue full, retry after %v: %v", e.ce.RetryAfter, e.err)
}

func (e *sendQueueFull) Unwrap() []error { return []error{e.ce, e.err} }

// congested wraps a full send queue's refusal for the relay, with the
// transport's estimate of when the queue has room.
func congested(err error) error {
	ce := &partition.CongestedError{Err: err}
	if qf := (*transport.QueueFullError)(nil); errors.As(err, &qf) {
		ce.RetryAfter = qf.RetryAfter
	}
	return ce
}

// mapSendErr turns lower-layer send errors into the node's sentinels.
func (n *Node) mapSendErr(err error) error {
	switch {
	case errors.Is(err, transport.ErrUnreachable), errors.Is(err, mesh.ErrUnreachable), errors.Is(err, transport.ErrConnLost):
		return fmt.Errorf("%w: %w", ErrUnreachable, err)
	case errors.Is(err, transport.ErrQueueFull):
		// The transport's estimate of when the queue has room, in a
		// CapacityError as for a full mailbox, with a text of its own.
		ra := 5 * time.Millisecond
		if qf := (*transport.QueueFullError)(nil); errors.As(err, &qf) {
			ra = qf.RetryAfter
		}
		return &sendQueueFull{ce: &CapacityError{RetryAfter: ra}, err: err}
	case errors.Is(err, transport.ErrClosed):
		return fmt.Errorf("%w: %w", ErrClosed, err)
	case errors.Is(err, transport.ErrFrameTooLarge):
		// Larger than the frame limit the recipient's node announced
		// (ours was checked before): never sendable to it as it is.
		return fmt.Errorf("%w: %w", ErrTooLarge, err)
	}
	return err
}

func (n *Node) trackAsk(peer, corr string) {
	n.askMu.Lock()
	m := n.asks[peer]
	if m == nil {
		m = make(map[string]struct{})
		n.asks[peer] = m
	}
	m[corr] = struct{}{}
	n.askMu.Unlock()
}

func (n *Node) untrackAsk(peer, corr string) {
	n.askMu.Lock()
	// The peer's map stays when it empties (failAsks drops it when the
	// peer goes): asks one after another would otherwise make it anew
	// each time, two allocations per ask.
	if m := n.asks[peer]; m != nil {
		delete(m, corr)
	}
	n.askMu.Unlock()
}

// failAsks answers every pending ask to peer with an Unavailable status
// and drops the responses it had sent early.
func (n *Node) failAsks(peer, reason string) {
	n.askMu.Lock()
	m := n.asks[peer]
	delete(n.asks, peer)
	n.askMu.Unlock()
	for corr := range m {
		env := &pb.Envelope{Rpc: &pb.RpcMeta{Kind: pb.RpcMeta_RESPONSE, CorrelationId: corr}}
		mailbox.SetError(env, &mailbox.RemoteError{Code: mailbox.Unavailable, Message: reason})
		n.responses.Deliver(peer, env)
	}
	n.responses.ForgetPeer(peer)
}
