package mailbox

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"sync"
	"sync/atomic"
)

var (
	// idCipher is AES under a key made at start-up: NewID encrypts a
	// counter with it, so IDs are unique within the process (a
	// permutation of distinct counters) and unpredictable to anyone who
	// has seen others (without the key, the next one is a random 128-bit
	// value). An Ask's correlation id is its message id: a member that
	// sees one of this node's ids must not be able to guess the next.
	idCipher  cipher.Block
	idCounter atomic.Uint64
	// idEpoch is random per process: the high half of the counter block,
	// so two processes never encrypt the same block under equal keys.
	idEpoch uint64
)

func init() {
	var b [48]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go >= 1.24 aborts instead)
	c, err := aes.NewCipher(b[:32])
	if err != nil {
		panic("mailbox: AES-256 with a 32-byte key: " + err.Error()) // cannot happen: the key size is fixed
	}
	idCipher = c
	idEpoch = binary.BigEndian.Uint64(b[32:40])
	idCounter.Store(binary.BigEndian.Uint64(b[40:48]))
}

// NewID returns a 22-character identifier (128 bits, base64url) unique
// within the process and, with overwhelming probability, across processes
// and restarts, and unpredictable from any other ID: the AES encryption,
// under a random per-process key, of a counter. No syscall, one allocation
// (the string).
func NewID() string {
	var b [IDLen]byte
	return string(AppendID(b[:0]))
}

// IDLen is the length of the identifiers NewID and AppendID make.
const IDLen = 22

// AppendID appends a new identifier, as NewID makes, to b: for a sender
// that writes it straight into an encoding, without a string.
func AppendID(b []byte) []byte {
	// The blocks go through an interface call, so they would escape:
	// pooled, they cost no allocation.
	s := idScratch.Get().(*[32]byte)
	binary.BigEndian.PutUint64(s[:8], idEpoch)
	binary.BigEndian.PutUint64(s[8:16], idCounter.Add(1))
	idCipher.Encrypt(s[16:], s[:16])
	// base64url, unpadded: IDs are safe in URLs, headers and file names.
	var d [IDLen]byte
	base64.RawURLEncoding.Encode(d[:], s[16:])
	idScratch.Put(s)
	return append(b, d[:]...)
}

var idScratch = sync.Pool{New: func() any { return new([32]byte) }}

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
