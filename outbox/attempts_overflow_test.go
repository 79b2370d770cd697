package outbox_test

import (
	"math"
	"testing"

	"github.com/meshnode/meshnode/outbox"
)

// Fail compared a record's attempts, a uint32 read from the file, as
// int(sm.Attempts) >= MaxAttempts: where an int has 32 bits, a record
// with 2^31 attempts or more (a file from a 64-bit node configured with
// MaxAttempts past 2^31, or a record damaged in a way proto still
// decodes) was negative, never dead-lettered at MaxAttempts (here 10),
// and Fail reported a negative count (a 32-bit platform's test).
func TestAttemptsPastAnIntStillDeadLetter(t *testing.T) {
	e := open(t, nil)
	sm := e.msg(t, "a@n1", "x")
	sm.Attempts = 1 << 31
	e.put(t, sm)
	n, dead, err := e.Fail("a@n1", sm.GetEnvelope().GetSequence(), outbox.Failure{Reason: "boom", Counts: true})
	if err != nil {
		t.Fatal(err)
	}
	if want := int(min(uint64(1)<<31+1, math.MaxInt)); !dead || n != want {
		t.Fatalf("Fail of a record at 2^31 attempts (MaxAttempts 10): attempts %d, dead-lettered %v", n, dead)
	}
}
