//go:build !linux

package outbox

import "time"

// bootTime: only Linux tells its boot (see SystemClock).
func bootTime() (time.Duration, bool) { return 0, false }
