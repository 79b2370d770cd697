package node

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/meshnode/meshnode/internal/ratelog"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/partition"
	"github.com/meshnode/meshnode/transport"
	"google.golang.org/protobuf/proto"
)

// Forwarding: when membership holds a peer alive but this node cannot
// reach it, the relay sends its reliable messages through another member
// (partition's routes decide when and through whom). This file is the
// node's three parts of it:
//
//   - the sender signs each envelope it hands a forwarder (Origin: its
//     name, outbox id, certificate and a signature over the envelope's
//     digest) and trusts only receipts the recipient signed;
//   - the forwarder carries what a member sends in its own name on to the
//     recipient and its receipts back, unchanged, storing nothing;
//   - the recipient verifies the origin and then treats the message as
//     the origin's own: its stream, order, dedupe, claims and replies are
//     the origin node's. It signs its receipts.
//
// A node advertises FeatureForward in its gossip metadata: it carries for
// others and accepts what was carried. A sender uses only forwarders that
// advertise it, and only for a recipient that does.

// FeatureForward is the NodeMeta feature of a node that forwards reliable
// messages for other members and accepts forwarded ones.
const FeatureForward = "forward"

const (
	// forwardReceiptWait bounds how long a forwarder waits for the
	// recipient's receipt: the sender's own DeliverTimeout by default.
	forwardReceiptWait = 30 * time.Second
	// maxCarried and maxCarriedBytes bound what a forwarder holds for all
	// senders together while it waits for receipts; past them it answers
	// "cannot carry" (the sender tries another forwarder or waits).
	maxCarried      = 4096
	maxCarriedBytes = 32 << 20
)

// ForwardStats counts forwarded traffic (Stats.Forward).
type ForwardStats struct {
	Sent        uint64 // envelopes this node signed and handed to a forwarder
	Unsigned    uint64 // receipts through a forwarder that the recipient did not sign: the forwarder's own word ("cannot carry it"), ignored
	BadReceipts uint64 // receipts through a forwarder whose signature does not verify (altered or forged), ignored
	Carried     uint64 // envelopes this node carried for other members
	NotCarried  uint64 // envelopes it was asked to carry and could not (not the sender's own, recipient not reachable, over its bounds)
	Accepted    uint64 // forwarded envelopes whose origin verified here
	Refused     uint64 // forwarded envelopes refused here: certificate, signature or fields that do not verify (the forwarded_refused metric)
}

// forwarding is the node's forwarding state.
type forwarding struct {
	on       bool // Relay.Forward.After > 0: this node takes part in forwarding
	verifier *transport.Verifier
	log      *ratelog.Limiter // refusals: one line a minute per peer

	// carryHook, set only by tests, sees each envelope this node is about
	// to carry (a copy it may alter) and may answer it with a receipt of
	// its own instead: a forwarder that tampers or lies.
	carryHook atomic.Pointer[func(env *pb.Envelope) (forged *pb.Receipt)]

	// jobs hands receipts for forwarded envelopes to the signers
	// (startSigners), off the goroutine that made them: for PROCESSED that
	// is the store's committer, which serves every stream of the node, and
	// a signature takes tens of microseconds.
	jobs chan signJob

	carried, carriedBytes       atomic.Int64 // in transit for others now
	sent, unsigned, badReceipts atomic.Uint64
	carriedN, notCarried        atomic.Uint64
	accepted, refused           atomic.Uint64
}

func newForwarding(cfg Config, t *transport.Transport) *forwarding {
	return &forwarding{on: cfg.Relay.Forward.After > 0, verifier: transport.NewVerifier(t.Roots()), log: ratelog.New(time.Minute),
		jobs: make(chan signJob, signQueue)}
}

// signQueue bounds the receipts waiting for a signer; past it they are
// signed where they were made.
const signQueue = 1024

// signJob is one receipt to sign for the envelope whose digest is dg.
type signJob struct {
	rc    *pb.Receipt
	dg    [32]byte
	reply func(*pb.Receipt)
}

// startSigners starts one signer per CPU, on a node that takes forwarded
// envelopes; they end with the node.
func (n *Node) startSigners() {
	if !n.fwd.on {
		return
	}
	for range runtime.GOMAXPROCS(0) {
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			for {
				select {
				case <-n.ctx.Done():
					return
				case j := <-n.fwd.jobs:
					n.signReceipt(j)
				}
			}
		}()
	}
}

// signReceipt signs j.rc as this node's and sends it.
func (n *Node) signReceipt(j signJob) {
	if err := transport.SignReceipt(n.transport.Certificate(), n.name, j.rc, j.dg); err != nil {
		n.log.Warn("cannot sign the receipt of a forwarded envelope; the sender will send it again", "err", err)
		j.rc = &pb.Receipt{MsgId: j.rc.GetMsgId(), Message: "node: receipt not signed: " + err.Error()}
	}
	j.reply(j.rc)
}

