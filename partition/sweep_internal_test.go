package partition

import (
	"context"
	"testing"
	"time"

	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

// A message positively receipted (the receiver ran it) whose Ack is still
// committing is not the sweeper's to give up, even though its TTL and the
// clock skew have run out meanwhile: it would sit in the dead-letter queue
// as "outcome unknown", and a replay would run it a second time.
func TestSweepLeavesMessagesWhoseAckIsCommitting(t *testing.T) {
	clk := outbox.NewManualClock(time.Now())
	r := newTestRelayWith(t, nopDeliverer{}, func(c *outbox.Config) { c.Clock = clk })
	skew := r.store.Config().MaxClockSkew
	sm := &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "a@n1", Sender: "app@n0", Type: "ran", TtlMs: 1000}}
	if err := r.Store(context.Background(), []*pb.StoredMessage{sm})[0]; err != nil {
		t.Fatal(err)
	}
	seq := sm.GetEnvelope().GetSequence()
	st, err := r.lockStream("a@n1")
	if err != nil {
		t.Fatal(err)
	}
	// As deliver leaves a clean emission: receipted, its Ack committing.
	st.emittedHW = seq
	st.ackBatches++
	st.acking = []uint64{seq}
	st.mu.Unlock()
	clk.Advance(time.Second + skew + time.Millisecond) // TTL and skew both over

	if wait := r.sweepOnce(); wait <= 0 || wait > time.Second {
		t.Fatalf("sweep asks to look again in %v, want soon (the Ack decides)", wait)
	}
	if s := r.store.Stats(); s.DLQDepth != 0 || r.store.Pending("a@n1") != 1 {
		t.Fatalf("the sweep gave up a receipted message whose Ack was committing: %d dead letters, %d pending", s.DLQDepth, r.store.Pending("a@n1"))
	}
}

// A candidate whose stream is sending is the emission's to decide, but it
// holds back no other queue: when the sweep gave others up beside it, it
// looks again at once (the next of a long queue may be due), not after the
// second it waits when only busy candidates were left. Before, one stream
// in flight held a down peer's expired backlog to 1,024 give-ups a second.
func TestSweepGoesOnPastABusyCandidate(t *testing.T) {
	clk := outbox.NewManualClock(time.Now())
	r := newTestRelayWith(t, nopDeliverer{}, func(c *outbox.Config) { c.Clock = clk })
	store := func(rcpt string, n int, ttl int64) {
		t.Helper()
		sms := make([]*pb.StoredMessage, n)
		for i := range sms {
			sms[i] = &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: rcpt, Sender: "app@n0", Type: "t", TtlMs: ttl}}
		}
		for _, err := range r.Store(context.Background(), sms) {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	store("a@n1", 1, 1000) // its deadline first
	store("b@n2", 1500, 2000)
	st, err := r.lockStream("a@n1")
	if err != nil {
		t.Fatal(err)
	}
	st.sending = true // an emission of a@n1 awaits its receipts
	st.mu.Unlock()
	clk.Advance(3 * time.Second) // every TTL over; none of b@n2's was sent

	wait := r.sweepOnce()
	if got := r.store.Pending("b@n2"); got != 1500-1023 {
		t.Fatalf("%d of b@n2's messages left after one look, want %d (1,024 candidates, one of them busy)", got, 1500-1023)
	}
	if wait != 0 {
		t.Fatalf("sweep asks to look again in %v after giving messages up beside a busy one, want at once", wait)
	}
	r.sweepOnce()
	if got, busy := r.store.Pending("b@n2"), r.store.Pending("a@n1"); got != 0 || busy != 1 {
		t.Fatalf("pending after the next look: b@n2 %d, a@n1 %d; want 0 and 1 (the emission decides a@n1's)", got, busy)
	}
	if wait := r.sweepOnce(); wait <= 0 || wait > time.Second {
		t.Fatalf("with only the busy candidate left the sweep looks again in %v, want within a second", wait)
	}
}

// Sent messages whose TTL ran out wait out the clock skew before they are
// given up (a copy may still run at the receiver). More of them than the
// sweeper looks at at once (1,024) hold back no other queue: b@n2's, never
// sent, whose TTL ran out after theirs, are given up in the same sweep.
// And the sweeper does not look again at once (it would read the same
// waiting ones every 10 ms for the whole skew) but when the first skew ends.
func TestSweepGoesOnPastMessagesWaitingOutTheSkew(t *testing.T) {
	clk := outbox.NewManualClock(time.Now())
	r := newTestRelayWith(t, nopDeliverer{}, func(c *outbox.Config) { c.Clock = clk })
	skew := r.store.Config().MaxClockSkew
	store := func(rcpt string, n int, ttl int64) uint64 {
		t.Helper()
		sms := make([]*pb.StoredMessage, n)
		for i := range sms {
			sms[i] = &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: rcpt, Sender: "app@n0", Type: "t", TtlMs: ttl}}
		}
		for _, err := range r.Store(context.Background(), sms) {
			if err != nil {
				t.Fatal(err)
			}
		}
		return sms[n-1].GetEnvelope().GetSequence()
	}
	last := store("a@n1", 1100, 1000) // deadlines first
	store("b@n2", 5, 2000)
	st, err := r.lockStream("a@n1")
	if err != nil {
		t.Fatal(err)
	}
	st.emittedHW = last // all of a@n1's were sent; none is in flight now
	st.mu.Unlock()
	clk.Advance(3 * time.Second) // every TTL over, no skew

	wait := time.Duration(0)
	for range 10 { // a pass may take several looks, each going on at once
		if wait = r.sweepOnce(); wait != 0 {
			break
		}
	}
	if got := r.store.Pending("b@n2"); got != 0 {
		t.Fatalf("b@n2's 5 expired messages, never sent, still queued behind a@n1's 1,100 waiting out the skew: %d left", got)
	}
	if got := r.store.Pending("a@n1"); got != 1100 {
		t.Fatalf("a@n1: %d left, want all 1,100 (their skew has not passed)", got)
	}
	if want := skew - 2*time.Second; wait < want-time.Second || wait > want {
		t.Fatalf("the sweeper looks again in %v; want when the first skew ends, in about %v", wait, want)
	}
}
