package partition

import (
	"context"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/faults"
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
	sweepStore(t, r, "a@n1", 1, 1000) // its deadline first
	sweepStore(t, r, "b@n2", 1500, 2000)
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
	r, _ := behindTheSkew(t)
	skew := r.store.Config().MaxClockSkew

	wait := sweepPass(t, r) // a pass may take several looks, each going on at once
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

// A queue whose head passed MaxAge while its stream is sending: the
// emission decides (it is busy), nothing else is due, so the sweeper should
// wait the second it waits for any busy candidate, not look again at once.
func TestSweepWaitsASecondForABusyQueueHeadPastItsAge(t *testing.T) {
	clk := outbox.NewManualClock(time.Now())
	r := newTestRelayWith(t, nopDeliverer{}, func(c *outbox.Config) { c.Clock = clk })
	sm := &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "a@n1", Sender: "app@n0", Type: "old"}} // no TTL
	if err := r.Store(context.Background(), []*pb.StoredMessage{sm})[0]; err != nil {
		t.Fatal(err)
	}
	st, err := r.lockStream("a@n1")
	if err != nil {
		t.Fatal(err)
	}
	st.sending = true // an emission of a@n1 awaits its receipts
	st.mu.Unlock()
	clk.Advance(r.store.Config().MaxAge() + time.Second) // its age passed the limit

	for i := range 5 {
		wait := r.sweepOnce()
		if r.store.Pending("a@n1") != 1 {
			t.Fatalf("look %d: the sweep gave up a message of a stream in flight", i)
		}
		if wait <= 0 {
			t.Fatalf("look %d: with only a busy (too old) candidate the sweeper looks again in %v, want about a second (it spins every 10 ms while the emission lasts)", i, wait)
		}
	}
}

// A message whose TTL deadline is before the pass's cursor when its commit
// lands (it was checked at the enqueue, its commit came after a look of
// the sweep: a committer busy for longer than its TTL) is behind the
// cursor: the sweep going on after the cursor does not see it, and the
// pass ends waiting for the skew of the others (a minute), while this one,
// never sent and past its TTL, stays queued. Before, each look started
// from the first candidate and the store's expiresAt wake-up found it.
func TestSweepFindsAMessageCommittedBehindWhereItWentOn(t *testing.T) {
	clk := outbox.NewManualClock(time.Now())
	r := newTestRelayWith(t, nopDeliverer{}, func(c *outbox.Config) { c.Clock = clk })
	sms := make([]*pb.StoredMessage, 1024)
	for i := range sms {
		sms[i] = &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "a@n1", Sender: "app@n0", Type: "t", TtlMs: 1000}}
	}
	for _, err := range r.Store(context.Background(), sms) {
		if err != nil {
			t.Fatal(err)
		}
	}
	st, err := r.lockStream("a@n1")
	if err != nil {
		t.Fatal(err)
	}
	st.emittedHW = sms[len(sms)-1].GetEnvelope().GetSequence() // all sent, none in flight
	st.mu.Unlock()
	stb, err := r.lockStream("b@n2") // known to the relay: nothing of it emitted
	if err != nil {
		t.Fatal(err)
	}
	stb.mu.Unlock()
	clk.Advance(500 * time.Millisecond)

	// Hold the committer (in a done callback) so that b@n2's message,
	// checked now, is committed only after the sweep's first look.
	blocked, release := make(chan struct{}), make(chan struct{})
	seq, err := r.store.ReserveSequence()
	if err != nil {
		t.Fatal(err)
	}
	blocker := &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "c@n3", Sender: "app@n0", Type: "t", Sequence: seq}}
	if err := r.store.EnqueueAsync(context.Background(), blocker, func(outbox.Result, error) { close(blocked); <-release }); err != nil {
		t.Fatal(err)
	}
	<-blocked
	seq, err = r.store.ReserveSequence()
	if err != nil {
		close(release)
		t.Fatal(err)
	}
	bDone := make(chan error, 1)
	b := &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "b@n2", Sender: "app@n0", Type: "t", TtlMs: 100, Sequence: seq}}
	if err := r.store.EnqueueAsync(context.Background(), b, func(_ outbox.Result, err error) { bDone <- err }); err != nil {
		close(release)
		t.Fatal(err)
	}
	clk.Advance(1500 * time.Millisecond) // every TTL over; a@n1's skew not

	r.sweepOnce() // a full look of a@n1's, all waiting out the skew
	close(release)
	if err := <-bDone; err != nil {
		t.Fatal(err)
	}
	// Now committed, deadline 600 ms, 1.4 s ago, never sent.
	wait := time.Duration(0)
	for range 10 {
		if wait = r.sweepOnce(); wait != 0 {
			break
		}
	}
	if got := r.store.Pending("b@n2"); got != 0 {
		t.Fatalf("b@n2's message, never sent, 1.4 s past its TTL, is still queued and the sweeper next looks in %v", wait)
	}
}

