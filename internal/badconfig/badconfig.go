// Package badconfig is the error every package's Config.Validate returns,
// so that a parent config (node's) can validate the whole tree and report a
// sub-config's problem once: "node: bad config: Outbox: MaxBatch must be
// >= 1", matching both node.ErrBadConfig and outbox.ErrBadConfig, rather
// than a chain of prefixes that repeat the package and the sentinel.
package badconfig

import (
	"errors"
	"fmt"
)

// Error is a failed Validate: Sentinel is the package's ErrBadConfig, Detail
// says what is wrong (naming the field), and Cause, when set, is a more
// specific error (mesh.ErrBadGossipKey, or a sub-config's own *Error).
type Error struct {
	Sentinel error
	Detail   string
	Cause    error
}

// New returns an *Error for sentinel with a formatted detail.
func New(sentinel error, format string, args ...any) *Error {
	return &Error{Sentinel: sentinel, Detail: fmt.Sprintf(format, args...)}
}

// Error reads "<sentinel>: <detail>".
func (e *Error) Error() string { return e.Sentinel.Error() + ": " + e.Detail }

// Unwrap returns the sentinel and the cause, so errors.Is matches either.
func (e *Error) Unwrap() []error {
	if e.Cause == nil {
		return []error{e.Sentinel}
	}
	return []error{e.Sentinel, e.Cause}
}

// Within returns err, a sub-config's Validate failure, as the parent's:
// "<parent sentinel>: <section>: <sub detail>", matching the parent's
// sentinel and everything err matches. An err that is not an *Error keeps
// its own text after the section.
func Within(parent error, section string, err error) *Error {
	var sub *Error
	if errors.As(err, &sub) {
		return &Error{Sentinel: parent, Detail: section + ": " + sub.Detail, Cause: err}
	}
	return &Error{Sentinel: parent, Detail: section + ": " + err.Error(), Cause: err}
}
