package node

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/meshnode/meshnode/internal/queued"
	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
	"github.com/meshnode/meshnode/partition"
	"github.com/meshnode/meshnode/transport"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// Outcome says what TellReliable achieved.
type Outcome int

const (
	// Delivered: the recipient's handler returned without error.
	Delivered Outcome = iota + 1
	// Queued: fsynced in the local outbox; the relay delivers it later.
	Queued
	// DeadLettered: the direct attempt got a final verdict — the handler
	// refused the message as poison (Permanent), or its TTL ran out on the
	// way. It is in the dead-letter queue with the reason; it will not run.
	// (A direct attempt without a verdict whose TTL ran out meanwhile is
	// dead-lettered too, but TellReliable returns ErrOutcomeUnknown: it may
	// have run.)
	DeadLettered
)

func (o Outcome) String() string {
	switch o {
	case Delivered:
		return "Delivered"
	case Queued:
		return "Queued"
	case DeadLettered:
		return "DeadLettered"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// SendOption is a per-call knob of a send. WithHeaders, WithType and
// WithMethod apply to every send; the others to TellReliable and Dispatch
// only: given to Tell or Ask they are ErrBadOption.
type SendOption func(*sendOptions)

type sendOptions struct {
	key         string
	coalesce    string
	ttl         time.Duration
	ttlSet      bool
	headers     map[string]string
	msgType     string
	service     string
	method      string
	replyTo     Address
	correlation string
	noDirect    bool
	badOption   error
}

// WithIdempotencyKey gives the message the application's own key, for the
// application's retries (a second call after a crash, say): the receiver
// runs a key once per (sender node, recipient) within its key window
// (24 h by default), on disk. Retries of one TellReliable call need no key:
// the stream's watermark makes them take effect once.
func WithIdempotencyKey(key string) SendOption { return func(o *sendOptions) { o.key = key } }

// WithOverwrite coalesces: a message waiting in the outbox for the same
// recipient with the same coalesce key is replaced by this newer one
// (heartbeats, latest state). An older version never replaces a newer one,
// and a receiver never runs an older version after a newer one. A
// TellReliable that delivers it at once, without storing it, first writes
// its version down (one commit), so that Replay never brings an older
// version back over it. It is independent of WithIdempotencyKey.
func WithOverwrite(coalesceKey string) SendOption {
	return func(o *sendOptions) { o.coalesce = coalesceKey }
}

// WithTTL makes the message expire: it is never processed after ttl and
// goes to the dead-letter queue with reason "expired". The TTL is measured
// by each side on its own clock (the time left travels with the message),
// so it works between nodes whose wall clocks disagree; the receiver counts
// it from a copy's arrival, so time in transit (in buffers, at a forwarder
// during a partial partition) is not counted. When a copy sent through a
// forwarder got no answer and may still arrive and run, the dead letter's
// reason says its outcome is unknown (outbox.ReasonExpiredUnknown). It must
// be positive and at most the outbox's retention limit (23 days by
// default).
func WithTTL(ttl time.Duration) SendOption {
	return func(o *sendOptions) { o.ttl, o.ttlSet = ttl, true }
}

// WithHeaders adds application headers (for every kind of send).
func WithHeaders(h map[string]string) SendOption {
	return func(o *sendOptions) { o.headers = maps.Clone(h) }
}

// WithType sets the envelope's application type string (for every kind of send).
func WithType(t string) SendOption { return func(o *sendOptions) { o.msgType = t } }

// TellReliable delivers msg at least once, with an exactly-once effect per
// stream: the receiver keeps a durable watermark of what it ran from this
// node's outbox, so retries, redeliveries and copies never run twice (see
// the package doc for the one crash window) and run in the order they were
// sent.
//
// If the peer is alive and nothing of the stream is waiting or in flight,
// it makes one direct attempt (bounded by the relay's DirectTimeout) and
// returns Delivered when the handler succeeded, or DeadLettered when it
// refused the message as poison or its TTL ran out. Otherwise, or when that
// attempt has no final verdict, it stores the message and returns Queued
// once it is fsynced; the relay delivers it later, paced by the peer's AIMD
// limit. A message too large for the wire is refused with ErrTooLarge
// before anything is stored. A context that is done before the call stores
// nothing; once storing has begun it is finished regardless. It returns an
// error only when the message could not be stored either; then nothing was
// stored, but if a direct attempt was made without a verdict (it timed out,
// or the receiver ran the message and could not record that), the
// recipient may have run it, and the error says so (ErrOutcomeUnknown): a
// retry under the same idempotency key (WithIdempotencyKey) cannot run it
// twice. ErrOutcomeUnknown is also returned, with the message in the
// dead-letter queue, when such an attempt outlasted the message's TTL.
func (n *Node) TellReliable(ctx context.Context, to Address, msg proto.Message, opts ...SendOption) (Outcome, error) {
	if n.closed.Load() {
		return 0, ErrClosed
	}
	if err := to.Validate(); err != nil {
		return 0, err
	}
	c, err := n.newCall(CallReliable, to, msg, nil, opts)
	defer putCall(c)
	if err != nil {
		return 0, fmt.Errorf("node: tell-reliable %s: %w", to, err)
	}
	if n.invoke == nil {
		err = n.send(ctx, c)
	} else {
		err = n.invoke(ctx, c)
	}
	if err != nil {
		return 0, err
	}
	return c.Outcome, nil
}

// tellReliable is TellReliable without interceptors.
func (n *Node) tellReliable(ctx context.Context, c *Call) (Outcome, error) {
	to := c.To
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("node: tell-reliable %s: %w", to, err)
	}
	body, err := packBody(c.Request)
	if err != nil {
		return 0, err
	}
	o := c.o
	o.headers, o.service, o.method = c.Headers, c.Service, c.Method
	sm, err := n.reliableMessage(to, body, &o)
	if err != nil {
		return 0, fmt.Errorf("node: tell-reliable %s: %w", to, err)
	}
	n.warnUnknown(to.Node)
	res, err := n.relay.Send(ctx, sm, !o.noDirect)
	if err != nil {
		n.stats.reliableFailed.Add(1)
		return 0, fmt.Errorf("node: tell-reliable %s: %w", to, n.mapRelayErr(err))
	}
	switch res.Outcome {
	case partition.Delivered:
		n.stats.reliableDelivered.Add(1)
		return Delivered, nil
	case partition.DeadLettered:
		n.stats.reliableDeadLettered.Add(1)
		return DeadLettered, nil
	}
	n.stats.reliableQueued.Add(1)
	return Queued, nil
}

// DispatchResult counts a fan-out's outcome per target.
type DispatchResult struct {
	Accepted int              // stored in the outbox (fsynced)
	Rejected int              // refused (bad address, too large, store error)
	Errors   map[string]error // why, per refused target
}

// Dispatch sends msg to many recipients through the outbox (no direct
// attempt) and returns how many were accepted and rejected: the fan-out of
// waves and thundering herds. Each target gets its own message in its own
// stream; the commits are bounded in bytes, so a large body to many
// targets is stored in several transactions.
func (n *Node) Dispatch(ctx context.Context, targets []Address, msg proto.Message, opts ...SendOption) (DispatchResult, error) {
	if n.closed.Load() {
		return DispatchResult{}, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return DispatchResult{}, fmt.Errorf("node: dispatch: %w", err)
	}
	body, err := packBody(msg) // once: every message shares the read-only body
	if err != nil {
		return DispatchResult{}, err
	}
	var o sendOptions
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if n.checkReliable(&o); o.badOption != nil {
		return DispatchResult{}, fmt.Errorf("node: dispatch: %w", o.badOption)
	}
	res := DispatchResult{Errors: map[string]error{}}
	sms := make([]*pb.StoredMessage, 0, len(targets))
	for _, t := range targets {
		if err := t.Validate(); err != nil {
			res.Rejected++
			res.Errors[t.String()] = err
			continue
		}
		sm, err := n.reliableMessage(t, body, &o)
		if err != nil {
			res.Rejected++
			res.Errors[t.String()] = err
			continue
		}
		sms = append(sms, sm)
	}
	for i, err := range n.relay.Store(ctx, sms) {
		if err != nil {
			res.Rejected++
			res.Errors[sms[i].GetEnvelope().GetRecipient()] = n.mapRelayErr(err)
			continue
		}
		res.Accepted++
	}
	n.stats.reliableQueued.Add(uint64(res.Accepted))
	return res, nil
}

// MaxIdempotencyKey is the longest idempotency or coalesce key accepted, in bytes.
const MaxIdempotencyKey = 1024

// checkReliable sets o.badOption to the first option out of range for a
// reliable send.
func (n *Node) checkReliable(o *sendOptions) {
	switch {
	case len(o.key) > MaxIdempotencyKey:
		o.badOption = fmt.Errorf("idempotency key of %d bytes (max %d): %w", len(o.key), MaxIdempotencyKey, ErrBadKey)
	case len(o.coalesce) > MaxIdempotencyKey:
		o.badOption = fmt.Errorf("coalesce key of %d bytes (max %d): %w", len(o.coalesce), MaxIdempotencyKey, ErrBadKey)
	case o.ttlSet && o.ttl <= 0:
		o.badOption = fmt.Errorf("TTL %v: %w: it must be positive", o.ttl, ErrBadOption)
	case o.ttl > n.store.Config().MaxAge():
		o.badOption = fmt.Errorf("TTL %v: %w: a message waits at most %v", o.ttl, ErrBadOption, n.store.Config().MaxAge())
	default:
		o.badOption = n.checkHeaders(o)
	}
	if o.badOption == nil {
		o.badOption = n.checkReplyTo(o)
	}
}

// checkHeaders refuses headers a peer would refuse (too many, too large),
// before anything is sent or stored.
func (n *Node) checkHeaders(o *sendOptions) error {
	if len(o.headers) == 0 {
		return nil
	}
	if err := n.cfg.Transport.CheckHeaders(o.headers); err != nil {
		return fmt.Errorf("%w: %w", ErrBadOption, err)
	}
	return nil
}

// reliableMessage builds the stored form of a reliable message to to.
func (n *Node) reliableMessage(to Address, body *anypb.Any, o *sendOptions) (*pb.StoredMessage, error) {
	if o.badOption != nil {
		return nil, o.badOption
	}
	now := time.Now()
	m := new(storedParts)
	env := &m.env
	*env = pb.Envelope{
		ProtocolVersion: pb.ProtocolVersion,
		MsgId:           mailbox.NewID(),
		IdempotencyKey:  o.key,
		Sender:          n.sender,
		Recipient:       to.String(),
		CreatedAtUnixMs: now.UnixMilli(),
		Type:            o.msgType,
		Headers:         o.headers,
		Body:            body,
		Rpc:             &m.rpc,
		Receipt:         pb.Envelope_RECEIPT_PROCESSED,
		TtlMs:           o.ttl.Milliseconds(),
	}
	m.rpc = pb.RpcMeta{Kind: pb.RpcMeta_EVENT, Service: o.service, Method: o.method}
	if o.coalesce != "" {
		env.Conflict, env.CoalesceKey = pb.Envelope_OVERWRITE, o.coalesce
	}
	if !o.replyTo.IsZero() {
		env.Rpc.Kind, env.Rpc.ReplyTo, env.Rpc.CorrelationId = pb.RpcMeta_REQUEST, o.replyTo.String(), o.correlation
		if env.Rpc.CorrelationId == "" {
			env.Rpc.CorrelationId = mailbox.NewID()
		}
	}
	if n.fwd.on && to.Node != n.name {
		// It may have to go through a forwarder, with its origin: one
		// that fits only directly would hold its stream for as long as
		// the direct path fails. One that fits with its origin fits
		// without; the direct check only words the error of one that
		// fits neither way.
		if err := n.transport.CheckSizeForwarded(env, n.name); err != nil {
			if derr := n.transport.CheckSize(env); derr != nil {
				err = derr
			}
			return nil, fmt.Errorf("%w: %w", ErrTooLarge, err)
		}
	} else if err := n.transport.CheckSize(env); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTooLarge, err)
	}
	m.sm = pb.StoredMessage{Envelope: env, CreatedElapsedMs: n.store.ElapsedMs(), FirstEnqueuedUnixMs: now.UnixMilli()}
	return &m.sm, nil
}

