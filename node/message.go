package node

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/meshnode/meshnode/internal/address"
	"github.com/meshnode/meshnode/internal/envcodec"
	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/transport"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
)

// Handler handles the messages of one actor, one at a time. The reply is
// sent back to an Ask and ignored otherwise. A returned error travels back
// to an asker as a *RemoteError and makes a reliable message retry; wrap it
// with Permanent to dead-letter the message instead. A panic is recovered
// and treated as a permanent failure of that message.
type Handler func(ctx context.Context, m *Message) (reply proto.Message, err error)

// Message is what a Handler receives. It is only valid during the call: a
// tell's or an ask's, with its Envelope, is reused for a later message once
// the handler returns. Values read from it (strings, the body's bytes, the
// headers map, a decoded message) stay valid.
type Message struct {
	env    *pb.Envelope
	body   proto.Message // the sender's value on the local path; nil when it came over the wire
	stream StreamID      // reliable messages: the stream it belongs to
	from   string        // the node that sent it, as verified by TLS (this node for local sends)
}

// Envelope returns the wire envelope (ids, headers, rpc metadata). Treat it
// as read-only, and keep it no longer than the Message.
func (m *Message) Envelope() *pb.Envelope { return m.env }

// ID returns the message id of this attempt.
func (m *Message) ID() string { return m.env.GetMsgId() }

// IdempotencyKey returns the application's idempotency key ("" when none
// was given; always for tell and ask).
func (m *Message) IdempotencyKey() string { return m.env.GetIdempotencyKey() }

// Stream returns the reliable stream the message belongs to (zero for tell
// and ask). Stored with Sequence in the same transaction as the handler's
// effects, it lets a handler recognise a message it has already applied
// (a crash between its effects and the watermark's commit redelivers it).
func (m *Message) Stream() StreamID { return m.stream }

// Sequence returns the message's sequence in its stream (0 for tell and
// ask): increasing in the order the sender sent them, never reused.
func (m *Message) Sequence() uint64 { return m.env.GetSequence() }

// Sender returns who sent the message ("@node" when it came from the node
// API, not an actor). Its node part is always From(): an envelope that
// names another node is refused before any handler sees it. The actor part
// is the sending node's word.
func (m *Message) Sender() Address {
	a, _ := parseLoose(m.env.GetSender())
	if m.from != "" {
		a.Node = m.from
	}
	return a
}

// From returns the node that sent the message, as its certificate proves
// (this node's name for a local send).
func (m *Message) From() string { return m.from }

// Recipient returns the actor the message was sent to.
func (m *Message) Recipient() Address { a, _ := parseLoose(m.env.GetRecipient()); return a }

// Service returns the service the message calls (WithMethod; generated
// clients set it), or "".
func (m *Message) Service() string { return m.env.GetRpc().GetService() }

// Method returns the method of Service the message calls, or "".
func (m *Message) Method() string { return m.env.GetRpc().GetMethod() }

// CorrelationID returns, for a reliable request (WithReplyTo) and for its
// reply, the id that matches the reply to the request ("" otherwise).
func (m *Message) CorrelationID() string { return m.env.GetRpc().GetCorrelationId() }

// ReplyTo returns where a reliable request's reply goes (zero otherwise).
func (m *Message) ReplyTo() Address {
	if m.env.GetRpc().GetReplyTo() == "" {
		return Address{}
	}
	a, _ := parseLoose(m.env.GetRpc().GetReplyTo())
	return a
}

// IsReply reports whether the message is the reply to a reliable request.
func (m *Message) IsReply() bool { return m.env.GetRpc().GetKind() == pb.RpcMeta_RESPONSE }

// ReplyError returns, for a reply, the error of the request's handler (a
// *RemoteError; errors.Is works with the node's sentinels), or nil when it
// succeeded and the body is its reply.
func (m *Message) ReplyError() error {
	if !m.IsReply() {
		return nil
	}
	return mailbox.ErrorOf(m.env)
}

// Headers returns the application headers.
func (m *Message) Headers() map[string]string { return m.env.GetHeaders() }

