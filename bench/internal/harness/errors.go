package harness

import "errors"

// Sentinels of the harness. Phase errors wrap them with the phase's name.
var (
	// ErrBadConfig: Config.Validate refused the configuration.
	ErrBadConfig = errors.New("bench: bad config")
	// ErrTimeout: a phase did not reach its end state (all received, all
	// drained, cluster converged) within its deadline.
	ErrTimeout = errors.New("bench: timed out")
	// ErrFrameTooLarge: a raw QUIC frame announced a length above the limit.
	ErrFrameTooLarge = errors.New("bench: frame too large")
	// ErrChild: the RSS child process failed or printed no result.
	ErrChild = errors.New("bench: child process failed")
)
