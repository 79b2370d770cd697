package partition

import "errors"

// Sentinel errors.
var (
	// ErrInvalidConfig is wrapped by Config.Validate errors.
	ErrInvalidConfig = errors.New("partition: invalid config")
	// ErrNilDependency means New got a nil store or deliverer.
	ErrNilDependency = errors.New("partition: nil store or deliverer")
)
