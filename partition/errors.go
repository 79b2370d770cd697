package partition

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"
)

// Sentinel errors.
var (
	// ErrBadConfig is wrapped by Config.Validate errors.
	ErrBadConfig = errors.New("partition: bad config")
	// ErrNilDependency means New got a nil store or deliverer.
	ErrNilDependency = errors.New("partition: nil store or deliverer")
	// ErrCongested is wrapped by a Deliverer error when the local send
	// queue to the peer was full: the emission was not sent. It is the
	// sender's own congestion, so it is never counted against a message;
	// the peer's AIMD limit halves.
	ErrCongested = errors.New("partition: local send queue full")
	// ErrUnreachable is wrapped by a Deliverer error when no connection to
	// the peer could be made, or it was lost before any receipt came: the
	// path failed, whatever membership says of the peer. Emissions that
	// fail so while the peer is alive move its streams to a forwarder
	// (ForwardConfig).
	ErrUnreachable = errors.New("partition: peer unreachable")
	// ErrClosed is returned by Send after Close.
	ErrClosed = errors.New("partition: relay closed")
	// ErrNotYet is wrapped by an UnsendableError entry for a message that
	// cannot be sent now but may be later (the recipient's limits are not
	// confirmed): the stream waits and sends it again, uncounted, as for a
	// lost receipt, instead of making the message poison.
	ErrNotYet = errors.New("partition: cannot be sent yet")
	// ErrOutcomeUnknown is wrapped by Send's error when a direct attempt got
	// no verdict (a timeout, a lost connection) and the message could not
	// be stored after it, or its TTL ran out during it (it is then in the
	// dead-letter queue): the recipient may have run it. Sending it again
	// without an idempotency key the receiver remembers may run it twice.
	ErrOutcomeUnknown = errors.New("partition: outcome unknown: the recipient may have run the message")
)

// CongestedError is ErrCongested with the sender's own estimate of when
// its send queue to the peer has room again: the relay waits that long
// before the stream's next emission (its first deferral without progress;
// later ones back off further). errors.Is(err, ErrCongested) holds.
type CongestedError struct {
	RetryAfter time.Duration // 0: no estimate, the relay backs off
	Err        error         // the transport's refusal
}

func (e *CongestedError) Error() string {
	return fmt.Sprintf("%v (retry after %v): %v", ErrCongested, e.RetryAfter, e.Err)
}

// Unwrap returns ErrCongested and the transport's error.
func (e *CongestedError) Unwrap() []error {
	if e == nil {
		return nil
	}
	return []error{ErrCongested, e.Err}
}

// UnsendableError reports envelopes of an emission that could not be put
// on the wire at all (larger than a frame may be, or not encodable); the
// others were sent. Such a message can never be delivered: it is poison
// and goes to the dead-letter queue, and nothing else is charged for it;
// unless its entry wraps ErrNotYet, which defers it.
type UnsendableError struct {
	Errs map[int]error // by index in the emission
}

func (e *UnsendableError) Error() string {
	idx := make([]int, 0, len(e.Errs))
	for i := range e.Errs {
		idx = append(idx, i)
	}
	sort.Ints(idx)
	parts := make([]string, len(idx))
	for k, i := range idx {
		parts[k] = fmt.Sprintf("envelope %d: %v", i, e.Errs[i])
	}
	return "partition: unsendable: " + strings.Join(parts, "; ")
}