// Attempt returns, for a reliable message, the number of this handler run as
// far as the sender knows: 1 on the first, one more after each handler
// failure it was told of (0 for tell and ask). A run whose outcome never
// reached the sender is not counted, so a redelivery may repeat a number.
func (m *Message) Attempt() int {
	return int(min(uint64(m.env.GetAttempt()), math.MaxInt)) // a peer's word, and an int may have 32 bits
}

// CreatedAt returns when the logical message was created.
func (m *Message) CreatedAt() time.Time { return time.UnixMilli(m.env.GetCreatedAtUnixMs()) }

// Body returns the payload. On the local path it is the sender's own value:
// do not modify it.
func (m *Message) Body() (proto.Message, error) {
	if m.body != nil {
		return m.body, nil
	}
	if m.env.GetBody() == nil {
		return nil, fmt.Errorf("node: message %s has no body", m.env.GetMsgId())
	}
	v, err := m.env.GetBody().UnmarshalNew()
	if err != nil {
		return nil, Permanent(fmt.Errorf("node: decode body of %s: %w", m.env.GetMsgId(), err))
	}
	return v, nil
}

// Decode fills dst with the payload. A body of another type is a Permanent error.
func (m *Message) Decode(dst proto.Message) error {
	if m.body != nil {
		if m.body.ProtoReflect().Descriptor().FullName() != dst.ProtoReflect().Descriptor().FullName() {
			return Permanent(fmt.Errorf("node: decode: body is %s, not %s",
				m.body.ProtoReflect().Descriptor().FullName(), dst.ProtoReflect().Descriptor().FullName()))
		}
		proto.Reset(dst)
		proto.Merge(dst, m.body)
		return nil
	}
	if m.env.GetBody() == nil {
		return Permanent(fmt.Errorf("node: decode: message %s has no body", m.env.GetMsgId()))
	}
	if err := m.env.GetBody().UnmarshalTo(dst); err != nil {
		return Permanent(fmt.Errorf("node: decode body of %s: %w", m.env.GetMsgId(), err))
	}
	return nil
}

// parseLoose splits "actor@node" without validating (the actor may be
// empty): internal/address is the one place that knows the form.
func parseLoose(s string) (Address, bool) {
	actor, node, ok := address.Split(s)
	return Address{Actor: actor, Node: node}, ok
}

// packBody wraps msg in an Any; nil stays nil. It is anypb.New without
// building the type URL string on every call.
func packBody(msg proto.Message) (*anypb.Any, error) {
	if msg == nil {
		return nil, nil
	}
	v, err := proto.Marshal(msg)
	if err != nil {
		return nil, fmt.Errorf("node: encode body: %w", err)
	}
	return &anypb.Any{TypeUrl: typeURL(msg.ProtoReflect().Descriptor()), Value: v}, nil
}

// typeURLs caches the Any type URL of each message descriptor seen.
var typeURLs sync.Map // protoreflect.MessageDescriptor -> string

// typeURL returns what anypb.New puts in TypeUrl for a message of type d.
func typeURL(d protoreflect.MessageDescriptor) string {
	if u, ok := typeURLs.Load(d); ok {
		return u.(string)
	}
	u := "type.googleapis.com/" + string(d.FullName())
	typeURLs.Store(d, u)
	return u
}

// outEnv is an outgoing envelope of a remote Tell or Ask, with its RpcMeta
// and body in the same allocation. It is pooled: the transport has encoded
// the envelope once Send returns, so nothing refers to it after. It keeps
// the strings it built last time, so a sender that talks to the same
// recipient with the same type builds no string but the msg id.
type outEnv struct {
	env  pb.Envelope
	rpc  pb.RpcMeta
	body anypb.Any

	from, fromStr string // node name and its "@node" address
	to            Address
	toStr         string // to.String()
	desc          protoreflect.MessageDescriptor
	url           string // typeURL(desc)

	route *envcodec.Route // of fromStr to toStr with bodies of type url
	wire  []byte          // encodePlain's encoding
	named transport.Body  // where its body is, and its type
}

var outEnvs = sync.Pool{New: func() any { return new(outEnv) }}

// maxPooledBody: a body buffer grown beyond this is not kept in the pool.
const maxPooledBody = 64 << 10

func getOutEnv() *outEnv { return outEnvs.Get().(*outEnv) }

