//go:build race

package outbox_test

// raceEnabled: the race detector slows bulk copies down about tenfold, so
// the tests that write hundreds of MiB scale down.
const raceEnabled = true
