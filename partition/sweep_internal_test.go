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
