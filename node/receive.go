package node

import (
	"errors"
	"fmt"
	"time"

	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
	"google.golang.org/protobuf/proto"
)

// resolver gives the transport QUIC addresses from membership.
type resolver struct{ n *Node }

func (r resolver) Resolve(name string) (string, error) {
	if r.n.membership() == nil { // before Start, membership does not exist yet
		return "", transport.ErrUnreachable
	}
	return r.n.membership().Resolve(name)
}

// receiver is the transport's Handler: envelopes from peers land here, on
// the lane's reader goroutine, so nothing here blocks.
type receiver struct{ n *Node }

func (r receiver) HandleEnvelope(from transport.PeerInfo, env *pb.Envelope, reply func(*pb.Receipt)) {
	r.n.receive(from, env, reply, true)
}

// self is the PeerInfo of this node, for its own local deliveries.
func (n *Node) self() transport.PeerInfo {
	return transport.PeerInfo{Name: n.name, BootID: n.bootID, OutboxID: n.store.OutboxID()}
}

// deliverIncoming routes an envelope that arrived from the verified peer
// from (possibly this node, for local deliveries) to its actor. Decisions
// about a reliable message's order and duplicates are not taken here but
// by the actor when it takes the message (see actor.handleStream); the one
// exception is a copy at or below the durable watermark, which is answered
// DUPLICATE at once (a watermark only grows).
func (n *Node) deliverIncoming(from transport.PeerInfo, env *pb.Envelope, reply func(*pb.Receipt)) {
	n.receive(from, env, reply, false)
}

// receiptOf sends r, made elsewhere (answerDiverged), as env's receipt
// through reply. Made only where it is used: a closure that escapes,
// built in receive for every message, would cost each tell two
// allocations (itself and the variables it captures).
func receiptOf(env *pb.Envelope, reply func(*pb.Receipt)) func(*pb.Receipt) {
	return func(r *pb.Receipt) {
		if reply != nil {
			r.MsgId = env.GetMsgId()
			reply(r)
		}
	}
}

// copyReceipt answers env, a message of st answered without its owner (a
// copy below the durable watermark, or refused for room), through reply,
// with the watermark it gives and the digest of the message there.
func (n *Node) copyReceipt(st *inStream, env *pb.Envelope, reply func(*pb.Receipt), code pb.Receipt_Code, msg string, retry time.Duration) {
	if reply == nil {
		return
	}
	w, wd, marked := n.in.copyWatermark(st)
	if marked && code == pb.Receipt_DUPLICATE {
		// A copy decided before the stream was marked divergent
		// (answerDiverged says why not DUPLICATE).
		n.in.answerDiverged(st, receiptOf(env, reply))
		return
	}
	reply(&pb.Receipt{MsgId: env.GetMsgId(), Code: code, Message: msg, RetryAfterMs: retry.Milliseconds(),
		Watermark: w, WatermarkDigest: wd})
}

// refuseForRoom answers env, a message of the stream id refused for room
// before its owner decided it (refused at its mailbox or its sender's
// share of this node, or dropped from its mailbox for a newer message),
// through reply. It did not run: its receipt carries the stream's
// watermark and its digest, as a DUPLICATE's does, so that a sender
// restored from a backup whose first emission is refused learns from it
// that its sequences went back; another message at the watermark is
// answered DIVERGED and the stream marked, so that the messages chained
// behind it do not run in the old epoch either. (A CAPACITY for a message
// that ran, its watermark or reply refused by the disk, carries none.)
func (n *Node) refuseForRoom(id StreamID, applied func(StreamID) uint64, env *pb.Envelope, reply func(*pb.Receipt), msg string, retry time.Duration) {
	// Held while it may be marked: evicted in between, the stream would
	// be loaded again without the mark.
	held, err := n.in.acquire(id, applied)
	if err != nil {
		if reply != nil {
			reply(&pb.Receipt{MsgId: env.GetMsgId(), Code: pb.Receipt_CAPACITY, Message: msg, RetryAfterMs: retry.Milliseconds()})
		}
		return
	}
	defer n.in.release(held)
	if n.in.divergentAtRoom(held, id.Node, env) {
		n.stats.diverged.Add(1)
		n.in.answerDiverged(held, receiptOf(env, reply))
		return
	}
	n.copyReceipt(held, env, reply, pb.Receipt_CAPACITY, msg, retry)
}

