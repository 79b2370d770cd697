package outbox

import (
	"time"

	"golang.org/x/sys/unix"
)

// bootTime is CLOCK_MONOTONIC: the time since the machine booted, on the
// clock Go's monotonic readings follow (time suspended is left out).
func bootTime() (time.Duration, bool) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, false
	}
	return time.Duration(ts.Nano()), true
}
