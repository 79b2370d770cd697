package mailbox

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors. Match them with errors.Is; never match error strings.
var (
	// ErrMailboxFull means a mailbox (local or remote) refused an item
	// because it is at capacity. Errors that carry it are usually a
	// *CapacityError with a RetryAfter hint.
	ErrMailboxFull = errors.New("mailbox: full")
	// ErrClosed means the mailbox (or the runtime around it) is closed.
	ErrClosed = errors.New("mailbox: closed")
	// ErrNoSuchActor means no actor of that name exists on the node.
	ErrNoSuchActor = errors.New("mailbox: no such actor")
	// ErrUnknownMethod means the recipient serves no method of that
	// (service, method): it carries status code Unimplemented across the
	// wire, and is permanent (a retry cannot succeed).
	ErrUnknownMethod = errors.New("mailbox: unknown method")
	// ErrDuplicateCorrelation means a waiter for that correlation id is
	// already registered.
	ErrDuplicateCorrelation = errors.New("mailbox: correlation id already registered")
	// ErrEmptyCorrelation means a correlation id was empty.
	ErrEmptyCorrelation = errors.New("mailbox: empty correlation id")
	// ErrExpired means a message's expiry passed before it was processed.
	ErrExpired = errors.New("mailbox: expired")
	// ErrBadConfig means a Config failed Validate.
	ErrBadConfig = errors.New("mailbox: bad config")
)

// CapacityError reports that a mailbox (local or remote) is full.
// errors.Is(err, ErrMailboxFull) is true for it.
type CapacityError struct {
	// RetryAfter is the estimated time until the mailbox has room again
	// (time to drain half the queue at the recent processing rate).
	RetryAfter time.Duration
	// Depth is the number of queued items when the item was refused
	// (0 when unknown, e.g. for a remote mailbox).
	Depth int
	// Capacity is the mailbox capacity (0 when unknown).
	Capacity int
}

// Error implements error.
func (e *CapacityError) Error() string {
	if e.Capacity > 0 {
		return fmt.Sprintf("mailbox: full (%d/%d queued), retry after %v", e.Depth, e.Capacity, e.RetryAfter)
	}
	return fmt.Sprintf("mailbox: full, retry after %v", e.RetryAfter)
}

// Unwrap returns ErrMailboxFull.
func (e *CapacityError) Unwrap() error { return ErrMailboxFull }

// permanentError marks its error as poison: no retry.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent marks a handler error as poison: the message is not retried and
// goes straight to the dead-letter queue. Permanent(nil) is nil. The result
// still matches the wrapped error with errors.Is and errors.As.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	var p *permanentError
	if errors.As(err, &p) {
		return err
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether err was marked with Permanent anywhere in its
// chain, is ErrUnknownMethod, or is a *RemoteError with code Rejected or
// Unimplemented (a remote permanent error).
func IsPermanent(err error) bool {
	if err == nil {
		return false
	}
	var p *permanentError
	if errors.As(err, &p) || errors.Is(err, ErrUnknownMethod) {
		return true
	}
	var re *RemoteError
	return errors.As(err, &re) && (re.Code == Rejected || re.Code == Unimplemented)
}
