package testnet

import "errors"

var (
	// ErrBadIndex: a node index outside the cluster.
	ErrBadIndex = errors.New("testnet: no such node index")
	// ErrNotRunning: the node is killed or stopped.
	ErrNotRunning = errors.New("testnet: node is not running")
	// ErrRunning: Restart of a node that is running.
	ErrRunning = errors.New("testnet: node is running")
	// ErrNotConverged: the cluster did not converge in time.
	ErrNotConverged = errors.New("testnet: cluster did not converge")
	// ErrNotDrained: the messages of a scenario were not all processed in time.
	ErrNotDrained = errors.New("testnet: messages not all processed in time")
	// ErrClosed: the cluster was closed.
	ErrClosed = errors.New("testnet: cluster closed")
	// ErrUnknownScenario: RunScenario was given a name it does not know.
	ErrUnknownScenario = errors.New("testnet: unknown scenario")
	// ErrBadSize: a scenario Size with a non-positive field.
	ErrBadSize = errors.New("testnet: bad scenario size")
)
