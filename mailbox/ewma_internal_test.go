package mailbox

import (
	"math"
	"testing"
)

// A group of Handle calls timed together moves the average as far as
// the same calls timed one by one would have, each at the group's mean.
func TestGroupOfCallsWeighsAsManySamples(t *testing.T) {
	for k := 1; k <= clockEvery; k++ {
		var one, group Mailbox[int]
		one.sampleLocked(500, 1)
		group.sampleLocked(500, 1)
		for range k {
			one.sampleLocked(80, 1)
		}
		group.sampleLocked(80, k)
		if math.Abs(one.ewmaNs-group.ewmaNs) > 1e-9 {
			t.Fatalf("%d calls: one by one %.6f ns, as a group %.6f ns", k, one.ewmaNs, group.ewmaNs)
		}
	}
	var first Mailbox[int]
	first.sampleLocked(0.2, 3)
	if first.ewmaNs != 1 {
		t.Fatalf("a first sample under a nanosecond set the average to %v, want 1 (0 means none yet)", first.ewmaNs)
	}
}