// sweepStore stores n messages for rcpt with a TTL of ttl ms (0: none)
// and returns the last one's sequence.
func sweepStore(t *testing.T, r *Relay, rcpt string, n int, ttl int64) uint64 {
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

// sweepSet changes rcpt's stream under its lock.
func sweepSet(t *testing.T, r *Relay, rcpt string, f func(*stream)) {
	t.Helper()
	st, err := r.lockStream(rcpt)
	if err != nil {
		t.Fatal(err)
	}
	f(st)
	st.mu.Unlock()
}

// sweepPass runs looks until one asks to wait, and returns that wait.
func sweepPass(t *testing.T, r *Relay) time.Duration {
	t.Helper()
	for range 50 {
		if w := r.sweepOnce(); w != 0 {
			return w
		}
	}
	t.Fatal("the sweep looks again at once 50 times")
	return 0
}

// Sent messages whose skew ends while the pass is past them are given up
// by the next pass at once.
func TestSweepGivesUpWhatsSkewEndedWhileItWentOn(t *testing.T) {
	r, clk := behindTheSkew(t)
	skew := r.store.Config().MaxClockSkew
	if w := r.sweepOnce(); w != 0 {
		t.Fatalf("full look: %v", w)
	}
	clk.Advance(skew) // a@n1's skew over
	w := sweepPass(t, r)
	if a, b := r.store.Pending("a@n1"), r.store.Pending("b@n2"); a != 0 || b != 0 {
		t.Fatalf("left a %d b %d, wait %v", a, b, w)
	}
}

// 1,024 busy candidates and due ones after them; then the busy one's wait.
func TestSweepGoesOnPastAFullLookOfBusyCandidates(t *testing.T) {
	clk := outbox.NewManualClock(time.Now())
	r := newTestRelayWith(t, nopDeliverer{}, func(c *outbox.Config) { c.Clock = clk })
	sweepStore(t, r, "a@n1", 1024, 1000)
	sweepStore(t, r, "b@n2", 3000, 2000)
	sweepSet(t, r, "a@n1", func(st *stream) { st.sending = true })
	sweepSet(t, r, "b@n2", func(*stream) {})
	clk.Advance(3 * time.Second)
	w := sweepPass(t, r)
	if a, b := r.store.Pending("a@n1"), r.store.Pending("b@n2"); a != 1024 || b != 0 {
		t.Fatalf("left a %d b %d, wait %v", a, b, w)
	}
	if w <= 0 || w > time.Second {
		t.Fatalf("wait %v", w)
	}
}

// Exactly 1,024 waiting out the skew, and a queue head past MaxAge.
func TestSweepReachesAnOldQueueHeadAfterAFullLook(t *testing.T) {
	clk := outbox.NewManualClock(time.Now())
	r := newTestRelayWith(t, nopDeliverer{}, func(c *outbox.Config) {
		c.Clock = clk
		c.StreamRetention = 10 * time.Hour
		c.RetentionMargin = 2 * time.Hour
	})
	sweepStore(t, r, "c@n3", 1, 0)
	clk.Advance(8*time.Hour - 10*time.Second)
	last := sweepStore(t, r, "a@n1", 1024, 1000)
	sweepSet(t, r, "a@n1", func(st *stream) { st.emittedHW = last })
	clk.Advance(11 * time.Second)
	w := sweepPass(t, r)
	if a, c := r.store.Pending("a@n1"), r.store.Pending("c@n3"); a != 1024 || c != 0 {
		t.Fatalf("left a %d c %d, wait %v", a, c, w)
	}
	if want := r.store.Config().MaxClockSkew - 10*time.Second; w > want || w < want-time.Second {
		t.Fatalf("wait %v want ~%v", w, want)
	}
}

// The disk refuses a give-up in the middle of a pass; once it takes them
// again, everything due goes.
func TestSweepStartsAgainAfterTheDiskRefusedAGiveUp(t *testing.T) {
	r, _ := behindTheSkew(t)
	if w := r.sweepOnce(); w != 0 {
		t.Fatalf("full look: %v", w)
	}
	restore, hits := faults.FailCommits(r.store.Config().Path, errDiskFull)
	w := r.sweepOnce()
	restore()
	if hits() == 0 || w <= 0 {
		t.Fatalf("hits %d wait %v", hits(), w)
	}
	w = sweepPass(t, r)
	if b := r.store.Pending("b@n2"); b != 0 {
		t.Fatalf("b left %d wait %v", b, w)
	}
}

// behindTheSkew is a relay on a manual clock with 1,100 messages for
// a@n1, all sent (none in flight), then 5 for b@n2, never sent; the clock
// is past every TTL (1 and 2 s) but not a@n1's skew: more waiting than a
// look reads, with due ones behind them.
func behindTheSkew(t *testing.T) (*Relay, *outbox.ManualClock) {
	t.Helper()
	clk := outbox.NewManualClock(time.Now())
	r := newTestRelayWith(t, nopDeliverer{}, func(c *outbox.Config) { c.Clock = clk })
	last := sweepStore(t, r, "a@n1", 1100, 1000) // deadlines first
	sweepStore(t, r, "b@n2", 5, 2000)
	sweepSet(t, r, "a@n1", func(st *stream) { st.emittedHW = last })
	sweepSet(t, r, "b@n2", func(*stream) {})
	clk.Advance(3 * time.Second)
	return r, clk
}
