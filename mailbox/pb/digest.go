package pb

import (
	"crypto/sha256"
	"encoding/binary"
	"math"
)

// RequestDigest identifies a stored message across its copies, whose msg
// ids differ (each emission makes its own) as their TTLs and attempts do,
// by what its sender stored: the creation time, correlation id, type,
// idempotency key and body.
func RequestDigest(env *Envelope) [sha256.Size]byte {
	h := sha256.New()
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(env.GetCreatedAtUnixMs()))
	h.Write(b[:])
	for _, f := range []string{env.GetRpc().GetCorrelationId(), env.GetType(), env.GetIdempotencyKey(), env.GetBody().GetTypeUrl()} {
		binary.BigEndian.PutUint64(b[:], uint64(len(f)))
		h.Write(b[:])
		h.Write([]byte(f))
	}
	h.Write(env.GetBody().GetValue())
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}

// StreamDigest is what a receiver keeps of the message at a stream's
// watermark, and what a receipt's watermark_digest carries: enough of
// RequestDigest to tell a copy from another message sent under the same
// sequence by a sender whose outbox went back. Never 0, which stands for
// unknown, nor math.MaxUint64, which receivers keep for their own use.
func StreamDigest(env *Envelope) uint64 {
	d := RequestDigest(env)
	return min(max(binary.BigEndian.Uint64(d[:8]), 1), math.MaxUint64-1)
}
