package admin

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/meshnode/meshnode/internal/inbox"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/outbox"
)

// Codes of ErrorBody.Code: what kind of failure, for programs (the CLI maps
// them to exit codes). Retryable: CodeUnreachable, CodeCapacity,
// CodeTimeout. Permanent: CodeBadRequest, CodeNotFound, CodeConflict,
// CodeUnauthorized.
const (
	CodeBadRequest   = "bad_request"
	CodeUnauthorized = "unauthorized"
	CodeNotFound     = "not_found"
	CodeConflict     = "conflict"
	CodeCapacity     = "capacity"
	CodeUnreachable  = "unreachable"
	CodeTimeout      = "timeout"
	CodeRemote       = "remote" // the recipient's handler failed
	CodeInternal     = "internal"
)

// mayHaveRun ends the sentences of a send that may have run (ErrOutcomeUnknown).
const mayHaveRun = "may have run the message: send it again only with an idempotency key (--key) the recipient still remembers"

func codeOf(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType:
		return CodeBadRequest
	case http.StatusUnauthorized, http.StatusForbidden:
		return CodeUnauthorized
	case http.StatusNotFound:
		return CodeNotFound
	case http.StatusConflict:
		return CodeConflict
	case http.StatusTooManyRequests:
		return CodeCapacity
	case http.StatusServiceUnavailable:
		return CodeUnreachable
	case http.StatusGatewayTimeout:
		return CodeTimeout
	case http.StatusBadGateway:
		return CodeRemote
	}
	return CodeInternal
}

// sendError names the API operation and its destination, so that Describe
// can say "ask orders@edge2: ..." once instead of every layer's prefix.
type sendError struct {
	op  string // tell, ask or send
	to  node.Address
	err error
}

func (e *sendError) Error() string { return e.op + " " + e.to.String() + ": " + e.err.Error() }
func (e *sendError) Unwrap() error { return e.err }

// Describe turns an error of the API into one sentence that reads once: the
// operation and its destination, then what happened in the user's words (no
// package prefixes, no Go field names). Errors it does not recognise are
// returned as they are.
func Describe(err error) string {
	var se *sendError
	prefix := ""
	if errors.As(err, &se) {
		prefix = se.op + " " + se.to.String() + ": "
	}
	var ce *node.CapacityError
	var re *node.RemoteError
	var mbe *http.MaxBytesError
	switch {
	case errors.Is(err, outbox.ErrEmptyFilter):
		return "no dead letters selected: give ids, a recipient, a reason or older_than, or all to mean every one (CLI: --id, --recipient, --reason, --older-than or --all)"
	case errors.As(err, &mbe):
		return fmt.Sprintf("request body larger than %d bytes", mbe.Limit)
	case errors.Is(err, inbox.ErrFailed):
		return "this node's inbox store stopped: the disk failed to sync a commit (see the daemon's log); check the disk and restart the daemon"
	case se == nil:
		return err.Error()
	case errors.Is(err, node.ErrNoSuchActor):
		return fmt.Sprintf("%sno actor %q runs on node %q", prefix, se.to.Actor, se.to.Node)
	case errors.Is(err, node.ErrUnreachable):
		return fmt.Sprintf("%snode %q is unreachable (not a live member of the cluster, or it did not answer)", prefix, se.to.Node)
	case errors.As(err, &ce):
		return fmt.Sprintf("%sthe recipient is full: try again in %v", prefix, ce.RetryAfter.Round(time.Millisecond))
	case errors.Is(err, node.ErrMailboxFull), errors.Is(err, inbox.ErrFull):
		return prefix + "the recipient is full: try again later"
	case errors.Is(err, node.ErrOutcomeUnknown) && !errors.Is(err, node.ErrStoreFailed):
		return prefix + "no verdict from the recipient in time, and it " + mayHaveRun
	case errors.Is(err, context.DeadlineExceeded):
		return prefix + "no answer before the deadline"
	case errors.As(err, &re):
		if re.Message != "" {
			return fmt.Sprintf("%sthe recipient failed (%s): %s", prefix, re.Code, re.Message)
		}
		return fmt.Sprintf("%sthe recipient failed (%s)", prefix, re.Code)
	case errors.Is(err, node.ErrBadKey):
		return prefix + "the idempotency key is too long"
	case errors.Is(err, outbox.ErrExpired):
		return prefix + "the message expired before it could be stored"
	case errors.Is(err, node.ErrStoreFailed):
		msg := prefix + "this node's outbox stopped taking messages: the disk failed to sync a commit (see the node's log); check the disk and restart the node"
		if errors.Is(err, node.ErrOutcomeUnknown) {
			msg += "; the recipient " + mayHaveRun
		}
		return msg
	}
	return err.Error()
}