// storedParts is a reliable message's stored form, its envelope and its
// RpcMeta in one allocation.
type storedParts struct {
	sm  pb.StoredMessage
	env pb.Envelope
	rpc pb.RpcMeta
}

// warnUnknown logs a reliable send to a node no member has ever seen: it
// waits until that node joins or the message's age runs out (a typo in a
// node name would otherwise queue silently).
func (n *Node) warnUnknown(peer string) {
	m := n.membership()
	if peer == n.name || m == nil || m.Alive(peer) {
		return
	}
	if _, known := m.Member(peer); known {
		return
	}
	n.stats.unknownPeer.Add(1)
	if _, warned := n.warnedPeers.Load(peer); warned {
		return
	}
	if _, warned := n.warnedPeers.LoadOrStore(peer, true); !warned {
		n.log.Warn("reliable message queued for a node no member has seen; it waits until that node joins or its age runs out, or is dropped with the outbox's drop command",
			"peer", peer)
	}
}

func (n *Node) mapRelayErr(err error) error {
	if errors.Is(err, partition.ErrClosed) || errors.Is(err, outbox.ErrClosed) {
		return fmt.Errorf("%w: %w", ErrClosed, err)
	}
	return err
}

func (n *Node) alive(peer string) bool {
	m := n.membership()
	return peer == n.name || (m != nil && m.Alive(peer))
}

