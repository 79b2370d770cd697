package outbox

import (
	"runtime"
	"testing"
)

// A boot id is read as the kernel writes it; anything else means the
// platform cannot tell (the wall clock is used).
func TestParseBootID(t *testing.T) {
	const id = "5a0c8e1e-5d3b-4f0e-9a55-1f0c2d7e9b11"
	for in, want := range map[string]string{
		id + "\n":                             id,
		id:                                    id,
		"\n":                                  "",
		"":                                    "",
		string(make([]byte, maxBootID)) + "x": "",
	} {
		if got := parseBootID([]byte(in)); got != want {
			t.Errorf("parseBootID(%q) = %q, want %q", in, got, want)
		}
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
