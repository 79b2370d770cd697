//go:build !unix

package storecheck

import (
	"os"
	"time"
)

// lockShared does nothing where flock does not exist: bbolt's own lock at
// open still keeps two processes apart.
func lockShared(*os.File, time.Duration) error { return nil }
