package outbox_test

import (
	"testing"
	"time"

	"github.com/meshnode/meshnode/outbox"
)

// Restarts mixing reboots and same-boot restarts, wall steps both
// ways, crashes right after open: the elapsed clock never goes back, a
// same-boot restart counts exactly what passed, a reboot at most
// MaxDowntime and never less than zero, and no later restart counts a
// stretch again.
func TestMixedRestartsNeverCountTwiceOrGoBack(t *testing.T) {
	e := open(t, nil)
	last := e.ElapsedMs()
	want := int64(0)
	check := func(step string, wantAdd time.Duration) {
		t.Helper()
		got := e.ElapsedMs()
		want += wantAdd.Milliseconds()
		if got < last || got != want {
			t.Fatalf("%s: elapsed %d (was %d), want %d", step, got, last, want)
		}
		last = got
	}
	crash := func() {
		t.Helper()
		if err := e.Abandon(); err != nil {
			t.Fatal(err)
		}
		e.Store = mustOpen(t, config(e.path, e.clk, nil))
	}
	e.clk.Advance(time.Hour)
	check("run", time.Hour)
	e.reopen(t, func(c *outbox.ManualClock) { c.Step(-30 * time.Hour); c.Advance(2 * time.Hour) })
	check("same boot, wall back", 2*time.Hour)
	crash()
	check("crash right after open", 0)
	e.reopen(t, func(c *outbox.ManualClock) { c.Reboot(); c.Step(30 * time.Hour); c.Advance(time.Hour) })
	check("reboot, wall corrected forward: believed within MaxDowntime", 24*time.Hour)
	e.reopen(t, func(c *outbox.ManualClock) { c.Advance(3 * time.Hour) })
	check("same boot after reboot", 3*time.Hour)
	e.reopen(t, func(c *outbox.ManualClock) { c.Reboot(); c.Step(-48 * time.Hour); c.Advance(time.Hour) })
	check("reboot, wall back", 0)
	crash()
	check("crash right after open", 0)
	e.reopen(t, func(c *outbox.ManualClock) { c.Step(48 * time.Hour); c.Advance(5 * time.Hour) })
	check("same boot, wall forward", 5*time.Hour)
	e.clk.Advance(30 * time.Minute)
	crash()
	check("crash after idle run (no checkpoint since open)", 30*time.Minute)
	e.reopen(t, func(c *outbox.ManualClock) { c.Reboot(); c.Advance(time.Hour) })
	check("reboot, wall honest", time.Hour)
}
