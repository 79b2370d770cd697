package outbox

import (
	"runtime"
	"testing"
	"time"
)

// A boot id and /proc/uptime's text are read as the kernel writes them;
// anything else means the platform cannot tell (the wall clock is used).
func TestParseBoot(t *testing.T) {
	const id = "5a0c8e1e-5d3b-4f0e-9a55-1f0c2d7e9b11"
	tests := []struct {
		name       string
		id, uptime string
		ok         bool
		want       time.Duration
	}{
		{"as the kernel writes them", id + "\n", "12345.67 23456.78\n", true, 12345670 * time.Millisecond},
		{"no idle field", id, "0.01", true, 10 * time.Millisecond},
		{"empty id", "\n", "1.00 1.00", false, 0},
		{"id too long", string(make([]byte, maxBootID+1)) + "x", "1.00 1.00", false, 0},
		{"empty uptime", id, "", false, 0},
		{"uptime not a number", id, "abc 1.00", false, 0},
		{"negative uptime", id, "-5.00 1.00", false, 0},
		{"uptime past 30 years", id, "1e12 1.00", false, 0},
		{"NaN", id, "NaN 1.00", false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gotID, up, ok := parseBoot([]byte(tt.id), []byte(tt.uptime))
			if ok != tt.ok || (ok && (gotID != id || up != tt.want)) {
				t.Fatalf("parseBoot = %q, %v, %v; want ok %v, %v", gotID, up, ok, tt.ok, tt.want)
			}
		})
	}
}

// On Linux the system clock tells its boot, and its uptime moves forward.
func TestSystemClockKnowsItsBoot(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("boot id and uptime are read from Linux's /proc")
	}
	b, ok := SystemClock().(Booted)
	if !ok {
		t.Fatal("the system clock is not Booted")
	}
	id1, up1, ok1 := b.Boot()
	id2, up2, ok2 := b.Boot()
	if !ok1 || !ok2 || id1 == "" || id1 != id2 || up2 < up1 || up1 <= 0 {
		t.Fatalf("Boot() = %q %v %v, then %q %v %v", id1, up1, ok1, id2, up2, ok2)
	}
}