// features are the NodeMeta features this node advertises: forwarding
// unless Relay.Forward.After is 0, which opts the node out of it both
// ways (it neither sends through forwarders nor carries nor is sent to
// through one).
func (n *Node) features() []string {
	if !n.fwd.on {
		return nil
	}
	return []string{FeatureForward}
}

// Routes returns the peers whose reliable messages go through a
// forwarder now (the direct path failed while membership holds them
// alive), with the forwarder in use ("" while none can carry them).
func (n *Node) Routes() map[string]partition.RouteStats { return n.relay.Routes() }

func (f *forwarding) stats() ForwardStats {
	return ForwardStats{
		Sent: f.sent.Load(), Unsigned: f.unsigned.Load(), BadReceipts: f.badReceipts.Load(),
		Carried: f.carriedN.Load(), NotCarried: f.notCarried.Load(),
		Accepted: f.accepted.Load(), Refused: f.refused.Load(),
	}
}

// Forwarders is partition.Router: the alive members that forward, for a
// recipient node that accepts forwarded envelopes (none when this node's
// key cannot sign).
func (d deliverer) Forwarders(peer string) []string {
	m := d.n.membership()
	if m == nil || !m.HasFeature(peer, FeatureForward) || !transport.CanSign(d.n.transport.Certificate()) {
		return nil
	}
	return m.AliveWithFeature(FeatureForward, d.n.name, peer)
}

// Probe is partition.Router: a fresh handshake with peer.
func (d deliverer) Probe(ctx context.Context, peer string) error {
	return d.n.transport.Redial(ctx, peer)
}

// DeliverVia is partition.Router: it signs msgs as this node's and sends
// them to via for peer. A receipt peer did not sign is returned as nil:
// the forwarder's word alone never acks, counts or dead-letters anything.
func (d deliverer) DeliverVia(ctx context.Context, via, peer string, msgs []*pb.Envelope) ([]*pb.Receipt, error) {
	n := d.n
	cert := n.transport.Certificate()
	outboxID := n.store.OutboxID()
	digests := make([][32]byte, len(msgs))
	for i, e := range msgs {
		dg, err := transport.SignOrigin(cert, n.name, outboxID[:], e)
		if err != nil {
			return nil, fmt.Errorf("node: forward to %s via %s: %w", peer, via, err)
		}
		digests[i] = dg
	}
	n.fwd.sent.Add(uint64(len(msgs)))
	rcs, err := n.transport.RequestBatch(ctx, via, msgs)
	var ee *transport.EncodeError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		// Too large with its origin: not poison, since it fits directly.
		// It waits for the direct path.
		err = fmt.Errorf("node: forward to %s via %s: %d envelopes too large to forward: %w", peer, via, len(ee.Errs), ee.Errs[minKey(ee.Errs)])
	case errors.Is(err, transport.ErrQueueFull):
		err = congested(fmt.Errorf("via %s: %w", via, err))
	default:
		err = fmt.Errorf("node: forward to %s via %s: %w", peer, via, err)
	}
	var unsigned, bad int
	var why error
	for i, rc := range rcs {
		if rc == nil {
			continue
		}
		verr := n.fwd.verifier.VerifyReceipt(rc, peer, digests[i])
		if verr == nil {
			continue
		}
		rcs[i] = nil
		if rc.GetSignature() == nil {
			unsigned++
		} else {
			bad++
		}
		if why == nil {
			why = fmt.Errorf("%w (%s says: %q)", verr, via, rc.GetMessage())
		}
	}
	if unsigned+bad > 0 {
		n.fwd.unsigned.Add(uint64(unsigned))
		n.fwd.badReceipts.Add(uint64(bad))
		err = errors.Join(err, fmt.Errorf("node: %d receipts through %s not signed by %s: %w", unsigned+bad, via, peer, why))
	}
	return rcs, err
}

// minKey returns the lowest key of m.
func minKey(m map[int]error) int {
	best := -1
	for i := range m {
		if best < 0 || i < best {
			best = i
		}
	}
	return best
}

