package faultnet

import "errors"

var (
	// ErrCut is returned when a memberlist stream is dialed, read or
	// written across a cut link.
	ErrCut = errors.New("faultnet: link cut")
	// ErrBadProbability is returned by Drop for p outside [0, 1].
	ErrBadProbability = errors.New("faultnet: drop probability must be in [0, 1]")
	// ErrBadDelay is returned by Delay for a negative duration.
	ErrBadDelay = errors.New("faultnet: delay must not be negative")
)
