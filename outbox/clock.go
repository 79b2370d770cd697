package outbox

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Clock is where the store gets time. Ages, TTLs, deferrals and retention
// are counted on an elapsed clock built from Monotonic while the process
// runs. How long the store was closed is counted on the boot's clock when
// the Clock is also Booted and the store was closed and opened within one
// boot; otherwise the wall clock tells it, and only within
// Config.MaxDowntime, since the wall clock may step.
type Clock interface {
	// Now returns the wall clock. It may step in either direction.
	Now() time.Time
	// Monotonic returns a reading that moves forward at the real rate and
	// never steps, with an arbitrary origin fixed for the process.
	Monotonic() time.Duration
}

// Booted is what a Clock may also tell: which boot of the machine the
// process runs in, and how long that boot has lasted on the clock
// Monotonic follows (time suspended is left out, as it is while the store
// runs). A store closed and opened again within one boot counts the time
// between on it, whatever the wall clock did meanwhile, so a restart adds
// just what the running store would have counted; only across a reboot
// does it have to believe the wall clock, within MaxDowntime.
type Booted interface {
	// Boot returns the boot's id and its uptime; ok is false when the
	// platform cannot tell.
	Boot() (id string, uptime time.Duration, ok bool)
}

// SystemClock returns the system's wall and monotonic clocks; on Linux it
// is also Booted (the kernel's boot id and CLOCK_MONOTONIC).
func SystemClock() Clock { return systemClock{} }

type systemClock struct{}

var processStart = time.Now()

func (systemClock) Now() time.Time           { return time.Now().Round(0) }
func (systemClock) Monotonic() time.Duration { return time.Since(processStart) }

func (systemClock) Boot() (string, time.Duration, bool) {
	id := systemBootID()
	if id == "" {
		return "", 0, false
	}
	up, ok := bootTime()
	return id, up, ok
}

// systemBootID is the kernel's id of this boot, read once: a process does
// not outlive its boot. "" where there is none.
var systemBootID = sync.OnceValue(func() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return parseBootID(b)
})

// parseBootID returns the boot id in b, or "" when b does not hold one.
func parseBootID(b []byte) string {
	b = bytes.TrimSpace(b)
	if len(b) == 0 || len(b) > maxBootID {
		return ""
	}
	return string(b)
}

// maxBootID bounds a boot id kept with the checkpoint (Linux's is 36
// bytes).
const maxBootID = 64

// clockBoots numbers the boots of test clocks, which are told apart by id.
var clockBoots atomic.Uint64

func newBootID(kind string) string { return fmt.Sprintf("%s-%d", kind, clockBoots.Add(1)) }

// ManualClock is a Clock that moves only when told: tests step its wall
// clock by years or advance both clocks by days. Safe for concurrent use.
// It is Booted: its boot's uptime is its monotonic reading, and Reboot
// begins another boot.
type ManualClock struct {
	mu        sync.Mutex
	wall      time.Time
	mono      time.Duration
	boot      string
	listeners []func()
}

// NewManualClock returns a ManualClock whose wall clock reads wall.
func NewManualClock(wall time.Time) *ManualClock {
	return &ManualClock{wall: wall, boot: newBootID("manual")}
}

// Boot returns the clock's boot id and its monotonic reading as the uptime.
func (c *ManualClock) Boot() (string, time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.boot, c.mono, c.boot != ""
}

// Reboot begins another boot: a store opened after it can no longer count
// the time it was closed on the boot's clock.
func (c *ManualClock) Reboot() {
	c.mu.Lock()
	c.boot = newBootID("manual")
	c.mu.Unlock()
}

// Now returns the manual wall clock.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.wall
}

// Monotonic returns the manual monotonic reading.
func (c *ManualClock) Monotonic() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mono
}

// Advance moves both clocks forward by d, as time passing does, and tells
// the listeners.
func (c *ManualClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.wall = c.wall.Add(d)
	c.mono += d
	ls := c.listeners
	c.mu.Unlock()
	for _, f := range ls {
		f()
	}
}

// OnAdvance registers f to run after every Advance. f must not block.
func (c *ManualClock) OnAdvance(f func()) {
	c.mu.Lock()
	c.listeners = append(c.listeners, f)
	c.mu.Unlock()
}

// Step moves only the wall clock, by d (negative: backwards), as NTP or an
// operator does.
func (c *ManualClock) Step(d time.Duration) {
	c.mu.Lock()
	c.wall = c.wall.Add(d)
	c.mu.Unlock()
}

// elapsed is the store's elapsed clock: milliseconds that count time the
// store was open at the monotonic rate, and time it was closed on the
// boot's clock when it was closed and opened within one boot, or else as
// the wall clock says, within [0, MaxDowntime]. It never goes back.
type elapsed struct {
	clock    Clock
	base     int64         // elapsed ms at open
	monoOpen time.Duration // clock.Monotonic() at open
	boot     string        // the boot's id ("": the clock cannot tell)
	bootOpen time.Duration // the boot's uptime at open
}

