// Package testutil holds helpers shared by meshnode's tests. It is not public API.
package testutil

import (
	"testing"
	"time"
)

// WaitFor polls cond until it returns true or timeout passes, then fails tb
// with msg. Tests use it instead of sleeping to wait for a state.
func WaitFor(tb testing.TB, timeout time.Duration, msg string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	wait := time.Millisecond
	for {
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %v waiting for: %s", timeout, msg)
		}
		time.Sleep(wait) // polling interval, not synchronisation: cond decides
		if wait < 50*time.Millisecond {
			wait *= 2
		}
	}
}
