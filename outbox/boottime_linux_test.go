package outbox

import (
	"testing"

	"golang.org/x/sys/unix"
)

// The system clock's boot uptime is CLOCK_MONOTONIC, the clock the store
// counts open time on: a restart within one boot then adds just what the
// running store would have counted. CLOCK_BOOTTIME, which goes on while
// the machine is suspended, would count a suspend during the run again as
// downtime at the next restart.
func TestBootUptimeIsTheMonotonicClock(t *testing.T) {
	read := func() int64 {
		var ts unix.Timespec
		if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
			t.Fatal(err)
		}
		return ts.Nano()
	}
	before := read()
	_, up, ok := SystemClock().(Booted).Boot()
	after := read()
	if !ok || int64(up) < before || int64(up) > after {
		t.Fatalf("boot uptime %d ns (ok %v), want CLOCK_MONOTONIC, read between %d and %d", up, ok, before, after)
	}
}
