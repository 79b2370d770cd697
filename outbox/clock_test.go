package outbox_test

import (
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/outbox"
)

// The elapsed clock counts open time at the monotonic rate, and closed
// time on the boot's clock when the store was closed and opened within one
// boot (whatever the wall clock did), or else as the wall clock tells it,
// within [0, MaxDowntime].
func TestElapsedClockAcrossRestarts(t *testing.T) {
	const day = 24 * time.Hour
	tests := []struct {
		name string
		move func(*outbox.ManualClock)
		want time.Duration // elapsed time the restart adds
	}{
		{"an hour down", func(c *outbox.ManualClock) { c.Advance(time.Hour) }, time.Hour},
		{"wall stepped 5 years forward", func(c *outbox.ManualClock) { c.Step(5 * 365 * day) }, 0},
		{"down a week", func(c *outbox.ManualClock) { c.Advance(7 * day) }, 7 * day},
		{"wall stepped 5 years back", func(c *outbox.ManualClock) { c.Step(-5 * 365 * day) }, 0},
		{"down an hour, wall a day back", func(c *outbox.ManualClock) { c.Advance(time.Hour); c.Step(-day) }, time.Hour},
		{"wall a minute on", func(c *outbox.ManualClock) { c.Step(time.Minute) }, 0},
		{"rebooted, an hour down", func(c *outbox.ManualClock) { c.Reboot(); c.Advance(time.Hour) }, time.Hour},
		{"rebooted, wall stepped 5 years forward", func(c *outbox.ManualClock) { c.Reboot(); c.Step(5 * 365 * day) }, day},
		{"rebooted, down a week", func(c *outbox.ManualClock) { c.Reboot(); c.Advance(7 * day) }, day},
		{"rebooted, wall stepped 5 years back", func(c *outbox.ManualClock) { c.Reboot(); c.Step(-5 * 365 * day) }, 0},
		{"rebooted, down an hour, wall a day back", func(c *outbox.ManualClock) { c.Reboot(); c.Advance(time.Hour); c.Step(-day) }, 0},
		{"rebooted, wall a minute on", func(c *outbox.ManualClock) { c.Reboot(); c.Step(time.Minute) }, time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := open(t, func(c *outbox.Config) { c.MaxDowntime = day })
			e.clk.Advance(10 * time.Minute) // open time counts
			if got := e.ElapsedMs(); got != (10 * time.Minute).Milliseconds() {
				t.Fatalf("elapsed while open = %d ms, want 10 min", got)
			}
			e.send(t, "a@n1", "m") // a commit checkpoints the clock
			before := e.ElapsedMs()
			e.reopen(t, tt.move)
			if got := time.Duration(e.ElapsedMs()-before) * time.Millisecond; got != tt.want {
				t.Fatalf("restart added %v, want %v", got, tt.want)
			}
			// The checkpoint at open is the new base: a second restart with
			// no time passing adds nothing.
			at := e.ElapsedMs()
			e.reopen(t, nil)
			if got := e.ElapsedMs(); got != at {
				t.Fatalf("restart without time passing: %d -> %d", at, got)
			}
		})
	}
}

// While the store is open only the monotonic clock counts: wall steps do
// not move ages, TTLs or deferrals.
func TestElapsedClockIgnoresWallStepsWhileOpen(t *testing.T) {
	e := open(t, nil)
	e.clk.Advance(time.Second)
	e.clk.Step(-3 * 365 * 24 * time.Hour)
	if got := e.ElapsedMs(); got != 1000 {
		t.Fatalf("elapsed %d ms after a wall step back, want 1000", got)
	}
	e.clk.Step(6 * 365 * 24 * time.Hour)
	if got := e.ElapsedMs(); got != 1000 {
		t.Fatalf("elapsed %d ms after a wall step forward, want 1000", got)
	}
	// An age is counted on it too.
	e.send(t, "a@n1", "m")
	e.clk.Advance(2 * time.Second)
	if age := e.Stats().OldestAge; age != 2*time.Second {
		t.Fatalf("oldest age %v, want 2s", age)
	}
}

// An idle store persists its elapsed clock every CheckpointInterval, so a
// crash does not lose the time it was idle, whatever MaxDowntime cuts.
// Close writes nothing when nothing is queued, so the reopen below sees
// only what the idle checkpoint wrote.
func TestElapsedClockCheckpointsWhileIdle(t *testing.T) {
	mut := func(c *outbox.Config) { c.CheckpointInterval = 10 * time.Millisecond; c.MaxDowntime = 0 }
	e := open(t, mut)
	e.clk.Advance(time.Hour)
	before := e.Stats().Fsyncs
	testutil.WaitFor(t, 10*time.Second, "an idle checkpoint", func() bool { return e.Stats().Fsyncs > before })
	e.reopen(t, nil)
	if got := e.ElapsedMs(); got < time.Hour.Milliseconds() {
		t.Fatalf("after restart: elapsed %d ms, want the hour that passed while idle", got)
	}
}
