package testnet

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/outbox"
	"github.com/meshnode/meshnode/testnet/internal/invariant"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Recorder collects what senders were told and what handlers processed.
type Recorder = invariant.Recorder

// Report is the invariant checker's verdict; Report.Err() prints the random seed.
type Report = invariant.Report

// Dead is one dead letter as the checker sees it.
type Dead = invariant.Dead

// NewRecorder returns a Recorder whose reports print seed.
func NewRecorder(seed int64) *Recorder { return invariant.NewRecorder(seed) }

// DeadFrom converts the dead-letter list of sender's outbox for
// Recorder.Check. The message's sequence is read from its body (a
// wrapperspb.UInt64Value, as SendReliable sends); other bodies get 0.
func DeadFrom(sender string, l []outbox.DeadLetter) []Dead {
	out := make([]Dead, 0, len(l))
	for _, d := range l {
		var seq wrapperspb.UInt64Value
		_ = d.Message.GetEnvelope().GetBody().UnmarshalTo(&seq)
		out = append(out, Dead{Sender: sender, Recipient: d.Recipient, Seq: seq.GetValue(), Reason: d.Reason})
	}
	return out
}

// DeadLetters returns the dead letters of every running node.
func (c *Cluster) DeadLetters() ([]Dead, error) {
	var all []Dead
	for _, i := range c.Running() {
		nd := c.Node(i)
		if nd == nil {
			continue
		}
		l, err := nd.Outbox().DeadLetters(outbox.DLQFilter{Limit: 1 << 30})
		if err != nil {
			return nil, fmt.Errorf("testnet: dead letters of %s: %w", nd.Name(), err)
		}
		all = append(all, DeadFrom(nd.Name(), l)...)
	}
	return all, nil
}

// Check marks every ended incarnation of every node as crashed (a handler
// run there may be re-run by the next one: the documented at-least-once
// window), collects the running nodes' dead letters and checks rec.
func (c *Cluster) Check(rec *Recorder) (Report, error) {
	c.mu.Lock()
	for _, m := range c.members {
		ended := m.boots
		if m.n != nil && len(ended) > 0 {
			ended = ended[:len(ended)-1]
		}
		for _, b := range ended {
			rec.Crashed(b)
		}
	}
	c.mu.Unlock()
	dead, err := c.DeadLetters()
	if err != nil {
		return Report{}, err
	}
	return rec.Check(dead), nil
}

// WaitDrained waits until no running node has messages waiting or in
// flight in its outbox.
func (c *Cluster) WaitDrained(timeout time.Duration) error {
	return c.waitFor(timeout, ErrNotDrained, func() (bool, string) {
		for _, i := range c.Running() {
			nd := c.Node(i)
			if nd == nil {
				continue
			}
			if s := nd.Outbox().Stats(); s.Depth > 0 || s.InFlight > 0 {
				return false, fmt.Sprintf("%s has %d waiting, %d in flight (by peer %v)", nd.Name(), s.Depth, s.InFlight, s.DepthByPeer)
			}
		}
		return true, ""
	})
}

// Bug is a deliberately broken handler behaviour, injected from outside
// node, to show the checker catches it.
type Bug int

const (
	// NoBug: the handler records every message it processes.
	NoBug Bug = iota
	// BugAckWithoutProcessing: every 10th message is acknowledged (the
	// handler returns nil) without its effect being applied, as a handler
	// that acks first and crashes before doing the work.
	BugAckWithoutProcessing
	// BugDoubleApply: every 10th message's effect is applied twice, as a
	// handler that ignores the idempotency key on its own retry.
	BugDoubleApply
)

// poisonHeader marks a message its RecordingHandler refuses as poison.
const poisonHeader = "testnet-poison"

// RecordingHandler returns a handler that records each message it
// processes in rec (sender node as verified, recipient, sequence from the
// body, this incarnation's boot id). It pairs with SendReliable: a message
// sent as poison is refused with node.Permanent.
func RecordingHandler(rec *Recorder, n *node.Node, bug Bug) node.Handler {
	boot := n.BootID()
	count := 0 // owned by the actor's goroutine: handlers run one at a time
	return func(_ context.Context, m *node.Message) (proto.Message, error) {
		var body wrapperspb.UInt64Value
		if err := m.Decode(&body); err != nil {
			return nil, err // Permanent: undecodable
		}
		if m.Headers()[poisonHeader] != "" {
			return nil, node.Permanent(errors.New("testnet: poison"))
		}
		p := invariant.Processed{
			Sender:    m.Sender().Node,
			Recipient: m.Recipient().String(),
			Key:       m.IdempotencyKey(),
			Seq:       body.GetValue(),
			Boot:      boot,
			Stream:    m.Stream().String(),
			Wire:      m.Sequence(),
		}
		count++
		switch {
		case bug == BugAckWithoutProcessing && count%10 == 0:
			return nil, nil
		case bug == BugDoubleApply && count%10 == 0:
			rec.Processed(p)
		}
		rec.Processed(p)
		return nil, nil
	}
}

// Msg says how SendReliable sends one message.
type Msg struct {
	Key    bool          // give it an idempotency key (unique per message)
	TTL    time.Duration // give it a TTL (0 = none)
	Poison bool          // make its RecordingHandler refuse it as poison
	Extra  []byte        // padding in a header, e.g. to make it too large
}

// SendReliable sends the next message of (n, to) with TellReliable and
// records what n was told. Call it from one goroutine per (n, to) pair, so
// the recorded sequence is the send order. The body is the sequence.
func SendReliable(ctx context.Context, rec *Recorder, n *node.Node, to node.Address, msgs ...Msg) (node.Outcome, error) {
	var m Msg
	if len(msgs) > 0 {
		m = msgs[0]
	}
	sender := n.Name()
	seq := rec.Next(sender, to.String())
	s := invariant.Sent{Sender: sender, Recipient: to.String(), Seq: seq, Poison: m.Poison, TTL: m.TTL > 0}
	var opts []node.SendOption
	if m.Key {
		s.Key = fmt.Sprintf("%s>%s#%d", sender, to, seq)
		opts = append(opts, node.WithIdempotencyKey(s.Key))
	}
	if m.TTL > 0 {
		opts = append(opts, node.WithTTL(m.TTL))
	}
	h := map[string]string{}
	if m.Poison {
		h[poisonHeader] = "1"
	}
	if len(m.Extra) > 0 {
		h["testnet-padding"] = string(m.Extra)
	}
	if len(h) > 0 {
		opts = append(opts, node.WithHeaders(h))
	}
	out, err := n.TellReliable(ctx, to, wrapperspb.UInt64(seq), opts...)
	s.Err = err
	switch {
	case err != nil:
		s.Outcome = invariant.Failed
	case out == node.Delivered:
		s.Outcome = invariant.Delivered
	case out == node.DeadLettered:
		s.Outcome = invariant.DeadLettered
	default:
		s.Outcome = invariant.Queued
	}
	rec.Sent(s)
	return out, err
}
