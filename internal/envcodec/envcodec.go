// Package envcodec is a hand-written codec for pb.Envelope, the message of
// every hot path: the transport's frames and the outbox's records. The
// generated code goes through reflection tables, validates every string
// twice and, on decode, allocates each string on its own; this codec writes
// the same bytes and builds the same message with a fraction of the work.
// Anything it was not written for (unknown fields, a field seen twice, a
// wire type that does not match the schema, invalid UTF-8) makes it answer
// ok=false, and the caller takes the generic proto path, so the results are
// always those of proto.Marshal and proto.Unmarshal.
//
// Most of its tests (equivalence with proto, fallbacks, fuzzing) are the
// transport's envcodec tests, which reach it through the frame codec; the
// outbox's record tests cover it inside a StoredMessage.
package envcodec

import (
	"math"
	"sort"
	"sync"
	"unicode/utf8"
	"unsafe"

	"github.com/meshnode/meshnode/mailbox/pb"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// Field numbers of pb.Envelope, pb.RpcMeta and anypb.Any (meshnode.proto).
// FieldHeaders is exported for the transport's reader, which counts
// header entries before it decodes.
const (
	envProtocolVersion = 1
	envMsgID           = 2
	envIdempotencyKey  = 3
	envSender          = 4
	envRecipient       = 5
	envCreatedAt       = 6
	envType            = 8
	FieldHeaders       = 9
	envBody            = 10
	envRPC             = 11
	envEventSeq        = 12
	envSequence        = 13
	envConflict        = 14
	envAttempt         = 15
	envReceipt         = 16
	envPrevSequence    = 17
	envStreamEpoch     = 18
	envCoalesceKey     = 19
	envTTL             = 20

	rpcKind          = 1
	rpcService       = 2
	rpcMethod        = 3
	rpcCorrelationID = 4
	rpcReplyTo       = 5

	anyTypeURL = 1
	anyValue   = 2

	mapKey   = 1
	mapValue = 2
)

// sizeStr is the encoded size of a proto3 string field (absent when empty)
// whose tag takes one byte.
func sizeStr(s string) int {
	if s == "" {
		return 0
	}
	return 1 + protowire.SizeBytes(len(s))
}

func sizeVarint(v uint64) int {
	if v == 0 {
		return 0
	}
	return 1 + protowire.SizeVarint(v)
}

func appendStr(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendVarintField(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

// Sizes holds the sizes one encoding of an envelope needs.
type Sizes struct {
	Total     int // the envelope's encoded size
	rpc, body int
}

// Size returns the encoded sizes of env, or ok=false when env needs
// the generic path (unknown fields, invalid UTF-8).
func Size(env *pb.Envelope) (sz Sizes, ok bool) {
	if len(env.ProtoReflect().GetUnknown()) > 0 || env.Origin != nil {
		return sz, false
	}
	n := sizeVarint(uint64(env.ProtocolVersion))
	for _, s := range [...]string{env.MsgId, env.IdempotencyKey, env.Sender, env.Recipient, env.Type} {
		if !utf8.ValidString(s) {
			return sz, false
		}
		n += sizeStr(s)
	}
	n += sizeVarint(uint64(env.CreatedAtUnixMs))
	for k, v := range env.Headers {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return sz, false
		}
		e := MapEntrySize(k, v)
		n += 1 + protowire.SizeBytes(e)
	}
	if b := env.Body; b != nil {
		if len(b.ProtoReflect().GetUnknown()) > 0 || !utf8.ValidString(b.TypeUrl) {
			return sz, false
		}
		sz.body = sizeStr(b.TypeUrl)
		if len(b.Value) > 0 {
			sz.body += 1 + protowire.SizeBytes(len(b.Value))
		}
		n += 1 + protowire.SizeBytes(sz.body)
	}
	if r := env.Rpc; r != nil {
		if len(r.ProtoReflect().GetUnknown()) > 0 {
			return sz, false
		}
		sz.rpc = sizeVarint(uint64(int64(r.Kind)))
		for _, s := range [...]string{r.Service, r.Method, r.CorrelationId, r.ReplyTo} {
			if !utf8.ValidString(s) {
				return sz, false
			}
			sz.rpc += sizeStr(s)
		}
		n += 1 + protowire.SizeBytes(sz.rpc)
	}
	n += sizeVarint(env.EventSeq)
	n += sizeVarint(env.Sequence)
	n += sizeVarint(uint64(int64(env.Conflict)))
	n += sizeVarint(uint64(env.Attempt))
	// Fields 16 and above take two-byte tags.
	if env.Receipt != 0 {
		n += 2 + protowire.SizeVarint(uint64(int64(env.Receipt)))
	}
	if env.PrevSequence != 0 {
		n += 2 + protowire.SizeVarint(env.PrevSequence)
	}
	if env.StreamEpoch != 0 {
		n += 2 + protowire.SizeVarint(env.StreamEpoch)
	}
	if env.CoalesceKey != "" {
		if !utf8.ValidString(env.CoalesceKey) {
			return sz, false
		}
		n += 2 + protowire.SizeBytes(len(env.CoalesceKey))
	}
	if env.TtlMs != 0 {
		n += 2 + protowire.SizeVarint(uint64(env.TtlMs))
	}
	sz.Total = n
	return sz, true
}

// MapEntrySize is the size of one headers entry: proto always writes both
// the key and the value of a map entry, even when empty.
func MapEntrySize(k, v string) int {
	return 2 + protowire.SizeBytes(len(k)) + protowire.SizeBytes(len(v))
}

// Append appends the encoding of env, whose sizes are sz. Fields go
// in field-number order, as proto.Marshal writes them; headers in sorted key
// order (proto.Marshal's own order is random, Deterministic sorts them too).
func Append(b []byte, env *pb.Envelope, sz Sizes) []byte {
	b, _ = AppendBody(b, env, sz)
	return b
}

// AppendBody is Append that also says where in out env's body is, and its
// type, for CutTypeURL (none when env has no body or its body no type),
// and where its sender and recipient are, for CutRoute (none unless it
// has both).
func AppendBody(b []byte, env *pb.Envelope, sz Sizes) (out []byte, where Body) {
	start := len(b)
	b = appendVarintField(b, envProtocolVersion, uint64(env.ProtocolVersion))
	b = appendStr(b, envMsgID, env.MsgId)
	b = appendStr(b, envIdempotencyKey, env.IdempotencyKey)
	from := len(b) - start
	b = appendStr(b, envSender, env.Sender)
	b = appendStr(b, envRecipient, env.Recipient)
	if env.Sender != "" && env.Recipient != "" {
		where.from, where.to = from, len(b)-start
	}
	b = appendVarintField(b, envCreatedAt, uint64(env.CreatedAtUnixMs))
	b = appendStr(b, envType, env.Type)
	if len(env.Headers) > 0 {
		b = appendHeaders(b, env.Headers)
	}
	if body := env.Body; body != nil {
		if body.TypeUrl != "" {
			where.at, where.url = len(b)-start, body.TypeUrl
		}
		b = protowire.AppendTag(b, envBody, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(sz.body))
		b = appendStr(b, anyTypeURL, body.TypeUrl)
		if len(body.Value) > 0 {
			b = protowire.AppendTag(b, anyValue, protowire.BytesType)
			b = protowire.AppendBytes(b, body.Value)
		}
	}
	if r := env.Rpc; r != nil {
		b = protowire.AppendTag(b, envRPC, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(sz.rpc))
		b = appendVarintField(b, rpcKind, uint64(int64(r.Kind)))
		b = appendStr(b, rpcService, r.Service)
		b = appendStr(b, rpcMethod, r.Method)
		b = appendStr(b, rpcCorrelationID, r.CorrelationId)
		b = appendStr(b, rpcReplyTo, r.ReplyTo)
	}
	b = appendVarintField(b, envEventSeq, env.EventSeq)
	b = appendVarintField(b, envSequence, env.Sequence)
	b = appendVarintField(b, envConflict, uint64(int64(env.Conflict)))
	b = appendVarintField(b, envAttempt, uint64(env.Attempt))
	b = appendVarintField(b, envReceipt, uint64(int64(env.Receipt)))
	b = appendVarintField(b, envPrevSequence, env.PrevSequence)
	b = appendVarintField(b, envStreamEpoch, env.StreamEpoch)
	b = appendStr(b, envCoalesceKey, env.CoalesceKey)
	b = appendVarintField(b, envTTL, uint64(env.TtlMs))
	return b, where
}

// appendHeaders appends the entries of h in sorted key order. Apart from
// AppendBody, whose stack frame (a sender's, every message) would
// otherwise hold two map iterators that few envelopes use.
func appendHeaders(b []byte, h map[string]string) []byte {
	if len(h) == 1 {
		for k, v := range h {
			b = appendHeader(b, k, v)
		}
		return b
	}
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		b = appendHeader(b, k, h[k])
	}
	return b
}

func appendHeader(b []byte, k, v string) []byte {
	b = protowire.AppendTag(b, FieldHeaders, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(MapEntrySize(k, v)))
	b = protowire.AppendTag(b, mapKey, protowire.BytesType)
	b = protowire.AppendString(b, k)
	b = protowire.AppendTag(b, mapValue, protowire.BytesType)
	return protowire.AppendString(b, v)
}

// maxPinnedRest is how many bytes besides its own a decoded body may keep
// alive when it shares the decoder's copy (or as many as its own size).
const maxPinnedRest = 1 << 10

// inEnv is a decoded envelope with its RpcMeta and body in one allocation.
type inEnv struct {
	env  pb.Envelope
	rpc  pb.RpcMeta
	body anypb.Any
}

// envPool holds envelopes handed back by Recycle. A pooled envelope keeps
// its zeroed RpcMeta and body attached as spares, so that the three stay
// one allocation through their reuse.
var envPool = sync.Pool{New: func() any {
	m := new(inEnv)
	m.env.Rpc, m.env.Body = &m.rpc, &m.body
	return &m.env
}}

// getEnv returns a zero envelope and spares for its RpcMeta and body
// (either may be nil: then the decoder allocates one if it needs it).
func getEnv() (env *pb.Envelope, rpc *pb.RpcMeta, body *anypb.Any) {
	env = envPool.Get().(*pb.Envelope)
	rpc, body = env.Rpc, env.Body
	env.Rpc, env.Body = nil, nil
	return env, rpc, body
}

// NewEnvelope returns a zero envelope with a zero RpcMeta, from the
// envelopes handed back with Recycle when there is one.
func NewEnvelope() *pb.Envelope {
	env, rpc, _ := getEnv()
	if rpc == nil {
		rpc = new(pb.RpcMeta)
	}
	env.Rpc = rpc
	return env
}

// Recycle hands back an envelope (one Decode or NewEnvelope returned, or
// any other) once nothing refers to it, its RpcMeta or its body any more;
// a later Decode or NewEnvelope reuses their memory. What was read from
// them stays valid: strings, the body's bytes and the headers map are not
// reused. Calling it is optional (an envelope not handed back is garbage
// as any other).
func Recycle(env *pb.Envelope) {
	rpc, body := env.Rpc, env.Body
	*env = pb.Envelope{}
	if rpc != nil {
		*rpc = pb.RpcMeta{}
	}
	if body != nil {
		*body = anypb.Any{}
	}
	env.Rpc, env.Body = rpc, body
	envPool.Put(env)
}

// Decode is the fast path of decodeEnvelopeOwned.
func Decode(b []byte, owned bool) (*pb.Envelope, bool) {
	return DecodeLimited(b, owned, math.MaxInt, math.MaxInt)
}

// DecodeLimited is Decode for an envelope of at most maxHeaders header
// entries of at most maxHeaderBytes (each entry's encoded length, its
// length prefix included), counting every entry, a repeated key too: it
// stops at the first entry past either bound, before the headers map
// holds more than maxHeaders+1 of them, and answers ok=false, as for b
// that needs the generic path (whose caller checks the limits first).
func DecodeLimited(b []byte, owned bool, maxHeaders, maxHeaderBytes int) (*pb.Envelope, bool) {
	// str returns buf[off:off+n] as a string without copying; those bytes
	// are never written after the copy below, which is what unsafe.String
	// requires (the body's bytes, which a handler may write, are others).
	str := func(v []byte) (string, bool) {
		if len(v) == 0 {
			return "", true
		}
		if !utf8.Valid(v) {
			return "", false
		}
		return unsafe.String(&v[0], len(v)), true
	}
	// The body is a slice of the same bytes as the strings, capped so an
	// append copies: a handler may write into its body, which touches
	// only the body's own bytes, never those a string points to. Unless
	// the rest of the envelope is much larger (big headers): then the
	// body gets a copy of its own, so that a body kept after its envelope
	// does not hold them.
	val := func(s []byte) []byte {
		switch {
		case len(s) == 0:
			return nil // as proto.Unmarshal decodes an empty value
		case len(b)-len(s) > max(len(s), maxPinnedRest):
			return append([]byte(nil), s...)
		}
		return s[:len(s):len(s)]
	}
	buf := b
	switch {
	case owned:
		// The strings are copied and the body is b's: a handler may
		// write into its body, never into anything a string points to.
		str = func(v []byte) (string, bool) {
			if !utf8.Valid(v) {
				return "", false
			}
			return string(v), true
		}
	case len(b) > 0:
		buf = make([]byte, len(b))
		copy(buf, b)
	}
	env, rpc, body := getEnv()
	lim := headerLimits{entries: maxHeaders, bytes: maxHeaderBytes}
	if env, ok := decodeInto(env, rpc, body, buf, str, val, &lim); ok {
		return env, true
	}
	Recycle(env)
	return nil, false
}

// headerLimits counts an envelope's header entries against their bounds
// while it is decoded: what is left of each.
type headerLimits struct{ entries, bytes int }

// decodeInto is Decode's loop, filling env (zero) and using the spares
// rpc and body when it meets those fields (allocating when they are nil).
func decodeInto(env *pb.Envelope, rpc *pb.RpcMeta, body *anypb.Any, buf []byte, str func([]byte) (string, bool), val func([]byte) []byte, lim *headerLimits) (*pb.Envelope, bool) {
	var seen uint32
	p := buf
	for len(p) > 0 {
		num, typ, n := protowire.ConsumeTag(p)
		if n < 0 || num > envTTL || num == 7 {
			return nil, false // field 7 is reserved; 21 (origin) and unknown ones take the generic path
		}
		p = p[n:]
		if num != FieldHeaders {
			if seen&(1<<num) != 0 {
				return nil, false // a field seen twice: proto's merge rules apply
			}
			seen |= 1 << num
		}
		switch num {
		case envMsgID, envIdempotencyKey, envSender, envRecipient, envType, FieldHeaders, envBody, envRPC, envCoalesceKey:
			if typ != protowire.BytesType {
				return nil, false
			}
			v, n := protowire.ConsumeBytes(p)
			if n < 0 {
				return nil, false
			}
			p = p[n:]
			v = v[:len(v):len(v)]
			var ok bool
			switch num {
			case envMsgID:
				env.MsgId, ok = str(v)
			case envIdempotencyKey:
				env.IdempotencyKey, ok = str(v)
			case envSender:
				env.Sender, ok = str(v)
			case envRecipient:
				env.Recipient, ok = str(v)
			case envType:
				env.Type, ok = str(v)
			case envCoalesceKey:
				env.CoalesceKey, ok = str(v)
			case FieldHeaders:
				lim.entries--
				lim.bytes -= n
				if lim.entries < 0 || lim.bytes < 0 {
					return nil, false
				}
				ok = decodeHeader(env, v, str)
			case envBody:
				if body == nil {
					body = new(anypb.Any)
				}
				env.Body = body
				ok = decodeAny(body, v, str, val)
			case envRPC:
				if rpc == nil {
					rpc = new(pb.RpcMeta)
				}
				env.Rpc = rpc
				ok = decodeRPC(rpc, v, str)
			}
			if !ok {
				return nil, false
			}
		default:
			if typ != protowire.VarintType {
				return nil, false
			}
			v, n := protowire.ConsumeVarint(p)
			if n < 0 {
				return nil, false
			}
			p = p[n:]
			switch num {
			case envProtocolVersion:
				env.ProtocolVersion = uint32(v)
			case envCreatedAt:
				env.CreatedAtUnixMs = int64(v)
			case envEventSeq:
				env.EventSeq = v
			case envSequence:
				env.Sequence = v
			case envConflict:
				env.Conflict = pb.Envelope_Conflict(int32(v))
			case envAttempt:
				env.Attempt = uint32(v)
			case envReceipt:
				env.Receipt = pb.Envelope_ReceiptMode(int32(v))
			case envPrevSequence:
				env.PrevSequence = v
			case envStreamEpoch:
				env.StreamEpoch = v
			case envTTL:
				env.TtlMs = int64(v)
			default:
				return nil, false // field 0 cannot occur: ConsumeTag refuses it
			}
		}
	}
	return env, true
}

// decodeHeader adds one headers entry: a key then a value, either absent.
// Entries in another form (reordered, repeated or unknown fields) go back
// to proto.Unmarshal.
func decodeHeader(env *pb.Envelope, v []byte, str func([]byte) (string, bool)) bool {
	var k, val string
	next := protowire.Number(mapKey)
	for len(v) > 0 {
		num, typ, n := protowire.ConsumeTag(v)
		if n < 0 || typ != protowire.BytesType || num < next || num > mapValue {
			return false
		}
		v = v[n:]
		s, n := protowire.ConsumeBytes(v)
		if n < 0 {
			return false
		}
		v = v[n:]
		var ok bool
		if num == mapKey {
			k, ok = str(s)
		} else {
			val, ok = str(s)
		}
		if !ok {
			return false
		}
		next = num + 1
	}
	if env.Headers == nil {
		env.Headers = make(map[string]string, 1)
	}
	env.Headers[k] = val
	return true
}

// decodeAny decodes a body in the form Append writes it.
func decodeAny(a *anypb.Any, v []byte, str func([]byte) (string, bool), val func([]byte) []byte) bool {
	var seen uint8
	for len(v) > 0 {
		num, typ, n := protowire.ConsumeTag(v)
		if n < 0 || typ != protowire.BytesType || num > anyValue || seen&(1<<num) != 0 {
			return false
		}
		seen |= 1 << num
		v = v[n:]
		s, n := protowire.ConsumeBytes(v)
		if n < 0 {
			return false
		}
		v = v[n:]
		if num == anyTypeURL {
			var ok bool
			if a.TypeUrl, ok = str(s); !ok {
				return false
			}
		} else {
			a.Value = val(s)
		}
	}
	return true
}

// decodeRPC decodes an RpcMeta.
func decodeRPC(r *pb.RpcMeta, v []byte, str func([]byte) (string, bool)) bool {
	var seen uint8
	for len(v) > 0 {
		num, typ, n := protowire.ConsumeTag(v)
		if n < 0 || num > rpcReplyTo || seen&(1<<num) != 0 {
			return false
		}
		seen |= 1 << num
		v = v[n:]
		if num == rpcKind {
			if typ != protowire.VarintType {
				return false
			}
			k, n := protowire.ConsumeVarint(v)
			if n < 0 {
				return false
			}
			v = v[n:]
			r.Kind = pb.RpcMeta_Kind(int32(k))
			continue
		}
		if typ != protowire.BytesType {
			return false
		}
		s, n := protowire.ConsumeBytes(v)
		if n < 0 {
			return false
		}
		v = v[n:]
		var ok bool
		switch num {
		case rpcService:
			r.Service, ok = str(s)
		case rpcMethod:
			r.Method, ok = str(s)
		case rpcCorrelationID:
			r.CorrelationId, ok = str(s)
		case rpcReplyTo:
			r.ReplyTo, ok = str(s)
		}
		if !ok {
			return false
		}
	}
	return true
}

// Marshal returns env's encoding, as proto.Marshal does, through this
// codec whenever env allows it, in a buffer with room for spare more bytes.
func Marshal(env *pb.Envelope, spare int) ([]byte, error) {
	if sz, ok := Size(env); ok {
		b := make([]byte, 0, sz.Total+spare)
		if b = Append(b, env, sz); len(b) == sz.Total {
			return b, nil
		}
		// Changed while it was encoded: let proto say what it is now.
	}
	return proto.MarshalOptions{}.MarshalAppend(make([]byte, 0, proto.Size(env)+spare), env)
}
