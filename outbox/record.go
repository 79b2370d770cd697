package outbox

import (
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/meshnode/meshnode/internal/envcodec"
	"github.com/meshnode/meshnode/mailbox/pb"
)

// A queue record's StoredMessage is written and read on every reliable send
// and every message of a drain. The codec below does it with the envelope
// codec the transport uses for frames; whatever it was not written for
// (unknown fields, a field seen twice, invalid UTF-8) answers ok=false and
// the caller takes proto.Marshal or proto.Unmarshal, so records stay
// exactly what the generic code writes and reads.

// Field numbers of pb.StoredMessage.
const (
	smEnvelope      = 1
	smAttempts      = 2
	smFirstEnqueued = 3
	smLastError     = 4
	smDeadLettered  = 5
	smReason        = 6
	smCreated       = 7
)

// sizeVarintField is the size of a varint field whose tag takes one byte,
// absent when zero.
func sizeVarintField(v uint64) int {
	if v == 0 {
		return 0
	}
	return 1 + protowire.SizeVarint(v)
}

// sizeStringField is sizeVarintField for a string; ok=false when s is not
// valid UTF-8 (proto.Marshal refuses it).
func sizeStringField(s string) (int, bool) {
	if s == "" {
		return 0, true
	}
	return 1 + protowire.SizeBytes(len(s)), utf8.ValidString(s)
}

func appendVarintField(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), v)
}

func appendStringField(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	return protowire.AppendString(protowire.AppendTag(b, num, protowire.BytesType), s)
}

// appendStored appends sm as proto.Marshal encodes it; ok=false (and b
// unchanged) when sm needs the generic path.
func appendStored(b []byte, sm *pb.StoredMessage) ([]byte, bool) {
	n, env, ok := storedSize(sm)
	if !ok {
		return b, false
	}
	if cap(b)-len(b) < n {
		b = append(make([]byte, 0, len(b)+n), b...)
	}
	return appendSized(b, sm, env)
}

// storedSize returns the size of sm's encoding and its envelope's sizes;
// ok=false when sm needs the generic path.
func storedSize(sm *pb.StoredMessage) (n int, env envcodec.Sizes, ok bool) {
	if len(sm.ProtoReflect().GetUnknown()) > 0 {
		return 0, env, false
	}
	if e := sm.Envelope; e != nil {
		if env, ok = envcodec.Size(e); !ok {
			return 0, env, false
		}
		n += 1 + protowire.SizeBytes(env.Total)
	}
	last, ok1 := sizeStringField(sm.LastError)
	reason, ok2 := sizeStringField(sm.DeadLetterReason)
	if !ok1 || !ok2 {
		return 0, env, false
	}
	n += sizeVarintField(uint64(sm.Attempts)) + sizeVarintField(uint64(sm.FirstEnqueuedUnixMs)) + last +
		sizeVarintField(uint64(sm.DeadLetteredUnixMs)) + reason + sizeVarintField(uint64(sm.CreatedElapsedMs))
	return n, env, true
}

// appendSized is appendStored once storedSize gave env.
func appendSized(b []byte, sm *pb.StoredMessage, env envcodec.Sizes) ([]byte, bool) {
	start := len(b)
	if e := sm.Envelope; e != nil {
		b = protowire.AppendTag(b, smEnvelope, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(env.Total))
		at := len(b)
		if b = envcodec.Append(b, e, env); len(b)-at != env.Total {
			return b[:start], false // changed while it was encoded
		}
	}
	b = appendVarintField(b, smAttempts, uint64(sm.Attempts))
	b = appendVarintField(b, smFirstEnqueued, uint64(sm.FirstEnqueuedUnixMs))
	b = appendStringField(b, smLastError, sm.LastError)
	b = appendVarintField(b, smDeadLettered, uint64(sm.DeadLetteredUnixMs))
	b = appendStringField(b, smReason, sm.DeadLetterReason)
	b = appendVarintField(b, smCreated, uint64(sm.CreatedElapsedMs))
	return b, true
}

// decodeStored decodes b as proto.Unmarshal would into a new
// pb.StoredMessage; ok=false means "use proto.Unmarshal", never that b is
// bad. Nothing in the result points into b (a record's bytes belong to
// bbolt's transaction).
func decodeStored(b []byte) (*pb.StoredMessage, bool) {
	sm := &pb.StoredMessage{}
	var seen uint8
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || num > smCreated || seen&(1<<num) != 0 {
			return nil, false
		}
		seen |= 1 << num
		b = b[n:]
		switch num {
		case smEnvelope, smLastError, smReason:
			if typ != protowire.BytesType {
				return nil, false
			}
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil, false
			}
			b = b[n:]
			switch num {
			case smEnvelope:
				env, ok := envcodec.Decode(v, false)
				if !ok {
					return nil, false
				}
				sm.Envelope = env
			default:
				if !utf8.Valid(v) {
					return nil, false
				}
				if num == smLastError {
					sm.LastError = string(v)
				} else {
					sm.DeadLetterReason = string(v)
				}
			}
		default:
			if typ != protowire.VarintType {
				return nil, false
			}
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return nil, false
			}
			b = b[n:]
			switch num {
			case smAttempts:
				sm.Attempts = uint32(v)
			case smFirstEnqueued:
				sm.FirstEnqueuedUnixMs = int64(v)
			case smDeadLettered:
				sm.DeadLetteredUnixMs = int64(v)
			case smCreated:
				sm.CreatedElapsedMs = int64(v)
			}
		}
	}
	return sm, true
}
