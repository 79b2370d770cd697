package outbox

import (
	"encoding/binary"
	"sync"
	"time"
)

// Clock is where the store gets time. Ages, TTLs, deferrals and retention
// are counted on an elapsed clock built from Monotonic while the process
// runs; the wall clock only tells how long the store was closed, and that
// only within Config.MaxDowntime, since the wall clock may step.
type Clock interface {
	// Now returns the wall clock. It may step in either direction.
	Now() time.Time
	// Monotonic returns a reading that moves forward at the real rate and
	// never steps, with an arbitrary origin fixed for the process.
	Monotonic() time.Duration
}

// SystemClock returns the system's wall and monotonic clocks.
func SystemClock() Clock { return systemClock{} }

type systemClock struct{}

var processStart = time.Now()

func (systemClock) Now() time.Time           { return time.Now().Round(0) }
func (systemClock) Monotonic() time.Duration { return time.Since(processStart) }

// ManualClock is a Clock that moves only when told: tests step its wall
// clock by years or advance both clocks by days. Safe for concurrent use.
type ManualClock struct {
	mu        sync.Mutex
	wall      time.Time
	mono      time.Duration
	listeners []func()
}

// NewManualClock returns a ManualClock whose wall clock reads wall.
func NewManualClock(wall time.Time) *ManualClock { return &ManualClock{wall: wall} }

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
// store was open at the monotonic rate, and time it was closed as the wall
// clock says, within [0, MaxDowntime]. It never goes back.
type elapsed struct {
	clock    Clock
	base     int64         // elapsed ms at open
	monoOpen time.Duration // clock.Monotonic() at open
}

// resume starts the elapsed clock from a checkpoint (elapsed ms and wall ms
// persisted together); a missing checkpoint starts it at zero. down is the
// wall-clock difference since the checkpoint, of which only [0,
// maxDowntime] was counted.
func resume(clock Clock, checkpoint []byte, maxDowntime time.Duration) (e elapsed, down time.Duration) {
	e = elapsed{clock: clock, monoOpen: clock.Monotonic()}
	if len(checkpoint) == 16 {
		last := int64(binary.BigEndian.Uint64(checkpoint[:8]))
		lastWall := int64(binary.BigEndian.Uint64(checkpoint[8:]))
		d := clock.Now().UnixMilli() - lastWall
		e.base = last + min(max(d, 0), maxDowntime.Milliseconds())
		down = time.Duration(d) * time.Millisecond
	}
	return e, down
}

// nowMs returns the elapsed clock in milliseconds.
func (e elapsed) nowMs() int64 {
	return e.base + (e.clock.Monotonic() - e.monoOpen).Milliseconds()
}

// checkpoint encodes the elapsed clock with the wall clock, for resume.
func (e elapsed) checkpoint() []byte {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], uint64(e.nowMs()))
	binary.BigEndian.PutUint64(b[8:], uint64(e.clock.Now().UnixMilli()))
	return b[:]
}

// AdjustableClock is the system clock with offsets a test harness moves:
// Advance makes time pass at once (both clocks jump forward, as a long
// partition or a long stop would), Step moves only the wall clock (NTP, an
// operator, a device without a real-time clock). Between calls both
// clocks run at the real rate, so timers and deferrals keep working.
type AdjustableClock struct {
	mu        sync.Mutex
	wall      time.Duration // offset of the wall clock
	mono      time.Duration // offset of the monotonic clock
	listeners []func()
}

// NewAdjustableClock returns an AdjustableClock with no offsets.
func NewAdjustableClock() *AdjustableClock { return &AdjustableClock{} }

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