// resume starts the elapsed clock from a checkpoint (elapsed ms and wall ms
// persisted together) and the boot record written with it (see
// checkpoint); a missing checkpoint starts it at zero. down is the time
// since the checkpoint: exact when the boot is the same (exact is true, and
// all of it is counted), else the wall-clock difference, of which only
// [0, maxDowntime] was counted.
func resume(clock Clock, checkpoint, boot []byte, maxDowntime time.Duration) (e elapsed, down time.Duration, exact bool) {
	e = elapsed{clock: clock, monoOpen: clock.Monotonic()}
	if b, ok := clock.(Booted); ok {
		if id, up, ok := b.Boot(); ok && id != "" && len(id) <= maxBootID {
			e.boot, e.bootOpen = id, up
		}
	}
	if len(checkpoint) != 16 {
		return e, 0, false
	}
	last := int64(binary.BigEndian.Uint64(checkpoint[:8]))
	if e.boot != "" && len(boot) == 8+16+len(e.boot) && bytes.Equal(boot[8:24], checkpoint) && string(boot[24:]) == e.boot {
		// Closed and opened within one boot: its clock does not step.
		if then := int64(binary.BigEndian.Uint64(boot[:8])); then >= 0 && then <= e.bootOpen.Milliseconds() {
			d := e.bootOpen.Milliseconds() - then
			e.base = last + d
			return e, time.Duration(d) * time.Millisecond, true
		}
	}
	lastWall := int64(binary.BigEndian.Uint64(checkpoint[8:]))
	d := clock.Now().UnixMilli() - lastWall
	e.base = last + min(max(d, 0), maxDowntime.Milliseconds())
	return e, time.Duration(d) * time.Millisecond, false
}

// nowMs returns the elapsed clock in milliseconds.
func (e elapsed) nowMs() int64 {
	return e.base + (e.clock.Monotonic() - e.monoOpen).Milliseconds()
}

// checkpoint encodes the elapsed clock with the wall clock, and the boot
// record (nil: the clock cannot tell): the boot's uptime, the clock's
// checkpoint it goes with, and the boot's id. The uptime moves with the
// monotonic clock, as the elapsed clock does. The checkpoint inside the
// record ties the two: a meshnode that does not know the record writes a
// new checkpoint and leaves the record stale, and a stale record is not
// believed.
func (e elapsed) checkpoint() (clock, boot []byte) {
	open := e.clock.Monotonic() - e.monoOpen
	clock = make([]byte, 16)
	binary.BigEndian.PutUint64(clock[:8], uint64(e.base+open.Milliseconds()))
	binary.BigEndian.PutUint64(clock[8:], uint64(e.clock.Now().UnixMilli()))
	if e.boot != "" {
		boot = make([]byte, 8, 8+len(clock)+len(e.boot))
		binary.BigEndian.PutUint64(boot, uint64((e.bootOpen + open).Milliseconds()))
		boot = append(append(boot, clock...), e.boot...)
	}
	return clock, boot
}

// AdjustableClock is the system clock with offsets a test harness moves:
// Advance makes time pass at once (both clocks jump forward, as a long
// partition or a long stop would), Step moves only the wall clock (NTP, an
// operator, a device without a real-time clock). Between calls both
// clocks run at the real rate, so timers and deferrals keep working.
//
// It is Booted: its boot's uptime is its monotonic reading, and a store
// closed and opened again on one AdjustableClock is within one boot.
type AdjustableClock struct {
	mu        sync.Mutex
	wall      time.Duration // offset of the wall clock
	mono      time.Duration // offset of the monotonic clock
	boot      string
	listeners []func()
}

// NewAdjustableClock returns an AdjustableClock with no offsets.
func NewAdjustableClock() *AdjustableClock { return &AdjustableClock{boot: newBootID("adjustable")} }

// Boot returns the clock's boot id and its monotonic reading as the uptime.
func (c *AdjustableClock) Boot() (string, time.Duration, bool) {
	up := c.Monotonic()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.boot, up, c.boot != ""
}

// Now returns the system wall clock plus the wall offset.
func (c *AdjustableClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Round(0).Add(c.wall)
}

// Monotonic returns the system monotonic reading plus the monotonic offset.
func (c *AdjustableClock) Monotonic() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Since(processStart) + c.mono
}

// Advance moves both clocks forward by d and tells the listeners.
func (c *AdjustableClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.wall += d
	c.mono += d
	ls := c.listeners
	c.mu.Unlock()
	for _, f := range ls {
		f()
	}
}

// Step moves only the wall clock by d (negative: backwards).
func (c *AdjustableClock) Step(d time.Duration) {
	c.mu.Lock()
	c.wall += d
	c.mu.Unlock()
}

// OnAdvance registers f to run after every Advance (the relay wakes its
// loops: what was deferred may be due now). f must not block.
func (c *AdjustableClock) OnAdvance(f func()) {
	c.mu.Lock()
	c.listeners = append(c.listeners, f)
	c.mu.Unlock()
}