// fill sets the envelope as Node.envelope does, made at now, with msg packed as packBody does.
func (o *outEnv) fill(from string, to Address, kind pb.RpcMeta_Kind, msg proto.Message, now time.Time) error {
	o.address(from, to)
	o.reset(o.fromStr, o.toStr, kind, now)
	return o.setBody(msg)
}

// address sets fromStr and toStr for from and to, building them only when
// they changed since o's last use.
func (o *outEnv) address(from string, to Address) {
	if o.fromStr == "" || o.from != from {
		o.from, o.fromStr = from, Address{Node: from}.String()
	}
	if o.toStr == "" || o.to != to {
		o.to, o.toStr = to, to.String()
	}
}

// marshal encodes msg into o's body buffer and sets url to its type URL.
func (o *outEnv) marshal(msg proto.Message) ([]byte, error) {
	value, err := proto.MarshalOptions{}.MarshalAppend(o.body.Value[:0], msg)
	if err != nil {
		return nil, err
	}
	if d := msg.ProtoReflect().Descriptor(); d != o.desc || o.url == "" {
		o.desc, o.url = d, typeURL(d)
	}
	return value, nil
}

// reset empties the envelope and sets its header fields: a new msg id,
// sender, recipient, the time it was made (now) and the RPC kind.
func (o *outEnv) reset(sender, recipient string, kind pb.RpcMeta_Kind, now time.Time) {
	value := o.body.Value[:0]
	o.env.Reset()
	o.rpc.Reset()
	o.body.Reset()
	o.body.Value = value
	o.env.ProtocolVersion = pb.ProtocolVersion
	o.env.MsgId = mailbox.NewID()
	o.env.Sender = sender
	o.env.Recipient = recipient
	o.env.CreatedAtUnixMs = now.UnixMilli()
	o.rpc.Kind = kind
	o.env.Rpc = &o.rpc
}

// setBody packs msg into the envelope's body as packBody does, in o's
// buffer; a nil msg leaves the envelope without a body.
func (o *outEnv) setBody(msg proto.Message) error {
	if msg == nil {
		return nil
	}
	value, err := o.marshal(msg)
	if err != nil {
		return fmt.Errorf("node: encode body: %w", err)
	}
	o.body.TypeUrl = o.url
	o.body.Value = value
	o.env.Body = &o.body
	return nil
}

// setCall copies a call's headers, type and method into the envelope.
func (o *outEnv) setCall(c *Call) {
	o.env.Headers = c.Headers
	o.env.Type = c.o.msgType
	o.rpc.Service, o.rpc.Method = c.Service, c.Method
}

// encodePlain encodes the envelope fill and setCall would build for c,
// made at now with ttl, straight into bytes (through o's route, see
// envcodec.Route), when c is plain: a body and none of headers, a type or
// a method. ok=false leaves it to them (an invalid body too, so that its
// error is fill's). The bytes are o's, valid until o is released.
func (o *outEnv) encodePlain(from string, c *Call, kind pb.RpcMeta_Kind, now time.Time, ttl int64) (wire []byte, ok bool) {
	msg := c.Request
	if msg == nil || len(c.Headers) > 0 || c.o.msgType != "" || c.Service != "" || c.Method != "" {
		return nil, false
	}
	value, err := o.marshal(msg)
	if err != nil {
		return nil, false
	}
	o.body.Value = value
	o.address(from, c.To)
	if !o.route.Is(o.fromStr, o.toStr, o.url) {
		if o.route, ok = envcodec.NewRoute(o.fromStr, o.toStr, o.url); !ok {
			return nil, false
		}
	}
	var id [mailbox.IDLen]byte
	o.wire, o.named = o.route.Append(o.wire[:0], envcodec.Plain{
		ID:              mailbox.AppendID(id[:0]),
		CreatedAtUnixMs: now.UnixMilli(),
		Kind:            kind,
		Value:           value,
		TtlMs:           ttl,
	})
	return o.wire, true
}

// release returns o to the pool; nil is ignored.
func (o *outEnv) release() {
	if o == nil {
		return
	}
	if cap(o.body.Value) > maxPooledBody {
		o.body.Value = nil
	}
	if cap(o.wire) > maxPooledBody {
		o.wire = nil
	}
	o.env.Body, o.env.Rpc = nil, nil
	outEnvs.Put(o)
}
