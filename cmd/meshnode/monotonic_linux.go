package main

import "golang.org/x/sys/unix"

// monotonicNow is CLOCK_MONOTONIC in nanoseconds.
func monotonicNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0
	}
	return ts.Nano()
}
