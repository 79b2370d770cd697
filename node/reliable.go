package node

import (
	"context"
	"fmt"
	"maps"
	"time"

	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/mailbox/pb"
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
)

func (o Outcome) String() string {
	switch o {
	case Delivered:
		return "Delivered"
	case Queued:
		return "Queued"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// SendOption is a per-call knob of TellReliable and Dispatch.
type SendOption func(*sendOptions)

type sendOptions struct {
	key       string
	overwrite bool
	ttl       time.Duration
	headers   map[string]string
	msgType   string
}

// WithIdempotencyKey gives the message a key: the receiver processes a key
// once within its dedupe window, so retries and replays take effect once.
func WithIdempotencyKey(key string) SendOption { return func(o *sendOptions) { o.key = key } }

// WithOverwrite coalesces: a waiting message to the same recipient with the
// same key is replaced by this newer one (heartbeats, latest state).
func WithOverwrite(key string) SendOption {
	return func(o *sendOptions) { o.key, o.overwrite = key, true }
}

// WithTTL makes the message expire: it is never delivered after ttl and goes
// to the dead-letter queue with reason "expired".
func WithTTL(ttl time.Duration) SendOption { return func(o *sendOptions) { o.ttl = ttl } }

// WithHeaders adds application headers.
func WithHeaders(h map[string]string) SendOption {
	return func(o *sendOptions) { o.headers = maps.Clone(h) }
}

// WithType sets the envelope's application type string.
func WithType(t string) SendOption { return func(o *sendOptions) { o.msgType = t } }

// DirectAttemptTimeout bounds TellReliable's direct attempt; past it the
// message goes to the outbox (a slow handler does not hold the caller).
const DirectAttemptTimeout = 2 * time.Second

// TellReliable delivers msg at least once (exactly-once effect with a key).
// If the peer is alive and nothing waits in the outbox for the recipient,
// it tries a direct delivery and returns Delivered when the handler
// succeeded. Otherwise, or when that attempt fails, it stores the message in
// the outbox and returns Queued once it is fsynced. A direct attempt that the
// handler refused as poison (Permanent) or that arrived expired is stored in
// the dead-letter queue instead, also Queued, and not run again. A context
// that is done before the call stores nothing; once storing has begun it is
// finished regardless. It returns an error only when the message could not
// be stored either; then nothing was stored.
func (n *Node) TellReliable(ctx context.Context, to Address, msg proto.Message, opts ...SendOption) (Outcome, error) {
	if n.closed.Load() {
		return 0, ErrClosed
	}
	if err := to.Validate(); err != nil {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("node: tell-reliable %s: %w", to, err)
	}
	body, err := packBody(msg)
	if err != nil {
		return 0, err
	}
	env, err := n.reliableEnvelope(to, body, opts)
	if err != nil {
		return 0, err
	}
	// Rule 1 needs no lock: Pending counts every committed message until its
	// ack, so a call that starts after another returned Queued sees it and
	// goes behind it; calls that overlap in time have no order to keep. Not
	// holding a lock across the fsync lets concurrent senders share commits.
	var refused *pb.Receipt
	if n.store.Pending(env.GetRecipient()) == 0 && n.alive(to.Node) {
		rc := n.tryDirect(ctx, to, env)
		switch rc.GetCode() {
		case pb.Receipt_PROCESSED, pb.Receipt_DUPLICATE:
			return Delivered, nil
		case pb.Receipt_REJECTED, pb.Receipt_EXPIRED:
			refused = rc
		}
	}
	// From here on the message is stored whatever the caller's context does:
	// a direct copy may already wait in the peer's mailbox, so an error now
	// would report a message that can still take effect as not sent.
	sctx := context.WithoutCancel(ctx)
	if refused != nil {
		// The handler refused it as poison (or it expired on the way): it
		// goes to the dead-letter queue, not through the relay to run again.
		reason := "expired"
		if refused.GetCode() == pb.Receipt_REJECTED {
			reason = "rejected: " + refused.GetMessage()
		}
		err = n.store.DeadLetter(sctx, env, reason)
	} else {
		err = n.store.Enqueue(sctx, env)
	}
	if err != nil {
		n.stats.reliableFailed.Add(1)
		return 0, fmt.Errorf("node: tell-reliable %s: %w", to, err)
	}
	n.stats.reliableQueued.Add(1)
	return Queued, nil
}

// tryDirect makes one direct attempt and returns its receipt (nil when none
// came back in time). The attempt sends a copy with its own msg id: the
// stored envelope stays the caller's, and a late receipt of this attempt
// cannot be taken for one of a later attempt.
func (n *Node) tryDirect(ctx context.Context, to Address, env *pb.Envelope) *pb.Receipt {
	dctx, cancel := context.WithTimeout(ctx, DirectAttemptTimeout)
	defer cancel()
	attempt := proto.CloneOf(env)
	attempt.MsgId = mailbox.NewID()
	attempt.Attempt = 1
	var rc *pb.Receipt
	if to.Node == n.name {
		rcs, _ := n.deliverLocal(dctx, []*pb.Envelope{attempt})
		rc = rcs[0]
	} else {
		rc, _ = n.transport.Request(dctx, to.Node, attempt)
	}
	switch rc.GetCode() {
	case pb.Receipt_PROCESSED, pb.Receipt_DUPLICATE:
		n.store.Limiter(to.Node).OnSuccess()
		n.stats.reliableDirect.Add(1)
	case pb.Receipt_CAPACITY:
		n.store.Limiter(to.Node).OnCapacity()
	}
	return rc
}

// DispatchResult counts a fan-out's outcome per target.
type DispatchResult struct {
	Accepted int              // stored in the outbox (fsynced)
	Rejected int              // refused (bad address, expired, store error)
	Errors   map[string]error // why, per refused target
}

// Dispatch sends msg to many recipients through the outbox in one commit and
// returns how many were accepted and rejected (the seed's DispatchWithTargets).
func (n *Node) Dispatch(ctx context.Context, targets []Address, msg proto.Message, opts ...SendOption) (DispatchResult, error) {
	if n.closed.Load() {
		return DispatchResult{}, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return DispatchResult{}, fmt.Errorf("node: dispatch: %w", err)
	}
	body, err := packBody(msg) // once: every envelope shares the read-only body
	if err != nil {
		return DispatchResult{}, err
	}
	res := DispatchResult{Errors: map[string]error{}}
	envs := make([]*pb.Envelope, 0, len(targets))
	for _, t := range targets {
		if err := t.Validate(); err != nil {
			res.Rejected++
			res.Errors[t.String()] = err
			continue
		}
		env, err := n.reliableEnvelope(t, body, opts)
		if err != nil {
			return DispatchResult{}, err
		}
		envs = append(envs, env)
	}
	// Like TellReliable, a commit that started is waited for (see there).
	for i, err := range n.store.EnqueueBatch(context.WithoutCancel(ctx), envs) {
		if err != nil {
			res.Rejected++
			res.Errors[envs[i].GetRecipient()] = err
			continue
		}
		res.Accepted++
	}
	n.stats.reliableQueued.Add(uint64(res.Accepted))
	return res, nil
}

// MaxIdempotencyKey is the longest idempotency key accepted, in bytes.
const MaxIdempotencyKey = 1024

func (n *Node) reliableEnvelope(to Address, body *anypb.Any, opts []SendOption) (*pb.Envelope, error) {
	var o sendOptions
	for _, opt := range opts {
		opt(&o)
	}
	if len(o.key) > MaxIdempotencyKey {
		return nil, fmt.Errorf("node: idempotency key of %d bytes (max %d): %w", len(o.key), MaxIdempotencyKey, ErrBadKey)
	}
	env := n.envelope(to, pb.RpcMeta_EVENT)
	env.Body = body
	env.Type = o.msgType
	env.Headers = o.headers
	env.Receipt = pb.Envelope_RECEIPT_PROCESSED
	env.Sequence = n.store.NextSequence()
	env.IdempotencyKey = o.key
	if env.IdempotencyKey == "" {
		// Stays the same across retries, since the stored envelope carries it.
		env.IdempotencyKey = "auto:" + env.GetMsgId()
	}
	if o.overwrite {
		env.Conflict = pb.Envelope_OVERWRITE
	}
	if o.ttl > 0 {
		env.ExpiresAtUnixMs = time.Now().Add(o.ttl).UnixMilli()
	}
	return env, nil
}

func (n *Node) alive(peer string) bool { return peer == n.name || n.mesh.Alive(peer) }

// deliverer is the relay's view of the network.
type deliverer struct{ n *Node }

func (d deliverer) Alive(peer string) bool { return d.n.alive(peer) }

func (d deliverer) Deliver(ctx context.Context, peer string, msgs []*pb.Envelope) ([]*pb.Receipt, error) {
	if peer == d.n.name {
		return d.n.deliverLocal(ctx, msgs)
	}
	rcs, err := d.n.transport.RequestBatch(ctx, peer, msgs)
	if err != nil {
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
	for i, env := range msgs {
		n.deliverIncoming(n.name, env, func(rc *pb.Receipt) { ch <- indexed{i, rc} })
	}
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
