package outbox

import "errors"

// Sentinel errors. Wrapped errors name the operation that failed; match them
// with errors.Is.
var (
	// ErrClosed is returned by every call on a closed Store.
	ErrClosed = errors.New("outbox: closed")
	// ErrLocked means Open could not take the data file's lock within
	// Config.LockTimeout: another process (usually another node on the same
	// data directory) holds it.
	ErrLocked = errors.New("outbox: data file is locked by another process")
	// ErrExpired means the envelope's expires_at had passed before it was
	// stored; it was counted as expired and not stored.
	ErrExpired = errors.New("outbox: message already expired")
	// ErrNoRecipient means the envelope is nil or has no recipient.
	ErrNoRecipient = errors.New("outbox: envelope has no recipient")
	// ErrBadRecipient means the recipient is not of the form "actor@node".
	ErrBadRecipient = errors.New("outbox: recipient must be actor@node")
	// ErrEmptyFilter means Replay or Purge was called with a filter that
	// selects nothing in particular and without DLQFilter.All.
	ErrEmptyFilter = errors.New("outbox: empty dead-letter filter needs All")
	// ErrInvalidConfig is wrapped by Config.Validate errors.
	ErrInvalidConfig = errors.New("outbox: invalid config")
	// ErrCorrupt means a stored record could not be decoded.
	ErrCorrupt = errors.New("outbox: corrupt record")
	// ErrBadKey means an idempotency key (with its sender) is longer than
	// MaxKeyLen: bbolt would refuse it and fail the whole group commit.
	ErrBadKey = errors.New("outbox: idempotency key too long")
)

// MaxKeyLen bounds idempotency keys (plus the sender, for the dedupe
// window), far below bbolt's 32 KiB key limit.
const MaxKeyLen = 4096
