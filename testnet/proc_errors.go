package testnet

import (
	"errors"
	"fmt"
)

var (
	// ErrNoNetns: network namespaces are not available (not root, not
	// Linux, no iproute2, or `ip netns add` refused), or a netns verb was
	// called on a cluster started without WithNetns.
	ErrNoNetns = errors.New("testnet: network namespaces unavailable")
	// ErrProcExited: a daemon process exited while it was expected to run.
	ErrProcExited = errors.New("testnet: daemon process exited")
	// ErrBadBinary: the meshnode binary given to StartProcs is missing or
	// not executable.
	ErrBadBinary = errors.New("testnet: bad meshnode binary")
	// ErrBadResponse: an admin API answer that is not the JSON expected.
	ErrBadResponse = errors.New("testnet: bad admin response")
)

// AdminError is a non-2xx answer of a daemon's admin API: the HTTP status
// and the daemon's {"error": "..."} message.
type AdminError struct {
	Status  int
	Message string
}

func (e *AdminError) Error() string {
	return fmt.Sprintf("testnet: admin API: %d: %s", e.Status, e.Message)
}
