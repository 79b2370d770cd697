package node

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
	"google.golang.org/protobuf/proto"
)

// errChainBroken refuses a chained reliable message whose predecessor failed.
var errChainBroken = errors.New("node: skipped: predecessor in batch failed")

// resolver gives the transport QUIC addresses from membership.
type resolver struct{ n *Node }

func (r resolver) Resolve(name string) (string, error) {
	if r.n.mesh == nil { // during New, before membership exists
		return "", transport.ErrUnreachable
	}
	return r.n.mesh.Resolve(name)
}

// receiver is the transport's Handler: envelopes from peers land here, on
// the lane's reader goroutine, so nothing here blocks.
type receiver struct{ n *Node }

func (r receiver) HandleEnvelope(from transport.PeerInfo, env *pb.Envelope, reply func(*pb.Receipt)) {
	r.n.deliverIncoming(from.Name, env, reply)
}

// deliverIncoming routes an envelope that arrived from senderNode (possibly
// this node, for the outbox's local deliveries) to its actor.
func (n *Node) deliverIncoming(senderNode string, env *pb.Envelope, reply func(*pb.Receipt)) {
	kind := env.GetRpc().GetKind()
	if kind == pb.RpcMeta_RESPONSE {
		n.responses.Deliver(env)
		return
	}
	receipt := func(code pb.Receipt_Code, msg string, retry time.Duration) {
		if reply != nil {
			reply(&pb.Receipt{MsgId: env.GetMsgId(), Code: code, Message: msg, RetryAfterMs: retry.Milliseconds()})
		}
	}
	to, _ := parseLoose(env.GetRecipient())
	a := n.actor(to.Actor)
	if to.Node != n.name || a == nil {
		n.stats.noSuchActor.Add(1)
		receipt(pb.Receipt_NO_SUCH_ACTOR, "no actor "+env.GetRecipient(), 0)
		if kind == pb.RpcMeta_REQUEST {
			n.respond(env, nil, ErrNoSuchActor)
		}
		return
	}
	if expired(env, time.Now()) {
		n.stats.expired.Add(1)
		if reply != nil {
			a.markFailed(&delivery{env: env, senderNode: senderNode})
		}
		receipt(pb.Receipt_EXPIRED, "expired on arrival", 0)
		return
	}
	if reply != nil && len(env.GetIdempotencyKey()) > MaxIdempotencyKey {
		a.markFailed(&delivery{env: env, senderNode: senderNode})
		receipt(pb.Receipt_REJECTED, fmt.Sprintf("idempotency key of %d bytes (max %d)", len(env.GetIdempotencyKey()), MaxIdempotencyKey), 0)
		return
	}
	if reply != nil {
		if scope, k := dedupeKey(senderNode, env); n.store.Seen(scope, k) {
			receipt(pb.Receipt_DUPLICATE, "", 0)
			return
		}
	}
	// RECEIPT_ACCEPTED: the sender only wants to know it is queued, so the
	// handler's outcome is not reported (decided before the actor sees d).
	acceptedOnly := reply != nil && env.GetReceipt() == pb.Envelope_RECEIPT_ACCEPTED
	d := &delivery{env: env, senderNode: senderNode, receipt: reply, remoteAsk: kind == pb.RpcMeta_REQUEST}
	if acceptedOnly {
		d.receipt = nil
	}
	err := a.post(d)
	if err == nil {
		if acceptedOnly {
			receipt(pb.Receipt_ACCEPTED, "", 0)
		}
		return
	}
	var ce *CapacityError
	switch {
	case errors.Is(err, errChainBroken):
		receipt(pb.Receipt_TRANSIENT, err.Error(), 0)
	case errors.As(err, &ce):
		n.stats.remoteFull.Add(1)
		receipt(pb.Receipt_CAPACITY, err.Error(), ce.RetryAfter)
		if d.remoteAsk {
			n.respond(env, nil, err)
		}
	default:
		receipt(pb.Receipt_TRANSIENT, err.Error(), 0)
		if d.remoteAsk {
			n.respond(env, nil, err)
		}
	}
}

