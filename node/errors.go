package node

import (
	"errors"

	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/outbox"
	"github.com/meshnode/meshnode/partition"
)

// Sentinels and typed errors of the public API. Check them with errors.Is
// and errors.As; never match on strings.
var (
	// ErrUnreachable: membership says the peer is down (or it is unknown), or
	// it could not be reached. Tell and Ask fail with it at once.
	ErrUnreachable = errors.New("node: peer unreachable")
	// ErrMailboxFull: the recipient's mailbox is full. The error is a
	// *CapacityError carrying RetryAfter; errors.Is(err, ErrMailboxFull) holds.
	ErrMailboxFull = mailbox.ErrMailboxFull
	// ErrNoSuchActor: no actor of that name runs on the recipient's node.
	ErrNoSuchActor = mailbox.ErrNoSuchActor
	// ErrClosed: the node is closed.
	ErrClosed = errors.New("node: closed")
	// ErrNotStarted: the call needs the cluster, and the node was opened
	// (Open) but not started (Start).
	ErrNotStarted = errors.New("node: not started")
	// ErrActorExists: Spawn was given a name already in use on this node.
	ErrActorExists = errors.New("node: actor already exists")
	// ErrBadAddress: an address is not of the form actor@node.
	ErrBadAddress = errors.New("node: bad address")
	// ErrBadKey: an idempotency or coalesce key longer than MaxIdempotencyKey.
	ErrBadKey = errors.New("node: bad idempotency key")
	// ErrBadOption: a send option out of range (a TTL that is not positive
	// or longer than a message may wait).
	ErrBadOption = errors.New("node: bad send option")
	// ErrTooLarge: the message would not fit in a frame on the wire
	// (transport MaxFrameSize, minus room for per-send fields). Refused
	// before anything is stored.
	ErrTooLarge = errors.New("node: message too large")
	// ErrUnknownMethod: the recipient serves no such (service, method)
	// (ServiceMux): an *UnknownMethodError locally, a *RemoteError with
	// code Unimplemented from another node. Permanent: not retried.
	ErrUnknownMethod = mailbox.ErrUnknownMethod
	// ErrStoreFailed: the outbox stopped taking writes because the disk
	// failed a commit it had already written (its fsync, most likely):
	// what survives a crash is unknown, so nothing more is written until
	// the node restarts and reads the file again. TellReliable and
	// TellReliableAsync return it (a message whose commit failed this way
	// may still be in the file, and delivered after the restart);
	// Outbox().Err says it too.
	ErrStoreFailed = outbox.ErrFailed
	// ErrOutcomeUnknown: TellReliable's direct attempt got no verdict (the
	// recipient's handler slower than Relay.DirectTimeout, a lost
	// connection), and then the message could not be stored, or its TTL ran
	// out (it is then in the dead-letter queue, its reason saying "outcome
	// unknown"): the recipient may have run it. Sending it again without an
	// idempotency key (WithIdempotencyKey) the receiver remembers may run
	// it twice.
	ErrOutcomeUnknown = partition.ErrOutcomeUnknown
	// ErrBadConfig: Config.Validate refused the configuration.
	ErrBadConfig = errors.New("node: bad config")
	// ErrSenderMismatch: an envelope from a peer named another node as its
	// sender (or as the node its reply goes to) than the one its
	// certificate proves. It is refused, never run.
	ErrSenderMismatch = errors.New("node: envelope claims another node than the verified peer")
)

// CapacityError says the recipient is full and when to try again.
type CapacityError = mailbox.CapacityError

// RemoteError is an error a handler (or the runtime) returned on another node.
type RemoteError = mailbox.RemoteError

// Permanent marks a handler error as poison: a reliable message that fails
// with it is not retried but goes straight to the sender's dead-letter queue.
func Permanent(err error) error { return mailbox.Permanent(err) }

// IsPermanent reports whether err was marked with Permanent.
func IsPermanent(err error) bool { return mailbox.IsPermanent(err) }
