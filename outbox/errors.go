package outbox

import (
	"errors"

	"github.com/meshnode/meshnode/internal/storecheck"
)

// Sentinel errors. Wrapped errors name the operation that failed; match them
// with errors.Is.
var (
	// ErrClosed is returned by every call on a closed Store.
	ErrClosed = errors.New("outbox: closed")
	// ErrFailed means the store stopped: the disk failed a commit after
	// bbolt had written it into the file (its fsync failing, most likely),
	// so the commit is what the file shows, but whether it survives a
	// crash is unknown. Every write and Head fails with it from then on
	// (Store.Err says why); reopening the store (restarting the node)
	// reads what the file holds.
	ErrFailed = errors.New("outbox: store failed: the disk failed a commit it had already written; restart to reopen the file")
	// ErrLocked means Open could not take the data file's lock within
	// Config.LockTimeout: another process (usually another node on the same
	// data directory) holds it.
	ErrLocked = errors.New("outbox: data file is locked by another process")
	// ErrExpired means the message's TTL had run out before it was stored.
	ErrExpired = errors.New("outbox: message already expired")
	// ErrNoRecipient means the envelope is nil or has no recipient.
	ErrNoRecipient = errors.New("outbox: envelope has no recipient")
	// ErrBadRecipient means the recipient is not of the form "actor@node".
	ErrBadRecipient = errors.New("outbox: recipient must be actor@node")
	// ErrBadMessage means a message cannot be stored as given: no sequence,
	// a TTL out of range, a key too long.
	ErrBadMessage = errors.New("outbox: bad message")
	// ErrEmptyFilter means Replay or Purge was called with a filter that
	// selects nothing in particular and without the "all" flag.
	ErrEmptyFilter = errors.New("outbox: a filter that selects every dead letter needs the explicit all flag")
	// ErrBadConfig is wrapped by Config.Validate errors.
	ErrBadConfig = errors.New("outbox: bad config")
	// ErrCorrupt means a stored record could not be decoded.
	ErrCorrupt = errors.New("outbox: corrupt record")
	// ErrFormat means the file was written by a newer meshnode, in a layout
	// this one does not know.
	ErrFormat = errors.New("outbox: unknown file format")
	// ErrSuperseded means Replay was asked for an OVERWRITE dead letter
	// whose coalesce key has a newer version.
	ErrSuperseded = errors.New("outbox: superseded by a newer version")
	// ErrDamaged means the file's structure is broken: bbolt would crash on
	// it, so it is not opened (`meshnode doctor --salvage` copies what is
	// readable into a new file).
	ErrDamaged = storecheck.ErrDamaged
	// ErrLost means the file is missing or empty but its data directory had
	// an outbox (recorded in outbox.db.id): its messages would silently be
	// gone (`meshnode doctor --forget` accepts that).
	ErrLost = storecheck.ErrLost
	// ErrReplaced means the file is another outbox than the one its data
	// directory had.
	ErrReplaced = storecheck.ErrReplaced
)

// MaxKeyLen bounds idempotency and coalesce keys (plus the names scoping
// them), far below bbolt's 32 KiB key limit.
const MaxKeyLen = 4096
