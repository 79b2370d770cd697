package testnet

import (
	"context"
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

// Report is the invariant checker's verdict; Report.Err() prints the seed.
type Report = invariant.Report

// Dead is one dead letter as the checker sees it.
type Dead = invariant.Dead

// NewRecorder returns a Recorder whose reports print seed.
func NewRecorder(seed int64) *Recorder { return invariant.NewRecorder(seed) }

// DeadFrom converts outbox dead-letter lists for Recorder.Check.
func DeadFrom(lists ...[]outbox.DeadLetter) []Dead {
	var out []Dead
	for _, l := range lists {
		for _, d := range l {
			out = append(out, Dead{Recipient: d.Recipient, Key: d.Message.GetEnvelope().GetIdempotencyKey(), Reason: d.Reason})
		}
	}
	return out
}

// DeadLetters returns the dead letters of every running node.
func (c *Cluster) DeadLetters() ([]Dead, error) {
	var lists [][]outbox.DeadLetter
	for _, i := range c.Running() {
		nd := c.Node(i)
		if nd == nil {
			continue
		}
		l, err := nd.Outbox().DeadLetters(outbox.DLQFilter{Limit: 1 << 30})
		if err != nil {
			return nil, fmt.Errorf("testnet: dead letters of %s: %w", nd.Name(), err)
		}
		lists = append(lists, l)
	}
	return DeadFrom(lists...), nil
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

// RecordingHandler returns a handler that records each message it
// processes in rec (sender node, recipient, key, sequence from the body,
// this incarnation's boot id). It pairs with SendReliable.
func RecordingHandler(rec *Recorder, n *node.Node, bug Bug) node.Handler {
	boot := n.BootID()
	count := 0 // owned by the actor's goroutine: handlers run one at a time
	return func(_ context.Context, m *node.Message) (proto.Message, error) {
		var body wrapperspb.UInt64Value
		if err := m.Decode(&body); err != nil {
			return nil, err // Permanent: undecodable
		}
		p := invariant.Processed{
			Sender:    m.Sender().Node,
			Recipient: m.Recipient().String(),
			Key:       m.IdempotencyKey(),
			Seq:       body.GetValue(),
			Boot:      boot,
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

// SendReliable sends the next message of (n, to) with TellReliable and
// records what n was told. Call it from one goroutine per (n, to) pair, so
// the recorded sequence is the send order.
func SendReliable(ctx context.Context, rec *Recorder, n *node.Node, to node.Address, opts ...node.SendOption) (node.Outcome, error) {
	sender := n.Name()
	seq := rec.Next(sender, to.String())
	key := fmt.Sprintf("%s>%s#%d", sender, to, seq)
	opts = append(opts, node.WithIdempotencyKey(key))
	out, err := n.TellReliable(ctx, to, wrapperspb.UInt64(seq), opts...)
	s := invariant.Sent{Sender: sender, Recipient: to.String(), Key: key, Seq: seq, Err: err}
	switch {
	case err != nil:
		s.Outcome = invariant.Failed
	case out == node.Delivered:
		s.Outcome = invariant.Delivered
	default:
		s.Outcome = invariant.Queued
	}
	rec.Sent(s)
	return out, err
}
