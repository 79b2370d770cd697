package envcodec

import (
	"unicode/utf8"

	"github.com/meshnode/meshnode/mailbox/pb"
	"google.golang.org/protobuf/encoding/protowire"
)

// Route encodes the envelopes one sender sends to one recipient with one
// body type and nothing else but what every tell and ask has (an id, a
// creation time, an RPC kind, a time to live): the sender's hot path. The
// fields the envelopes share are validated and encoded once, in NewRoute;
// Append writes the rest around them. The bytes are those Append of the
// package writes for the same envelope, so a receiver cannot tell which
// encoder made them.
type Route struct {
	sender, recipient, typeURL string
	head                       []byte // the sender and recipient fields
	url                        []byte // the body's type URL field
}

// NewRoute returns the route of sender's envelopes to recipient whose
// bodies have the type typeURL, or ok=false when a string is not valid
// UTF-8 (proto would refuse to encode it: such envelopes take Append).
func NewRoute(sender, recipient, typeURL string) (r *Route, ok bool) {
	if !utf8.ValidString(sender) || !utf8.ValidString(recipient) || !utf8.ValidString(typeURL) {
		return nil, false
	}
	r = &Route{sender: sender, recipient: recipient, typeURL: typeURL}
	r.head = appendStr(appendStr(nil, envSender, sender), envRecipient, recipient)
	r.url = appendStr(nil, anyTypeURL, typeURL)
	return r, true
}

// Is reports whether r is the route of these sender, recipient and type.
func (r *Route) Is(sender, recipient, typeURL string) bool {
	return r != nil && r.sender == sender && r.recipient == recipient && r.typeURL == typeURL
}

// Plain is what differs between the envelopes of one route.
type Plain struct {
	ID              []byte // the msg id, ASCII (mailbox ids are base64url)
	CreatedAtUnixMs int64
	Kind            pb.RpcMeta_Kind
	Value           []byte // the body's value
	TtlMs           int64
}

// Body says where the body field of an envelope Route.Append or
// AppendBody wrote begins (from the envelope's first byte), and its type
// URL: what CutTypeURL cuts; and where its sender and recipient fields
// are, when it has both: what CutRoute cuts. Only those encoders make
// one, for the bytes they wrote; the zero Body says nothing.
type Body struct {
	at  int
	url string
	// The sender and recipient fields, adjacent: [from, to) of the
	// envelope; to is 0 when the envelope lacks either.
	from, to int
}

// TypeURL is the body's type URL ("": the zero Body).
func (b Body) TypeURL() string { return b.url }

// HasRoute reports whether b says where the envelope's sender and
// recipient are (false: the zero Body).
func (b Body) HasRoute() bool { return b.to > 0 }

// Append appends the encoding of the envelope {ProtocolVersion, MsgId:
// p.ID, Sender, Recipient, CreatedAtUnixMs, Body: {TypeUrl, p.Value},
// Rpc: {Kind}, TtlMs} to b, as the package's Append writes it, and says
// where in it its body is (for CutTypeURL).
func (r *Route) Append(b []byte, p Plain) (out []byte, where Body) {
	start := len(b)
	b = appendVarintField(b, envProtocolVersion, uint64(pb.ProtocolVersion))
	if len(p.ID) > 0 {
		b = protowire.AppendTag(b, envMsgID, protowire.BytesType)
		b = protowire.AppendBytes(b, p.ID)
	}
	from := len(b) - start
	b = append(b, r.head...)
	if r.sender != "" && r.recipient != "" {
		where.from, where.to = from, len(b)-start
	}
	b = appendVarintField(b, envCreatedAt, uint64(p.CreatedAtUnixMs))
	body := len(r.url)
	if len(p.Value) > 0 {
		body += 1 + protowire.SizeBytes(len(p.Value))
	}
	where.at, where.url = len(b)-start, r.typeURL
	b = protowire.AppendTag(b, envBody, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(body))
	b = append(b, r.url...)
	if len(p.Value) > 0 {
		b = protowire.AppendTag(b, anyValue, protowire.BytesType)
		b = protowire.AppendBytes(b, p.Value)
	}
	b = protowire.AppendTag(b, envRPC, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(sizeVarint(uint64(int64(p.Kind)))))
	b = appendVarintField(b, rpcKind, uint64(int64(p.Kind)))
	return appendVarintField(b, envTTL, uint64(p.TtlMs)), where
}

