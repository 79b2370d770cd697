package mailbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/meshnode/meshnode/mailbox/pb"
)

// Code is the status of a handled message, carried in envelope headers.
type Code int32

// Status codes. Their numeric values are on the wire: never renumber.
const (
	OK               Code = iota // no error
	Unknown                      // an error with no better code
	Capacity                     // the mailbox is full; retry after the hint
	NoSuchActor                  // no actor of that name on the node
	Expired                      // the message expired before processing
	Rejected                     // permanent failure: do not retry
	Transient                    // temporary failure: retry with backoff
	DeadlineExceeded             // the caller's deadline passed
	Canceled                     // the caller canceled
	Unavailable                  // the remote runtime is shutting down or unreachable
	InvalidArgument              // the request was malformed
	Internal                     // a bug or invariant violation on the remote side
	Unimplemented                // the recipient serves no such (service, method)
)

var codeNames = [...]string{
	OK:               "ok",
	Unknown:          "unknown",
	Capacity:         "capacity",
	NoSuchActor:      "no-such-actor",
	Expired:          "expired",
	Rejected:         "rejected",
	Transient:        "transient",
	DeadlineExceeded: "deadline-exceeded",
	Canceled:         "canceled",
	Unavailable:      "unavailable",
	InvalidArgument:  "invalid-argument",
	Internal:         "internal",
	Unimplemented:    "unimplemented",
}

// String implements fmt.Stringer.
func (c Code) String() string {
	if c >= 0 && int(c) < len(codeNames) {
		return codeNames[c]
	}
	return "Code(" + strconv.Itoa(int(c)) + ")"
}

func (c Code) known() bool { return c >= 0 && int(c) < len(codeNames) }

// Header names of the status carried in pb.Envelope.Headers.
const (
	HeaderStatusCode    = "meshnode-status-code"    // decimal Code
	HeaderStatusMessage = "meshnode-status-message" // err.Error() of the handler
	HeaderRetryAfterMs  = "meshnode-retry-after-ms" // decimal milliseconds, Capacity only
)

// RemoteError is an error returned by a handler on another node (or by the
// remote runtime), decoded from status headers.
type RemoteError struct {
	Code    Code
	Message string
}

// Error implements error. It reads once: "remote no-such-actor" rather
// than repeating a sentinel's text the remote side put in the message.
func (e *RemoteError) Error() string {
	if e.Message == "" || (e.Unwrap() != nil && e.Message == e.Unwrap().Error()) {
		return "remote " + e.Code.String()
	}
	return "remote " + e.Code.String() + ": " + e.Message
}

// Unwrap maps the code to a sentinel so errors.Is works across the wire:
// NoSuchActor->ErrNoSuchActor, Capacity->ErrMailboxFull, Expired->ErrExpired,
// DeadlineExceeded->context.DeadlineExceeded, Canceled->context.Canceled,
// Unimplemented->ErrUnknownMethod; other codes unwrap to nil.
func (e *RemoteError) Unwrap() error {
	switch e.Code {
	case NoSuchActor:
		return ErrNoSuchActor
	case Capacity:
		return ErrMailboxFull
	case Expired:
		return ErrExpired
	case DeadlineExceeded:
		return context.DeadlineExceeded
	case Canceled:
		return context.Canceled
	case Unimplemented:
		return ErrUnknownMethod
	}
	return nil
}

// CodeOf classifies err: nil->OK; *RemoteError->its code;
// ErrUnknownMethod->Unimplemented; Permanent->Rejected;
// *CapacityError/ErrMailboxFull->Capacity; ErrNoSuchActor->NoSuchActor;
// ErrExpired->Expired; context errors->DeadlineExceeded/Canceled;
// ErrClosed->Unavailable; anything else->Unknown.
func CodeOf(err error) Code {
	if err == nil {
		return OK
	}
	var re *RemoteError
	if errors.As(err, &re) {
		return re.Code
	}
	// An unknown method is permanent too, but says more than Rejected.
	if errors.Is(err, ErrUnknownMethod) {
		return Unimplemented
	}
	// Permanent first: a handler that marks an error poison means "do not
	// retry" whatever it wraps.
	if IsPermanent(err) {
		return Rejected
	}
	switch {
	case errors.Is(err, ErrMailboxFull):
		return Capacity
	case errors.Is(err, ErrNoSuchActor):
		return NoSuchActor
	case errors.Is(err, ErrExpired):
		return Expired
	case errors.Is(err, context.DeadlineExceeded):
		return DeadlineExceeded
	case errors.Is(err, context.Canceled):
		return Canceled
	case errors.Is(err, ErrClosed):
		return Unavailable
	}
	return Unknown
}

// SetError writes err's code, message (err.Error()) and, for a
// *CapacityError, its retry-after into env.Headers, allocating the map if
// nil. A nil err (or nil env) writes nothing. A non-nil error never encodes
// as OK (a *RemoteError{Code: OK} is written as Unknown).
func SetError(env *pb.Envelope, err error) {
	if err == nil || env == nil {
		return
	}
	code := CodeOf(err)
	if code == OK {
		code = Unknown
	}
	if env.Headers == nil {
		env.Headers = make(map[string]string, 3)
	}
	env.Headers[HeaderStatusCode] = strconv.FormatInt(int64(code), 10)
	env.Headers[HeaderStatusMessage] = err.Error()
	var ce *CapacityError
	if errors.As(err, &ce) {
		env.Headers[HeaderRetryAfterMs] = strconv.FormatInt(ce.RetryAfter.Milliseconds(), 10)
	} else {
		delete(env.Headers, HeaderRetryAfterMs)
	}
}

// ErrorOf decodes the status headers of env: nil when absent or OK; a
// *CapacityError{RetryAfter} for Capacity (a missing, zero or negative hint
// becomes 10 ms, so a hint is always positive); otherwise a *RemoteError.
// Malformed headers (non-numeric, out of range) give a *RemoteError with
// code Unknown describing the problem; ErrorOf never panics.
func ErrorOf(env *pb.Envelope) error {
	h := env.GetHeaders()
	raw, ok := h[HeaderStatusCode]
	if !ok {
		return nil
	}
	msg := h[HeaderStatusMessage]
	n, err := strconv.ParseInt(raw, 10, 32)
	if err != nil {
		return &RemoteError{Code: Unknown, Message: fmt.Sprintf("malformed header %s=%q (message %q)", HeaderStatusCode, raw, msg)}
	}
	code := Code(n)
	switch {
	case code == OK:
		return nil
	case !code.known():
		return &RemoteError{Code: Unknown, Message: fmt.Sprintf("unknown status code %d: %s", n, msg)}
	case code == Capacity:
		ra := defaultRetryAfter
		if s, ok := h[HeaderRetryAfterMs]; ok {
			ms, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				return &RemoteError{Code: Unknown, Message: fmt.Sprintf("malformed header %s=%q (message %q)", HeaderRetryAfterMs, s, msg)}
			}
			if ms > 0 {
				ra = time.Duration(min(ms, int64(maxRetryAfter/time.Millisecond))) * time.Millisecond
			}
		}
		return &CapacityError{RetryAfter: ra}
	}
	return &RemoteError{Code: code, Message: msg}
}