// receive is deliverIncoming; decoded says env came from the transport's
// decoder and nothing but this delivery will refer to it, so that a tell's
// or an ask's envelope (and a tell's delivery) is reused once its actor
// has answered (see delivery.finish).
func (n *Node) receive(from transport.PeerInfo, env *pb.Envelope, reply func(*pb.Receipt), decoded bool) {
	kind := env.GetRpc().GetKind()
	stream := reply != nil
	if kind == pb.RpcMeta_RESPONSE && !stream {
		// An ask's, taken only by an ask to from; a reliable request's
		// reply is a stream message for an actor.
		n.responses.Deliver(from.Name, env)
		return
	}
	ask := kind == pb.RpcMeta_REQUEST && !stream // a reliable request's reply is stored, not sent from here
	// The outbox's clock at arrival, for a TTL; read only then, since a
	// clock read per tell shows in its profile.
	var arrival int64
	if env.GetTtlMs() > 0 {
		arrival = n.store.ElapsedMs()
	}
	receipt := func(code pb.Receipt_Code, msg string, retry time.Duration, w uint64) {
		if reply != nil {
			reply(&pb.Receipt{MsgId: env.GetMsgId(), Code: code, Message: msg, RetryAfterMs: retry.Milliseconds(), Watermark: w})
		}
	}
	refuse := func(code pb.Receipt_Code, err error) {
		receipt(code, err.Error(), 0, 0)
		if ask {
			n.respond(from.Name, env, nil, err)
		}
	}
	if n.draining.Load() {
		// Shutdown: nothing new enters a mailbox. Not the message's fault:
		// a reliable sender waits (uncounted); an asker hears the node is
		// unavailable; a tell is counted here.
		n.stats.stopping.Add(1)
		receipt(pb.Receipt_NO_SUCH_ACTOR, "node is stopping", time.Second, 0)
		if ask {
			n.respond(from.Name, env, nil, mailbox.ErrClosed)
		}
		return
	}
	if env.GetOrigin() != nil {
		// Carried for another member, or carried here: from becomes the
		// origin once it verifies (forward.go).
		var ok bool
		if from, reply, ok = n.forwarded(from, env, reply); !ok {
			return
		}
	}
	if err := checkClaims(from.Name, env); err != nil {
		n.refusedClaim(from.Name, err)
		refuse(pb.Receipt_REJECTED, Permanent(err))
		return
	}
	if stream && (env.GetSequence() == 0 || env.GetReceipt() != pb.Envelope_RECEIPT_PROCESSED) {
		// Only stream messages ask for receipts, and only for processed
		// ones: an ACCEPTED receipt would let the sender ack before the
		// outcome is known.
		refuse(pb.Receipt_REJECTED, Permanent(errors.New("node: a message asking for a receipt must be a stream message asking for a processed receipt")))
		return
	}
	to, _ := parseLoose(env.GetRecipient())
	a := n.actor(to.Actor)
	if stream && a == nil && to.Node == n.name {
		// The actor is gone, but the message may have run before it went,
		// its receipt lost: it is judged by the stream's durable watermark
		// as it would be were the actor there. A copy is answered as one
		// (DUPLICATE): counted as a failure, it would be dead-lettered as
		// one that never ran. Another message at the watermark, or any on
		// a stream marked divergent, is answered DIVERGED, as the owner
		// would, and the stream is marked so (divergentAtRoom): the
		// sender's sequences went back, it must not take the copies
		// answered beside it in its emission for delivered, and nothing
		// more of the old epoch may run once the actor is back.
		id := StreamID{Node: from.Name, Outbox: from.OutboxID, Epoch: env.GetStreamEpoch(), Actor: to.Actor}
		if st := n.in.known(id); st != nil {
			answered := true
			switch v := n.in.early(st, env); {
			case v == earlyCopy:
				n.stats.dedupeHits.Add(1)
				n.copyReceipt(st, env, reply, pb.Receipt_DUPLICATE, "", 0)
			case v == earlyDiverged || n.in.divergentAtRoom(st, id.Node, env):
				n.stats.diverged.Add(1)
				n.in.answerDiverged(st, receiptOf(env, reply))
			default:
				answered = false
			}
			n.in.release(st) // held until marked: not evicted in between
			if answered {
				return
			}
		}
	}
	if to.Node != n.name || a == nil {
		n.stats.noSuchActor.Add(1)
		retry := n.spawnGraceLeft()
		if retry == 0 && to.Node == n.name {
			retry = n.stopGraceLeft(to.Actor)
		}
		receipt(pb.Receipt_NO_SUCH_ACTOR, "no actor "+env.GetRecipient(), retry, 0)
		if ask {
			n.respond(from.Name, env, nil, ErrNoSuchActor)
		}
		return
	}
	if env.GetTtlMs() < 0 {
		n.stats.expired.Add(1)
		receipt(pb.Receipt_EXPIRED, "expired on arrival", 0, 0)
		return
	}
	// A tell's or an ask's envelope from a peer: nothing refers to it
	// once its actor has answered (finish).
	owned := decoded && !stream && from.Name != n.name && env.GetOrigin() == nil
	var d *delivery
	switch {
	case ask && !stream && env.GetTtlMs() > 0:
		ad := &askDelivery{delivery: delivery{Message: Message{env: env, from: from.Name}, receipt: reply, remoteAsk: true, ownsEnv: owned}}
		ad.delivery.lazy = &ad.lazy
		d = &ad.delivery
	case owned && !ask:
		d = deliveryPool.Get().(*delivery)
		d.Message, d.ownsEnv, d.pooled = Message{env: env, from: from.Name}, true, true
	default:
		d = &delivery{Message: Message{env: env, from: from.Name}, receipt: reply, remoteAsk: ask, ownsEnv: owned}
	}
	if t := env.GetTtlMs(); t > 0 {
		// A peer's word: a TTL past maxTTLMs is as good as none, and
		// kept below it so that the deadline, in nanoseconds, is one.
		d.deadlineMs = arrival + min(t, maxTTLMs)
	}
	var st *inStream
	if stream {
		if len(env.GetIdempotencyKey()) > MaxIdempotencyKey {
			receipt(pb.Receipt_REJECTED, fmt.Sprintf("idempotency key of %d bytes (max %d)", len(env.GetIdempotencyKey()), MaxIdempotencyKey), 0, 0)
			return
		}
		d.stream = StreamID{Node: from.Name, Outbox: from.OutboxID, Epoch: env.GetStreamEpoch(), Actor: to.Actor}
		var err error
		if st, err = n.in.get(d.stream, a.applied()); err != nil {
			// The store is closing: nobody's verdict; the sender waits.
			receipt(pb.Receipt_NO_SUCH_ACTOR, "node is stopping", time.Second, 0)
			return
		}
		// At or below the durable watermark: answered here without
		// taking a mailbox slot (nor waiting for the owner, which refuses
		// everything while the store is stopped), as the owner would.
		switch n.in.early(st, env) {
		case earlyCopy:
			n.stats.dedupeHits.Add(1)
			n.copyReceipt(st, env, reply, pb.Receipt_DUPLICATE, "", 0)
			return
		case earlyDiverged:
			n.stats.diverged.Add(1)
			n.in.answerDiverged(st, receiptOf(env, reply))
			return
		}
	}
	roomRefusal := func(msg string, retry time.Duration) {
		if st == nil {
			receipt(pb.Receipt_CAPACITY, msg, retry, 0)
			return
		}
		n.refuseForRoom(d.stream, a.applied(), env, reply, msg, retry)
	}
	if from.Name != n.name && !n.charge(d, from.Name) {
		err := &CapacityError{RetryAfter: peerFullRetry}
		roomRefusal("node: the sender's messages fill this node's mailboxes", peerFullRetry)
		if d.remoteAsk {
			n.respond(from.Name, env, nil, err)
		}
		return
	}
	var err error
	if stream {
		err = a.postStream(d)
	} else {
		err = a.post(d)
	}
	if err == nil {
		if st != nil {
			st.posted(env.GetSequence())
		}
		return
	}
	d.uncharge()
	var ce *CapacityError
	switch {
	case errors.As(err, &ce):
		n.stats.refusedFull.Add(1)
		roomRefusal(err.Error(), ce.RetryAfter)
		if d.remoteAsk {
			n.respond(from.Name, env, nil, err)
		}
	default:
		// The mailbox is closed: the actor is stopping, or the node. Not
		// the message's fault, so not a verdict: the sender waits.
		n.stats.stopping.Add(1)
		receipt(pb.Receipt_NO_SUCH_ACTOR, "actor "+to.Actor+" is stopping", time.Second, 0)
		if d.remoteAsk {
			n.respond(from.Name, env, nil, err)
		}
	}
}

