package node

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
)

// CallKind says which send a Call is.
type CallKind int

const (
	// CallTell is Tell: at most once, no reply.
	CallTell CallKind = iota + 1
	// CallAsk is Ask: a reply or an error.
	CallAsk
	// CallReliable is TellReliable: Delivered, Queued or DeadLettered.
	CallReliable
	// CallReliableAsync is TellReliableAsync: next returns once the
	// message is handed to the outbox; Outcome stays zero.
	CallReliableAsync
)

// String returns "tell", "ask", "reliable" or "reliable-async".
func (k CallKind) String() string {
	switch k {
	case CallTell:
		return "tell"
	case CallAsk:
		return "ask"
	case CallReliable:
		return "reliable"
	case CallReliableAsync:
		return "reliable-async"
	}
	return "CallKind(" + strconv.Itoa(int(k)) + ")"
}

// Call is one send as client interceptors see it. An interceptor may set
// headers (SetHeader) before it calls next; the other fields are read-only.
// A Call is valid only while the interceptor runs: it is reused after, so
// keep copies of what you need, never the Call.
type Call struct {
	Kind    CallKind
	To      Address
	Service string // from WithMethod (generated clients set it); "" for an untyped send
	Method  string
	Request proto.Message
	// Reply is where Ask decodes the reply once next returned nil (nil:
	// the reply is ignored; always nil for the other kinds).
	Reply proto.Message
	// Headers are the message's application headers: a copy of what
	// WithHeaders gave, plus what interceptors set. nil until one is set.
	Headers map[string]string
	// Outcome is TellReliable's outcome, set once next returned nil.
	Outcome Outcome

	o       sendOptions // the options that are not exposed above
	pending *Pending    // TellReliableAsync's future, set once next returned nil
}

// SetHeader sets an outgoing header of the call.
func (c *Call) SetHeader(key, value string) {
	if c.Headers == nil {
		c.Headers = make(map[string]string, 2)
	}
	c.Headers[key] = value
}

// Invoker sends the message a Call describes.
type Invoker func(ctx context.Context, c *Call) error

// ClientInterceptor runs around every Tell, Ask and TellReliable of a
// node: it calls next to send (or returns an error without sending), may
// add headers first and sees the outcome after. It runs on the caller's
// goroutine, with the caller's context. This is where tracing, auth and
// metrics plug in (Config.ClientInterceptors). Dispatch, which stores one
// message for many recipients at once, is not intercepted.
type ClientInterceptor func(ctx context.Context, c *Call, next Invoker) error

// ServerInterceptor runs around every handler run of a node's actors (for
// each of the three sends, local or remote): it calls next to run the
// handler (or answers itself), on the actor's goroutine, with the context
// the handler gets (Config.ServerInterceptors).
type ServerInterceptor func(ctx context.Context, m *Message, next Handler) (proto.Message, error)

// chainClient returns base wrapped by ics, the first outermost; nil when
// there are none, so a send without interceptors builds no Call on the heap.
func chainClient(ics []ClientInterceptor, base Invoker) Invoker {
	if len(ics) == 0 {
		return nil
	}
	h := base
	for i := len(ics) - 1; i >= 0; i-- {
		ic, next := ics[i], h
		h = func(ctx context.Context, c *Call) error { return ic(ctx, c, next) }
	}
	return h
}

// chainServer returns h wrapped by ics, the first outermost.
func chainServer(ics []ServerInterceptor, h Handler) Handler {
	for i := len(ics) - 1; i >= 0; i-- {
		ic, next := ics[i], h
		h = func(ctx context.Context, m *Message) (proto.Message, error) { return ic(ctx, m, next) }
	}
	return h
}

// WithMethod names the (service, method) a message calls: the full name of
// a service defined in a .proto file and one of its methods. Generated
// clients set it; a ServiceMux routes by it.
func WithMethod(service, method string) SendOption {
	return func(o *sendOptions) { o.service, o.method = service, method }
}

// callPool recycles Calls: a send with interceptors would otherwise
// allocate one (a few hundred bytes) per call.
var callPool = sync.Pool{New: func() any { return new(Call) }}

// newCall builds the Call of a send with its options applied, and checks
// that every option means something for that kind of send. Give it back
// with putCall once the send returned.
func (n *Node) newCall(kind CallKind, to Address, req, reply proto.Message, opts []SendOption) (*Call, error) {
	c := callPool.Get().(*Call)
	*c = Call{Kind: kind, To: to, Request: req, Reply: reply}
	for _, opt := range opts {
		if opt != nil {
			opt(&c.o)
		}
	}
	c.Headers, c.Service, c.Method = c.o.headers, c.o.service, c.o.method
	if kind == CallReliable || kind == CallReliableAsync {
		n.checkReliable(&c.o)
		return c, c.o.badOption
	}
	switch {
	case c.o.key != "", c.o.coalesce != "", c.o.ttlSet, !c.o.replyTo.IsZero(), c.o.correlation != "":
		return c, fmt.Errorf("%w: idempotency keys, overwrite, TTL, reply-to and correlation ids are for reliable sends (a tell or an ask is bounded by its context's deadline)", ErrBadOption)
	}
	return c, n.checkHeaders(&c.o)
}

// putCall recycles c; nothing may use it after.
func putCall(c *Call) {
	*c = Call{}
	callPool.Put(c)
}

// send is the innermost Invoker: the send itself.
func (n *Node) send(ctx context.Context, c *Call) error {
	switch c.Kind {
	case CallTell:
		return n.tell(ctx, c)
	case CallAsk:
		return n.ask(ctx, c, time.Now())
	case CallReliable:
		out, err := n.tellReliable(ctx, c)
		c.Outcome = out
		return err
	case CallReliableAsync:
		p, err := n.tellReliableAsync(ctx, c)
		c.pending = p
		return err
	}
	return fmt.Errorf("node: send: %w: call kind %d", ErrBadOption, int(c.Kind))
}

// valueContext gives a local handler its caller's context values while its
// deadline and cancellation stay the node's: a Tell returns before its
// handler runs, and the caller's cancel must not reach it. A remote
// handler gets values only through headers (interceptors, trace context).
type valueContext struct {
	context.Context
	values context.Context
}

// Value asks the node's side first: it holds no values of its own, only the
// context package's (so that context.Cause and contexts derived in the
// handler attach to the node's cancellation, not the caller's).
func (c valueContext) Value(key any) any {
	if v := c.Context.Value(key); v != nil {
		return v
	}
	return c.values.Value(key)
}
