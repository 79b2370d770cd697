package testnet

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
)

// Two senders (A and D) cut from C forward through the other members at
// once: a forwarder's lane stream to C names both origins, and the
// envelopes of each arrive as that origin's, in order, exactly once. A
// forwarder restarts in the middle of the backlog (its streams, and the
// names on them, start again), then the cut heals.
func TestTwoOriginsForwardedAcrossARestartAndTheHeal(t *testing.T) {
	rec := NewRecorder(75)
	c := New(t, 4, sinks(rec, NoBug), fastForward())
	const a, b, cc, d = 0, 1, 2, 3

	sendN(t, c, rec, a, cc, 10)
	sendN(t, c, rec, d, cc, 10)
	sent := 20
	if err := c.WaitDrained(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	c.Cut(a, cc)
	c.Cut(d, cc)
	testutil.WaitFor(t, 40*time.Second, "A's and D's streams to C go through a forwarder", func() bool {
		sendN(t, c, rec, a, cc, 3)
		sendN(t, c, rec, d, cc, 3)
		sent += 6
		ra, rd := c.Node(a).Routes()[c.Name(cc)], c.Node(d).Routes()[c.Name(cc)]
		return ra.Via != "" && rd.Via != ""
	})
	if err := c.WaitDrained(40 * time.Second); err != nil {
		t.Fatal(err)
	}

	const backlog = 80
	both := func() { // A and D at once
		var wg sync.WaitGroup
		for _, from := range []int{a, d} {
			wg.Go(func() {
				for range backlog { // t.Errorf, not sendN's Fatalf, off the test's goroutine
					if _, err := SendReliable(context.Background(), rec, c.Node(from), c.Addr("sink", cc)); err != nil {
						t.Errorf("send: %v", err)
						return
					}
				}
			})
		}
		wg.Wait()
		sent += 2 * backlog
	}
	both()
	if err := c.Stop(b); err != nil {
		t.Fatal(err)
	}
	if err := c.Restart(b); err != nil {
		t.Fatal(err)
	}
	both()
	if err := c.WaitDrained(90 * time.Second); err != nil {
		t.Fatal(err)
	}
	if s := c.Node(cc).Stats().Forward; s.Accepted == 0 || s.Refused != 0 {
		t.Fatalf("C's forward stats %+v: want accepted, none refused", s)
	}
	checkReport(t, c, rec, sent)

	c.Heal()
	testutil.WaitFor(t, 40*time.Second, "A and D send to C directly again", func() bool {
		sendN(t, c, rec, a, cc, 3)
		sendN(t, c, rec, d, cc, 3)
		sent += 6
		return len(c.Node(a).Routes()) == 0 && len(c.Node(d).Routes()) == 0
	})
	if err := c.WaitDrained(40 * time.Second); err != nil {
		t.Fatal(err)
	}
	rep := checkReport(t, c, rec, sent)
	t.Logf("%s", rep)
}