// spawnGraceLeft is the retry hint of a NO_SUCH_ACTOR receipt: positive
// while this node is within its SpawnGrace (its application may still
// spawn the actor, so the sender defers without counting), zero after.
func (n *Node) spawnGraceLeft() time.Duration {
	started := n.startedMs.Load()
	if started == 0 {
		return time.Second // not started yet: well within the grace
	}
	left := time.Duration(started+n.cfg.SpawnGrace.Milliseconds()-n.store.ElapsedMs()) * time.Millisecond
	if left <= 0 {
		return 0
	}
	return min(left, time.Second)
}

// respond sends the RESPONSE to a remote REQUEST from the verified peer
// to: the reply, or the error in status headers. It goes to that peer,
// never to another node its reply_to may name. Responses are best effort:
// a lost one ends in the asker's deadline.
func (n *Node) respond(to string, req *pb.Envelope, reply proto.Message, herr error) {
	n.respondUntil(to, req, reply, herr, 0)
}

// respondWait bounds how long one response waits for room in a full send
// queue: a burst drains within it, and an asker that stops reading
// cannot hold the actor longer (its own TTL could say hours).
const respondWait = time.Second

// maxTTLMs bounds the TTL a received message is held to: a century, so
// that deadlines counted from it, in nanoseconds, fit an int64 (a TTL of
// 2^58 ms, which a peer may send, would wrap into the past).
const maxTTLMs = 100 * 365 * 24 * 3600 * 1000

