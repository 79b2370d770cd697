package mailbox

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"sync/atomic"
)

// idAlphabet is base64url: IDs are safe in URLs, headers and file names.
const idAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"

var (
	// idPrefix is random per process, so IDs differ across restarts.
	idPrefix  [11]byte
	idCounter atomic.Uint64
)

func init() {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go >= 1.24 aborts instead)
	encode64(idPrefix[:], binary.BigEndian.Uint64(b[:8]))
	// A random start also makes IDs of two processes with an equal prefix
	// (p = 2^-64) unlikely to collide.
	idCounter.Store(binary.BigEndian.Uint64(b[8:]))
}

// encode64 writes v as 11 base64url digits (66 bits, big-endian).
func encode64(dst []byte, v uint64) {
	for i := 10; i >= 0; i-- {
		dst[i] = idAlphabet[v&63]
		v >>= 6
	}
}

// NewID returns a 22-character identifier unique within the process and,
// with overwhelming probability, across processes and restarts: a random
// 64-bit per-process prefix followed by an atomic counter. No syscall, one
// allocation (the string).
func NewID() string {
	var b [22]byte
	copy(b[:11], idPrefix[:])
	encode64(b[11:], idCounter.Add(1))
	return string(b[:])
}

// DeterministicID returns 32 hex characters (128 bits) of the SHA-256 of
// the parts, each prefixed with its length (8 bytes, big-endian), so
// ("ab", "c") and ("a", "bc") differ.
func DeterministicID(parts ...[]byte) string {
	h := sha256.New()
	var l [8]byte
	for _, p := range parts {
		binary.BigEndian.PutUint64(l[:], uint64(len(p)))
		h.Write(l[:])
		h.Write(p)
	}
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0])[:16])
}

// IdempotencyKeyFor derives a stable idempotency key from the sender, the
// recipient and the body bytes: the same logical message gives the same key
// on every retry and after a restart.
func IdempotencyKeyFor(sender, recipient string, body []byte) string {
	return DeterministicID([]byte(sender), []byte(recipient), body)
}
