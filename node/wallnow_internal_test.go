package node

import (
	"strings"
	"testing"
	"time"
)

// wallNow tells the wall time as time.Now does (within the slew a second
// of NTP adjustment could add), keeps a monotonic reading, and takes a
// fresh reading once its base is a second old: a step of the wall clock
// shows within a second.
func TestWallNowFollowsTheWallClock(t *testing.T) {
	const slack = 5 * time.Millisecond
	check := func(what string) {
		t.Helper()
		before := time.Now()
		w := wallNow()
		after := time.Now()
		if w.Round(0).Before(before.Round(0).Add(-slack)) || w.Round(0).After(after.Round(0).Add(slack)) {
			t.Fatalf("%s: wallNow %v outside [%v, %v]", what, w, before, after)
		}
		if !strings.Contains(w.String(), " m=") { // String shows the monotonic reading
			t.Fatalf("%s: wallNow %v has no monotonic reading", what, w)
		}
		if d := after.Sub(w); d < 0 {
			t.Fatalf("%s: wallNow is %v after a later time.Now by the monotonic clock", what, -d)
		}
	}
	check("first")
	base := wallBase.Load()
	check("from the base")
	if wallBase.Load() != base {
		t.Fatal("a base under a second old was read again: wallNow costs a time.Now")
	}
	// A base a second old, or ahead of the monotonic clock, is read again.
	for _, b := range []time.Time{time.Now().Add(-time.Second - time.Millisecond), time.Now().Add(time.Hour)} {
		wallBase.Store(&b)
		check("after a stale base")
		if wallBase.Load() == &b {
			t.Fatalf("base %v kept", b)
		}
	}
}