// CutTypeURL splits env, the envelope an encoder wrote with body, around
// the body's type URL: the same envelope with a body that says no type is
// head, then bodyLen as a varint, then tail. ok is false, and nothing else
// set, for the zero Body, and when env does not hold, where body says, a
// body whose first field is that type URL written as Append writes it
// (env changed since, or came with another's Body): it is then sent as it
// is.
func CutTypeURL(env []byte, body Body) (head []byte, bodyLen uint64, tail []byte, ok bool) {
	bodyAt, url := body.at, body.url
	if url == "" {
		return nil, 0, nil, false
	}
	const bodyTag, urlTag = byte(envBody<<3 | protowire.BytesType), byte(anyTypeURL<<3 | protowire.BytesType)
	if bodyAt < 0 || bodyAt >= len(env) || env[bodyAt] != bodyTag || !fieldAt(env, bodyAt) {
		return nil, 0, nil, false
	}
	l, n := protowire.ConsumeVarint(env[bodyAt+1:])
	if n < 0 {
		return nil, 0, nil, false
	}
	p := bodyAt + 1 + n
	field := protowire.SizeTag(anyTypeURL) + protowire.SizeBytes(len(url))
	if l < uint64(field) || uint64(len(env)-p) < l {
		return nil, 0, nil, false
	}
	if env[p] != urlTag {
		return nil, 0, nil, false
	}
	// The URL's length as Append writes it (a longer varint of the same
	// value is valid protobuf, and field would not span it).
	ul, m := protowire.ConsumeVarint(env[p+1:])
	if m != protowire.SizeVarint(uint64(len(url))) || ul != uint64(len(url)) || string(env[p+1+m:p+field]) != url {
		return nil, 0, nil, false
	}
	return env[:bodyAt+1], l - uint64(field), env[p+field:], true
}

// fieldAt reports whether a field of env starts at offset at, reading
// env's fields from its start as the encoders write the fields before a
// route or a body: varints and bytes (any other wire type: false). So
// bytes that only look like a field, inside another one, are not cut. It
// runs for every named envelope, so one-byte tags and lengths, the
// common case, are read in place.
func fieldAt(env []byte, at int) bool {
	p := 0
	for p < at && p < len(env) {
		tag := env[p]
		if tag >= 0x80 {
			return false // a field number past 15: none of the encoders' before a route or a body
		}
		p++
		switch protowire.Type(tag & 7) {
		case protowire.VarintType:
			for p < len(env) && env[p] >= 0x80 {
				p++
			}
			p++
		case protowire.BytesType:
			if p < len(env) && env[p] < 0x80 {
				p += 1 + int(env[p])
				continue
			}
			l, m := protowire.ConsumeVarint(env[p:])
			if m < 0 || l > uint64(len(env)-p-m) {
				return false
			}
			p += m + int(l)
		default:
			return false
		}
	}
	return p == at
}

// CutRoute says where in env, the envelope an encoder wrote with body,
// its sender and recipient fields are: the same envelope without them is
// env[:from] then env[to:]. ok is false, and nothing else set, when body
// says env lacks either, and when env does not hold there a non-empty
// sender field and a non-empty recipient field as Append writes them (a
// one-byte tag, the shortest length), and nothing else, the first of
// them one of env's own fields, not bytes inside another (env changed
// since, or came with another's Body): it is then sent as it is.
func CutRoute(env []byte, body Body) (from, to int, ok bool) {
	from, to = body.from, body.to
	if to <= from || from < 0 || to > len(env) || !fieldAt(env, from) {
		return 0, 0, false
	}
	p := from
	for _, num := range [2]protowire.Number{envSender, envRecipient} {
		if p+1 >= to || env[p] != byte(num)<<3|byte(protowire.BytesType) {
			return 0, 0, false
		}
		if l := env[p+1]; l > 0 && l < 0x80 { // a one-byte length: most names
			p += 2 + int(l)
			continue
		}
		l, m := protowire.ConsumeVarint(env[p+1 : to])
		if m < 0 || m != protowire.SizeVarint(l) || l == 0 || uint64(to-p-1-m) < l {
			return 0, 0, false
		}
		p += 1 + m + int(l)
	}
	if p != to {
		return 0, 0, false
	}
	return from, to, true
}