// deliverer is the relay's view of the network.
type deliverer struct{ n *Node }

func (d deliverer) Alive(peer string) bool { return d.n.alive(peer) }

func (d deliverer) Deliver(ctx context.Context, peer string, msgs []*pb.Envelope) ([]*pb.Receipt, error) {
	if peer == d.n.name {
		return d.n.deliverLocal(ctx, msgs)
	}
	rcs, err := d.n.transport.RequestBatch(ctx, peer, msgs)
	var ee *transport.EncodeError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		errs := make(map[int]error, len(ee.Errs))
		for i, e := range ee.Errs {
			if errors.Is(e, transport.ErrLimitUnconfirmed) {
				// Over a limit the peer may no longer have: later.
				e = fmt.Errorf("%w: %w", partition.ErrNotYet, e)
			}
			errs[i] = e
		}
		err = errors.Join(&partition.UnsendableError{Errs: errs}, err)
	case errors.Is(err, transport.ErrQueueFull):
		err = congested(err)
	case errors.Is(err, transport.ErrUnreachable), errors.Is(err, transport.ErrConnLost):
		// The path failed: the relay moves a peer that stays alive to a
		// forwarder when this repeats (partition's routes).
		err = fmt.Errorf("%w: %w", partition.ErrUnreachable, d.n.mapSendErr(err))
	default:
		err = d.n.mapSendErr(err)
	}
	return rcs, err
}

// deliverLocal hands reliable envelopes to actors on this node and waits
// for their receipts, as the transport would for a remote peer.
func (n *Node) deliverLocal(ctx context.Context, msgs []*pb.Envelope) ([]*pb.Receipt, error) {
	type indexed struct {
		i  int
		rc *pb.Receipt
	}
	ch := make(chan indexed, len(msgs)) // buffered: late receipts never block an actor
	self := n.self()
	for i, env := range msgs {
		n.deliverIncoming(self, env, func(rc *pb.Receipt) { ch <- indexed{i, rc} })
	}
	queued.Signal(ctx) // in the mailboxes, in order
	out := make([]*pb.Receipt, len(msgs))
	for got := 0; got < len(msgs); got++ {
		select {
		case r := <-ch:
			out[r.i] = r.rc
		case <-ctx.Done():
			return out, fmt.Errorf("node: local delivery: %w", ctx.Err())
		case <-n.ctx.Done():
			return out, ErrClosed
		}
	}
	return out, nil
}
