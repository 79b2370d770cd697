//go:build !linux

package main

// monotonicNow is 0 where systemd does not run.
func monotonicNow() int64 { return 0 }