// respondUntil is respond for a request whose asker waits until
// deadlineMs (the store's elapsed clock; 0: unknown): while the send
// queue to the asker is full and draining, it waits for room as the
// transport says, up to then and at most respondWait, rather than drop
// the response and leave the asker waiting for nothing. The caller (an
// actor's goroutine) waits with it: its mailbox fills, and new asks are
// refused with a retry hint instead.
func (n *Node) respondUntil(to string, req *pb.Envelope, reply proto.Message, herr error, deadlineMs int64) {
	replyTo, _ := parseLoose(req.GetRpc().GetReplyTo())
	if replyTo.Node == "" {
		return // nobody waits for it
	}
	recipient := req.GetRpc().GetReplyTo()
	if replyTo.Node != to {
		// Refused by checkClaims: the refusal goes to the sender.
		replyTo = Address{Node: to}
		recipient = replyTo.String()
	}
	if replyTo.Node == n.name {
		// The asker keeps the envelope: not a pooled one.
		env := &pb.Envelope{
			ProtocolVersion: pb.ProtocolVersion,
			MsgId:           mailbox.NewID(),
			Sender:          req.GetRecipient(),
			Recipient:       recipient,
			CreatedAtUnixMs: time.Now().UnixMilli(),
			Rpc:             &pb.RpcMeta{Kind: pb.RpcMeta_RESPONSE, CorrelationId: req.GetRpc().GetCorrelationId()},
		}
		if herr == nil {
			env.Body, herr = packBody(reply)
		}
		mailbox.SetError(env, herr)
		n.responses.Deliver(n.name, env)
		return
	}
	// Pooled: the transport has encoded the envelope when Send returns.
	o := getOutEnv()
	defer o.release()
	o.reset(req.GetRecipient(), recipient, pb.RpcMeta_RESPONSE, time.Now())
	o.rpc.CorrelationId = req.GetRpc().GetCorrelationId()
	env := &o.env
	if herr == nil {
		herr = o.setBody(reply)
	}
	if herr != nil {
		env.Body = nil
		mailbox.SetError(env, herr)
	}
	if err := n.transport.CheckSendTo(env, replyTo.Node); err != nil {
		// Too large for the asker's frames (or ours), a reply or a long
		// error: the asker hears why at once instead of waiting out its
		// deadline.
		env.Body = nil
		mailbox.SetError(env, &RemoteError{Code: mailbox.Internal, Message: fmt.Sprintf("reply too large for the wire: %v", err)})
	}
	var giveUp time.Time // set at the first full queue: no clock read when there is room
	for {
		err := n.transport.Send(n.ctx, replyTo.Node, env)
		if err == nil {
			return
		}
		if giveUp.IsZero() {
			giveUp = time.Now().Add(respondWait)
		}
		var qf *transport.QueueFullError
		left := min(time.Duration(deadlineMs-n.store.ElapsedMs())*time.Millisecond, time.Until(giveUp))
		// A hint of a second or more: no write completed for that long
		// (the transport's most), the asker is not reading.
		if !errors.As(err, &qf) || deadlineMs == 0 || left <= 0 || qf.RetryAfter >= time.Second {
			n.log.Debug("response not sent", "to", replyTo.Node, "err", err)
			return
		}
		t := time.NewTimer(min(max(qf.RetryAfter, time.Millisecond), left))
		select {
		case <-t.C:
		case <-n.ctx.Done():
			t.Stop()
			return
		}
	}
}
