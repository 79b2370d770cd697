package testnet

import (
	"errors"
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
)
