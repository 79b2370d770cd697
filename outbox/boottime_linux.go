package outbox

import (
	"time"

	"golang.org/x/sys/unix"
)

// bootTime is CLOCK_BOOTTIME: the time since the machine booted, suspends
// included.
func bootTime() (time.Duration, bool) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0, false
	}
	return time.Duration(ts.Nano()), true
}
