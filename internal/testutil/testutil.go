// Package testutil holds helpers shared by meshnode's tests. It is not public API.
package testutil

import (
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// WaitFor polls cond until it returns true or timeout passes, then fails tb
// with msg. Tests use it instead of sleeping to wait for a state.
func WaitFor(tb testing.TB, timeout time.Duration, msg string, cond func() bool) {
	tb.Helper()
	if !Poll(timeout, cond) {
		tb.Fatalf("timed out after %v waiting for: %s", timeout, msg)
	}
}

// Poll is WaitFor for a goroutine other than the test's, which must not
// call FailNow: it reports whether cond came true within timeout.
func Poll(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	wait := time.Millisecond
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(wait) // polling interval, not synchronisation: cond decides
		if wait < 50*time.Millisecond {
			wait *= 2
		}
	}
}

// VerifyTestMain runs the tests, then checks for leaked goroutines with
// goleak. memberlist's Shutdown does not wait for its probe goroutines (they
// end within one probe timeout), so before goleak's own short check it polls
// for up to 5 s until no unexpected goroutine is left. Packages that start
// memberlist (mesh, node, testnet, ...) use it instead of goleak.VerifyTestMain.
func VerifyTestMain(m *testing.M, opts ...goleak.Option) {
	goleak.VerifyTestMain(settle{m: m, opts: opts}, opts...)
}

type settle struct {
	m    *testing.M
	opts []goleak.Option
}

func (s settle) Run() int {
	code := s.m.Run()
	deadline := time.Now().Add(5 * time.Second)
	for goleak.Find(s.opts...) != nil && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond) // polling interval; goleak.Find decides
	}
	return code
}

// CopyFile copies the file from to to (created or truncated), as an
// operator restoring a backup would.
func CopyFile(tb testing.TB, from, to string) {
	tb.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		tb.Fatal(err)
	}
}