// respond sends the RESPONSE to a remote REQUEST: the reply, or the error
// in status headers. Responses are best effort: a lost one ends in the
// asker's deadline.
func (n *Node) respond(req *pb.Envelope, reply proto.Message, herr error) {
	replyTo, _ := parseLoose(req.GetRpc().GetReplyTo())
	if replyTo.Node == "" || expired(req, time.Now()) {
		return // nobody waits for it any more
	}
	env := &pb.Envelope{
		ProtocolVersion: pb.ProtocolVersion,
		MsgId:           mailbox.NewID(),
		Sender:          req.GetRecipient(),
		Recipient:       req.GetRpc().GetReplyTo(),
		CreatedAtUnixMs: time.Now().UnixMilli(),
		Rpc:             &pb.RpcMeta{Kind: pb.RpcMeta_RESPONSE, CorrelationId: req.GetRpc().GetCorrelationId()},
	}
	if herr != nil {
		mailbox.SetError(env, herr)
	} else if reply != nil {
		body, err := packBody(reply)
		if err != nil {
			mailbox.SetError(env, err)
		} else {
			env.Body = body
		}
	}
	if replyTo.Node == n.name {
		n.responses.Deliver(env)
		return
	}
	if err := n.transport.Send(n.ctx, replyTo.Node, env); err != nil {
		n.log.Debug("response not sent", "to", replyTo.Node, "err", err)
	}
}

// finishReliable answers a reliable message after its handler returned.
// On success the idempotency key is recorded before PROCESSED is sent
// (rule 6: never before the handler succeeded), asynchronously so the actor
// can go on with its next message while the key waits for its group commit
// (concurrent commits share one fsync). RecordAsync makes the key pending at
// once: a copy that arrives before the commit is a duplicate (seen), not a
// second run of the handler. The receipt is sent from the store's committer
// after the commit; sending a receipt never blocks.
func (n *Node) finishReliable(a *actor, d *delivery, herr error) {
	id := d.env.GetMsgId()
	if herr != nil {
		a.markFailed(d)
		rc := &pb.Receipt{MsgId: id, Code: pb.Receipt_TRANSIENT, Message: herr.Error()}
		var ce *CapacityError
		switch {
		case mailbox.IsPermanent(herr):
			rc.Code = pb.Receipt_REJECTED
		case errors.As(herr, &ce):
			// A handler that is itself full (a bounded store behind it) is
			// congestion, not poison: the sender backs off without counting.
			rc.Code, rc.RetryAfterMs = pb.Receipt_CAPACITY, max(ce.RetryAfter.Milliseconds(), 1)
		}
		d.receipt(rc)
		return
	}
	scope, k := dedupeKey(d.senderNode, d.env)
	if k == "" {
		d.receipt(&pb.Receipt{MsgId: id, Code: pb.Receipt_PROCESSED})
		return
	}
	n.store.RecordAsync(scope, k, func(err error) {
		if err != nil {
			// The handler ran, but the key is not durable: say transient so
			// the sender retries (what is chained behind it waits for that).
			a.markFailed(d)
			d.receipt(&pb.Receipt{MsgId: id, Code: pb.Receipt_TRANSIENT, Message: "record idempotency key: " + err.Error()})
			return
		}
		d.receipt(&pb.Receipt{MsgId: id, Code: pb.Receipt_PROCESSED})
	})
}

// dedupeKey names a reliable message in the receiver's dedupe window. Keys
// are scoped by sender node and recipient actor, so one key used for many
// recipients (Dispatch) takes effect once per recipient. An OVERWRITE key
// names a stream of versions, not one message: each version (sequence) is
// its own logical message, or the second heartbeat would be a "duplicate".
func dedupeKey(senderNode string, env *pb.Envelope) (scope, key string) {
	key = env.GetIdempotencyKey()
	if key == "" {
		return "", ""
	}
	if env.GetConflict() == pb.Envelope_OVERWRITE {
		key += "#" + strconv.FormatUint(env.GetSequence(), 10)
	}
	to, _ := parseLoose(env.GetRecipient())
	return senderNode + ">" + to.Actor, key
}
