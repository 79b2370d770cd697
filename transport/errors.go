package transport

import (
	"errors"
	"fmt"
	"time"

	"github.com/quic-go/quic-go"
)

// Sentinel errors. Errors returned by this package wrap one of these (often
// together with the underlying cause), so callers match with errors.Is.
var (
	// ErrUnreachable: the resolver says the peer is unknown or down, or dialing it failed.
	ErrUnreachable = errors.New("transport: peer unreachable")
	// ErrQueueFull: the per-peer bounded send queue is full; retry later.
	ErrQueueFull = errors.New("transport: send queue full")
	// ErrClosed: the Transport was closed.
	ErrClosed = errors.New("transport: closed")
	// ErrFrameTooLarge: a frame (outgoing or announced by a length prefix) exceeds MaxFrameSize.
	ErrFrameTooLarge = errors.New("transport: frame too large")
	// ErrLimitUnconfirmed is wrapped, beside ErrFrameTooLarge, by an
	// EncodeError entry for an envelope within our MaxFrameSize but over
	// the smaller one the peer announced on a connection not shown alive
	// with it (no Hello during the call, no receipt of the batch, and not
	// MaxIdleTimeout since its limit was first doubted): the peer may have
	// restarted in place with another limit, and the next connection may
	// take it. Sending it again later decides.
	ErrLimitUnconfirmed = errors.New("transport: the peer's frame limit is not confirmed")
	// ErrIncompatible: the peer speaks no common protocol version, belongs to
	// another cluster, or claims a name its certificate does not hold.
	ErrIncompatible = errors.New("transport: incompatible peer")
	// ErrConnLost: the connection a receipt waiter depended on failed or was closed.
	ErrConnLost = errors.New("transport: connection lost")
	// ErrBadFrame: bytes from the network are not a valid frame.
	ErrBadFrame = errors.New("transport: malformed frame")
	// ErrBadConfig wraps every Config.Validate failure.
	ErrBadConfig = errors.New("transport: bad config")
	// ErrBadEnvelope: an envelope handed to Request/RequestBatch cannot be sent as asked
	// (no msg id, no receipt mode, mixed recipients, duplicate msg id in flight).
	ErrBadEnvelope = errors.New("transport: invalid envelope")
	// ErrBadOrigin: a forwarded envelope's origin, or a receipt's signature,
	// does not verify (certificate not of the cluster CA or not the named
	// node's, signature not matching, fields that cannot be checked).
	ErrBadOrigin = errors.New("transport: origin does not verify")
)

// EncodeError reports envelopes of a RequestBatch that could not be put on
// the wire (their frame would exceed MaxFrameSize, or they could not be
// encoded). The other envelopes of the batch were sent; their receipts are
// returned beside this error.
type EncodeError struct {
	Errs map[int]error // by index in the batch
}

func (e *EncodeError) Error() string {
	return fmt.Sprintf("transport: %d envelopes of the batch cannot be sent (first: %v)", len(e.Errs), e.first())
}

func (e *EncodeError) first() error {
	best := -1
	for i := range e.Errs {
		if best < 0 || i < best {
			best = i
		}
	}
	return e.Errs[best]
}

// QueueFullError is the ErrQueueFull of a send that did not fit the
// peer's send queue (errors.Is(err, ErrQueueFull) holds). RetryAfter is
// when it would fit at the rate the connection has been writing: the time
// to write the excess (5 ms before the connection has measured a rate),
// and at least as long as no write has completed, between a millisecond
// and a second.
type QueueFullError struct {
	Peer       string
	Queued     int64  // what the queue held
	Unit       string // of Queued: "envelopes" or "bytes"
	RetryAfter time.Duration
}

func (e *QueueFullError) Error() string {
	return fmt.Sprintf("%v: %d %s queued for %s", ErrQueueFull, e.Queued, e.Unit, e.Peer)
}

// Unwrap makes errors.Is(err, ErrQueueFull) hold.
func (e *QueueFullError) Unwrap() error { return ErrQueueFull }

// errDuplicate: our dial lost the simultaneous-dial tie-break; the peer's
// connection is the one to use. A *CloseError with CodeDuplicate matches it.
var errDuplicate = fmt.Errorf("%w: duplicate connection closed by peer", ErrConnLost)

// CloseError says why a peer closed a connection: one of the Code*
// application codes and its reason. errors.Is maps the code to this
// package's sentinels, so callers need not know the codes: CodeIncompatible
// and CodeNameMismatch match ErrIncompatible, every code matches
// ErrConnLost except those two.
type CloseError struct {
	Code   quic.ApplicationErrorCode
	Reason string
	Remote bool // the peer closed it (else this node did)
}

func (e *CloseError) Error() string {
	who := "this node"
	if e.Remote {
		who = "the peer"
	}
	switch e.Code {
	case CodeIncompatible, CodeNameMismatch:
		return "transport: refused by " + who + ": " + e.Reason
	case CodeGoAway:
		return "transport: " + who + " is shutting down"
	case CodeIdle:
		return "transport: " + who + " closed the connection after a time without traffic"
	}
	return fmt.Sprintf("transport: connection closed by %s (code %d): %s", who, uint64(e.Code), e.Reason)
}

// Is maps the close code to the sentinels (see the type's doc).
func (e *CloseError) Is(target error) bool {
	switch target {
	case ErrIncompatible:
		return e.Code == CodeIncompatible || e.Code == CodeNameMismatch
	case ErrConnLost:
		return e.Code != CodeIncompatible && e.Code != CodeNameMismatch
	case errDuplicate:
		return e.Code == CodeDuplicate
	}
	return false
}

// QUIC application error codes this package closes connections with. The
// peer sees them in a *quic.ApplicationError; logs name them.
const (
	CodeNormal        quic.ApplicationErrorCode = 0 // ClosePeer or an ordinary close
	CodeGoAway        quic.ApplicationErrorCode = 1 // the node shuts down
	CodeIncompatible  quic.ApplicationErrorCode = 2 // no common protocol version or another cluster
	CodeNameMismatch  quic.ApplicationErrorCode = 3 // Hello name differs from the certificate's name
	CodeProtocol      quic.ApplicationErrorCode = 4 // malformed or unexpected frame
	CodeFrameTooLarge quic.ApplicationErrorCode = 5 // a length prefix above MaxFrameSize
	CodeDuplicate     quic.ApplicationErrorCode = 6 // a second connection for the same peer pair lost the tie-break
	CodeReplaced      quic.ApplicationErrorCode = 7 // a newer connection took its place: the peer restarted, moved, dialed again, or had closed it
	CodeIdle          quic.ApplicationErrorCode = 8 // no frame either way for IdleConnTimeout; the next send dials again
)
