package node

import (
	"context"
	"fmt"

	"github.com/meshnode/meshnode/partition"
	"google.golang.org/protobuf/proto"
)

// Pending is the future of a TellReliableAsync call: it resolves once the
// message is fsynced in the outbox (Queued), or with the error that kept it
// from being stored.
type Pending struct {
	done chan struct{}
	// out and err are written once, before done is closed.
	out Outcome
	err error
}

func newPending() *Pending { return &Pending{done: make(chan struct{})} }

func (p *Pending) resolve(out Outcome, err error) {
	p.out, p.err = out, err
	close(p.done)
}

// Done is closed when the outcome is known.
func (p *Pending) Done() <-chan struct{} { return p.done }

// Outcome waits for the outcome: Queued once the message is durable in the
// outbox, or the error that kept it from being stored (then nothing was
// stored).
func (p *Pending) Outcome() (Outcome, error) {
	<-p.done
	return p.out, p.err
}

// Wait is Outcome bounded by ctx. A ctx that ends first says nothing about
// the message: it may still be stored.
func (p *Pending) Wait(ctx context.Context) (Outcome, error) {
	select {
	case <-p.done:
		return p.out, p.err
	case <-ctx.Done():
		return 0, fmt.Errorf("node: tell-reliable: waiting for the commit: %w", ctx.Err())
	}
}

// TellReliableAsync is TellReliable for a producer that does not wait per
// message: it stores msg in the outbox without a direct attempt and returns
// at once with a Pending that resolves Queued after the fsync of the
// commit that holds it. Concurrent and successive calls share group
// commits, so one goroutine sending many messages pays a few fsyncs, not
// one each. Nothing is acknowledged before it is durable: a crash after a
// Pending resolved loses nothing, a crash before may lose what was not yet
// resolved. The relay delivers the message as it does a Queued one, with
// the same guarantees (order per stream, exactly-once effect per stream).
//
// The sequence is taken before the call returns, so the messages of one
// goroutine to one recipient are delivered in call order, and their
// Pendings resolve in call order. msg is encoded before the call returns
// and may be reused.
//
// A problem known at the call is returned at once and nothing is stored:
// a bad address or option, ErrTooLarge, ErrClosed, or ctx done before the
// message was handed to the outbox (it waits for room in the outbox's
// queue, which bounds how far a producer runs ahead of the disk). A
// failure of the commit itself resolves the Pending with the error.
//
// Client interceptors see a Call of kind CallReliableAsync: their next
// returns once the message is handed to the outbox, and Call.Outcome stays
// zero (the Pending carries it).
func (n *Node) TellReliableAsync(ctx context.Context, to Address, msg proto.Message, opts ...SendOption) (*Pending, error) {
	if n.closed.Load() {
		return nil, ErrClosed
	}
	if err := to.Validate(); err != nil {
		return nil, err
	}
	c, err := n.newCall(CallReliableAsync, to, msg, nil, opts)
	defer putCall(c)
	if err != nil {
		return nil, fmt.Errorf("node: tell-reliable %s: %w", to, err)
	}
	if n.invoke == nil {
		err = n.send(ctx, c)
	} else {
		err = n.invoke(ctx, c)
	}
	if err != nil {
		return nil, err
	}
	return c.pending, nil
}

// tellReliableAsync is TellReliableAsync without interceptors.
func (n *Node) tellReliableAsync(ctx context.Context, c *Call) (*Pending, error) {
	to := c.To
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("node: tell-reliable %s: %w", to, err)
	}
	body, err := packBody(c.Request)
	if err != nil {
		return nil, err
	}
	o := c.o
	o.headers, o.service, o.method = c.Headers, c.Service, c.Method
	sm, err := n.reliableMessage(to, body, &o)
	if err != nil {
		return nil, fmt.Errorf("node: tell-reliable %s: %w", to, err)
	}
	n.warnUnknown(to.Node)
	p := newPending()
	err = n.relay.SendAsync(ctx, sm, func(_ partition.Sent, err error) {
		if err != nil {
			n.stats.reliableFailed.Add(1)
			p.resolve(0, fmt.Errorf("node: tell-reliable %s: %w", to, n.mapRelayErr(err)))
			return
		}
		n.stats.reliableQueued.Add(1)
		p.resolve(Queued, nil)
	})
	if err != nil {
		n.stats.reliableFailed.Add(1)
		return nil, fmt.Errorf("node: tell-reliable %s: %w", to, n.mapRelayErr(err))
	}
	return p, nil
}