// forwarded handles an envelope with an origin from the verified peer
// from. For another node it is a request to carry it (this node is the
// forwarder) and forwarded returns ok=false. For this node it verifies the
// origin and returns the origin as the sender, with a reply that signs
// the receipts; when the origin does not verify it answers without a
// verdict (the sender's relay tries another route, nothing is counted
// against the message) and returns ok=false.
func (n *Node) forwarded(from transport.PeerInfo, env *pb.Envelope, reply func(*pb.Receipt)) (transport.PeerInfo, func(*pb.Receipt), bool) {
	to, _ := parseLoose(env.GetRecipient())
	if to.Node != n.name {
		n.carry(from, to.Node, env, reply)
		return from, reply, false
	}
	o := env.GetOrigin()
	refuse := func(err error) (transport.PeerInfo, func(*pb.Receipt), bool) {
		n.fwd.refused.Add(1)
		if ok, suppressed := n.fwd.log.Allow(from.Name); ok {
			n.log.Warn("refused a forwarded envelope", "forwarder", from.Name, "origin", o.GetNode(), "err", err, "suppressed", suppressed)
		}
		if reply != nil {
			// Unsigned and without a verdict: the sender trusts no receipt
			// through a forwarder that this node did not sign.
			reply(&pb.Receipt{MsgId: env.GetMsgId(), Message: "node: " + n.name + " refused a forwarded envelope: " + err.Error()})
		}
		return from, reply, false
	}
	switch {
	case !n.fwd.on:
		return refuse(errors.New("this node does not take forwarded envelopes"))
	case reply == nil || env.GetSequence() == 0:
		return refuse(errors.New("only reliable stream messages are taken forwarded"))
	case o.GetNode() == n.name:
		return refuse(errors.New("the origin is this node"))
	case len(o.GetOutboxId()) != 16 || [16]byte(o.GetOutboxId()) == [16]byte{}:
		return refuse(errors.New("no valid outbox id in the origin"))
	}
	dg, err := n.fwd.verifier.VerifyOrigin(env)
	if err != nil {
		return refuse(err)
	}
	n.fwd.accepted.Add(1)
	origin := transport.PeerInfo{Name: o.GetNode(), OutboxID: [16]byte(o.GetOutboxId())}
	signed := func(rc *pb.Receipt) {
		// A copy with exactly the fields signed, under the envelope's msg
		// id: not the watermark's digest, which an origin of an older
		// release could not check and would refuse the receipt for.
		j := signJob{dg: dg, reply: reply, rc: &pb.Receipt{MsgId: env.GetMsgId(), Code: rc.GetCode(),
			RetryAfterMs: rc.GetRetryAfterMs(), Message: rc.GetMessage(), Watermark: rc.GetWatermark()}}
		if n.startedMs.Load() != 0 && n.ctx.Err() == nil {
			select {
			case n.fwd.jobs <- j:
				return
			default:
			}
		}
		n.signReceipt(j)
	}
	return origin, signed, true
}

// carry forwards env from the verified peer from to node, as the
// forwarder: only a member's own envelopes, only reliable ones, nothing
// stored. The recipient's receipt goes back unchanged; when env cannot be
// carried, an unsigned receipt without a verdict says why.
func (n *Node) carry(from transport.PeerInfo, node string, env *pb.Envelope, reply func(*pb.Receipt)) {
	fail := func(why string) {
		n.fwd.notCarried.Add(1)
		if reply != nil {
			reply(&pb.Receipt{MsgId: env.GetMsgId(), Message: "node: forwarder " + n.name + " cannot carry it to " + node + ": " + why})
		}
	}
	switch {
	case !n.fwd.on:
		fail("this node does not forward")
		return
	case reply == nil:
		fail("only reliable messages are forwarded")
		return
	case env.GetOrigin().GetNode() != from.Name:
		// A member may have its own envelopes carried, never another's:
		// replaying what it once carried for someone is not its to send.
		n.fwd.refused.Add(1)
		fail("the origin is not the member that sent it")
		return
	case node == from.Name || node == "":
		fail("not a recipient to forward to")
		return
	case n.draining.Load() || n.closed.Load():
		fail("the forwarder is stopping")
		return
	case !n.alive(node):
		fail("not alive here")
		return
	}
	if h := n.fwd.carryHook.Load(); h != nil {
		env = proto.CloneOf(env)
		if forged := (*h)(env); forged != nil {
			reply(forged)
			return
		}
	}
	size := int64(proto.Size(env))
	if k, b := n.fwd.carried.Add(1), n.fwd.carriedBytes.Add(size); k > maxCarried || b > maxCarriedBytes {
		n.fwd.carried.Add(-1)
		n.fwd.carriedBytes.Add(-size)
		fail("too much in transit")
		return
	}
	done := func(rc *pb.Receipt, err error) {
		n.fwd.carried.Add(-1)
		n.fwd.carriedBytes.Add(-size)
		if err != nil {
			fail(err.Error())
			return
		}
		reply(rc)
	}
	if err := n.transport.Forward(node, env, forwardReceiptWait, done); err != nil {
		n.fwd.carried.Add(-1)
		n.fwd.carriedBytes.Add(-size)
		fail(err.Error())
		return
	}
	n.fwd.carriedN.Add(1)
}
