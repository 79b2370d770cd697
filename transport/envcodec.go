package transport

import (
	"fmt"

	"github.com/meshnode/meshnode/internal/envcodec"
	"github.com/meshnode/meshnode/mailbox/pb"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Envelopes go through internal/envcodec, which falls back to the generic
// proto path for anything it was not written for.

// appendEnvelopeFrame appends the length-prefixed frame of env, as
// appendMsgFrame(dst, frameFieldEnvelope, env, max) does, with the
// hand-written encoder when env allows it. A frame above max is refused
// with ErrFrameTooLarge and dst is returned unchanged.
func appendEnvelopeFrame(dst []byte, env *pb.Envelope, max int) ([]byte, error) {
	sz, ok := envcodec.Size(env)
	if !ok {
		return appendMsgFrame(dst, frameFieldEnvelope, env, max)
	}
	inner := protowire.SizeTag(frameFieldEnvelope) + protowire.SizeBytes(sz.Total)
	if inner > max {
		return dst, fmt.Errorf("%w: %d bytes, limit %d", ErrFrameTooLarge, inner, max)
	}
	start := len(dst)
	dst = protowire.AppendVarint(dst, uint64(inner))
	dst = protowire.AppendTag(dst, frameFieldEnvelope, protowire.BytesType)
	dst = protowire.AppendVarint(dst, uint64(sz.Total))
	body := len(dst)
	dst = envcodec.Append(dst, env, sz)
	if len(dst)-body != sz.Total {
		return dst[:start], fmt.Errorf("transport: encode frame: size changed during encoding (envelope modified concurrently?)")
	}
	return dst, nil
}

// decodeEnvelope decodes b as proto.Unmarshal into a new pb.Envelope would.
// The fast path copies b once; every string and the body value point into
// that copy. Input it was not written for is handed to proto.Unmarshal.
func decodeEnvelope(b []byte) (*pb.Envelope, error) {
	return decodeEnvelopeOwned(b, false)
}

// decodeEnvelopeOwned is decodeEnvelope for a b that nothing else refers
// to or writes (owned: a frame read into a buffer of its own). Then the
// body value is b's own bytes and the strings are small copies, so the
// envelope holds the frame's bytes once, and a string an application keeps
// (a message id) does not pin a large body.
func decodeEnvelopeOwned(b []byte, owned bool) (*pb.Envelope, error) {
	if env, ok := decodeEnvelopeFastMode(b, owned); ok {
		return env, nil
	}
	env := new(pb.Envelope)
	if err := proto.Unmarshal(b, env); err != nil {
		return nil, err
	}
	return env, nil
}

// decodeEnvelopeFast is decodeEnvelope's fast path; ok=false means "use
// proto.Unmarshal", never that b is bad.
func decodeEnvelopeFast(b []byte) (*pb.Envelope, bool) { return decodeEnvelopeFastMode(b, false) }

// decodeEnvelopeFastMode is decodeEnvelopeOwned's fast path.
func decodeEnvelopeFastMode(b []byte, owned bool) (*pb.Envelope, bool) {
	return envcodec.Decode(b, owned)
}
