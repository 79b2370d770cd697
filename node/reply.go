package node

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"time"

	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/mailbox/pb"
	"google.golang.org/protobuf/proto"
)

// WithReplyTo makes a reliable send a request: what the recipient's
// handler returns comes back to replyTo, an actor on this node, as a
// reliable message of its own stream (from the recipient to replyTo), with
// the request's correlation id (Message.CorrelationID; Message.IsReply is
// true). A handler's permanent error comes back the same way
// (Message.ReplyError); a transient one is retried and sends nothing. Like
// the request, the reply waits in an outbox (the recipient's) while this
// node is away, across restarts of either side.
func WithReplyTo(replyTo Address) SendOption {
	return func(o *sendOptions) { o.replyTo = replyTo }
}

// WithCorrelationID sets the correlation id a request (WithReplyTo) and its
// reply carry, such as the application's own id of the request, stored
// before sending so that a restarted sender can match the reply. Without
// it a random id is made.
func WithCorrelationID(id string) SendOption {
	return func(o *sendOptions) { o.correlation = id }
}

// replyKeyPrefix starts the idempotency key of a reply: a request whose
// handler runs again in the receiver's crash window stores its reply again,
// and the requester's key window runs only one of the two.
const replyKeyPrefix = "meshnode-reply:"

// replyKey is the idempotency key of the reply of actor to the request
// with correlation id corr. The requester scopes keys by the responding
// node and the reply-to actor only, so the responding actor is part of the
// key: two actors of one node answering requests with the same
// correlation id store two replies, not one. A digest keeps it unambiguous
// (actor names and ids may contain any separator) and of fixed length.
func replyKey(actor, corr string) string {
	h := sha256.New()
	h.Write([]byte(actor))
	h.Write([]byte{0})
	h.Write([]byte(corr))
	return replyKeyPrefix + base64.RawURLEncoding.EncodeToString(h.Sum(nil)[:16])
}

// checkReplyTo returns why o's reply-to and correlation id cannot be used.
func (n *Node) checkReplyTo(o *sendOptions) error {
	if o.replyTo.IsZero() {
		if o.correlation != "" {
			return fmt.Errorf("%w: a correlation id needs WithReplyTo", ErrBadOption)
		}
		return nil
	}
	if err := o.replyTo.Validate(); err != nil {
		return fmt.Errorf("reply-to: %w", err)
	}
	if o.replyTo.Node != n.name {
		// The responder answers only the node that sent the request (as
		// TLS verified it), so a reply to another node would never come.
		return fmt.Errorf("%w: reply-to %s is not on this node (%s)", ErrBadOption, o.replyTo, n.name)
	}
	if max := MaxIdempotencyKey - len(replyKeyPrefix); len(o.correlation) > max {
		return fmt.Errorf("correlation id of %d bytes (max %d): %w", len(o.correlation), max, ErrBadKey)
	}
	return nil
}

// isRequest reports whether a reliable message asks for a reply.
func isRequest(env *pb.Envelope) bool {
	return env.GetRpc().GetKind() == pb.RpcMeta_REQUEST && env.GetRpc().GetReplyTo() != ""
}

// replyMessage makes the reply to the reliable request d (its handler's
// reply, or its permanent error) as the outbox stores it, or returns nil
// when none is sent (the request asks for it elsewhere than its sender's
// node).
func (a *actor) replyMessage(d *delivery, reply proto.Message, herr error) *pb.StoredMessage {
	n, req := a.n, d.env
	to, ok := parseLoose(req.GetRpc().GetReplyTo())
	if !ok || to.Node != d.from || to.Validate() != nil {
		// A responder answers only the node that sent the request, as TLS
		// verified it: anything else would let one node aim replies at
		// another's actors.
		n.log.Warn("reliable request asks for its reply elsewhere than its sender's node; no reply sent",
			"actor", a.name, "sender", d.from, "reply_to", req.GetRpc().GetReplyTo())
		return nil
	}
	corr := req.GetRpc().GetCorrelationId()
	now := time.Now()
	env := &pb.Envelope{
		ProtocolVersion: pb.ProtocolVersion,
		MsgId:           mailbox.NewID(),
		IdempotencyKey:  replyKey(a.name, corr),
		Sender:          req.GetRecipient(),
		Recipient:       to.String(),
		CreatedAtUnixMs: now.UnixMilli(),
		Rpc: &pb.RpcMeta{Kind: pb.RpcMeta_RESPONSE, Service: req.GetRpc().GetService(),
			Method: req.GetRpc().GetMethod(), CorrelationId: corr},
		Receipt: pb.Envelope_RECEIPT_PROCESSED,
	}
	if herr != nil {
		mailbox.SetError(env, herr)
	} else if body, err := packBody(reply); err != nil {
		mailbox.SetError(env, Permanent(err))
	} else {
		env.Body = body
	}
	err := n.transport.CheckSize(env)
	if err == nil && to.Node != n.name {
		// The requester's frames may be smaller than ours: the request
		// just came over the connection that says.
		err = n.transport.CheckSizeTo(env, to.Node)
	}
	if err == nil && n.fwd.on && to.Node != n.name {
		// It may have to go through a forwarder with its origin; one that
		// fits only directly would hold the reply stream while the direct
		// path fails.
		err = n.transport.CheckSizeForwarded(env, n.name)
	}
	if err != nil {
		// Retrying the request cannot make its reply smaller: say so instead.
		env.Body = nil
		mailbox.SetError(env, &RemoteError{Code: mailbox.Internal, Message: fmt.Sprintf("reply too large for the wire: %v", err)})
	}
	return &pb.StoredMessage{Envelope: env, CreatedElapsedMs: n.store.ElapsedMs(), FirstEnqueuedUnixMs: now.UnixMilli()}
}

// storeReply stores a reply made by replyMessage in this node's outbox,
// from which the relay delivers it. It runs on the actor's goroutine
// before the request's watermark moves: a request is never acknowledged
// without its reply.
func (n *Node) storeReply(sm *pb.StoredMessage) error {
	if _, err := n.relay.Send(n.ctx, sm, false); err != nil {
		return fmt.Errorf("node: store reply to %s: %w", sm.GetEnvelope().GetRecipient(), n.mapRelayErr(err))
	}
	return nil
}
