package partition

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

// errDiskFull stands for a write the disk refused (ENOSPC, EIO).
var errDiskFull = errors.New("write outbox.db: no space left on device")

// countingDeliverer answers PROCESSED (or answer, if set) to every
// message while up, and fails every emission (as a lost connection does)
// while down. It counts the emissions of each message type it answered.
type countingDeliverer struct {
	mu     sync.Mutex
	down   bool
	ran    map[string]int
	answer pb.Receipt_Code
}

func (d *countingDeliverer) Alive(string) bool { return true }

func (d *countingDeliverer) Deliver(_ context.Context, node string, envs []*pb.Envelope) ([]*pb.Receipt, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.down {
		return nil, errors.New("connection to " + node + " lost")
	}
	rcs := make([]*pb.Receipt, len(envs))
	for i, e := range envs {
		d.ran[e.GetType()]++
		rcs[i] = &pb.Receipt{MsgId: e.GetMsgId(), Code: pb.Receipt_PROCESSED, Watermark: e.GetSequence()}
		if d.answer != pb.Receipt_CODE_UNSPECIFIED {
			rcs[i] = &pb.Receipt{MsgId: e.GetMsgId(), Code: d.answer, Message: "no"}
		}
	}
	return rcs, nil
}

func (d *countingDeliverer) runs(typ string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ran[typ]
}

func (d *countingDeliverer) setDown(down bool) {
	d.mu.Lock()
	d.down = down
	d.mu.Unlock()
}

// failingAcks makes the relay's Acks fail while failing is set, counting
// the failures.
func failingAcks(r *Relay) (failing *atomic.Bool, failures *atomic.Int64) {
	failing, failures = new(atomic.Bool), new(atomic.Int64)
	failing.Store(true)
	ack := r.ack
	r.ack = func(rcpt string, seqs []uint64) error {
		if failing.Load() {
			failures.Add(1)
			return errDiskFull
		}
		return ack(rcpt, seqs)
	}
	return failing, failures
}

// A message the receiver ran, whose Ack then failed (the disk was full for
// a moment), is known to be delivered: when its TTL and the clock skew run
// out before the receiver is reachable again, the sweeper must not put it
// in the dead-letter queue as "outcome unknown" (an operator replaying
// dead letters would run it a second time); it acks it.
func TestReceiptedMessageWhoseAckFailedIsNotGivenUp(t *testing.T) {
	clk := outbox.NewManualClock(time.Now())
	d := &countingDeliverer{ran: map[string]int{}}
	r := newTestRelayWith(t, d, func(c *outbox.Config) { c.Clock = clk })
	failing, failures := failingAcks(r)
	ack := r.ack
	r.ack = func(rcpt string, seqs []uint64) error {
		// The receiver becomes unreachable as the disk fails: no DUPLICATE
		// can settle the message.
		d.setDown(true)
		return ack(rcpt, seqs)
	}
	r.Start()
	storeMsgs(t, r, message("a@n1", "ran", 1000))
	testutil.WaitFor(t, 10*time.Second, "the Ack of the receipted message to fail", func() bool { return failures.Load() > 0 })
	failing.Store(false)
	clk.Advance(time.Second + r.store.Config().MaxClockSkew + time.Millisecond) // TTL and skew both over
	r.sweepWake <- struct{}{}

	// Delivered is counted after the Ack commits: wait for it (or a dead
	// letter), not for the queue to empty.
	testutil.WaitFor(t, 10*time.Second, "the message to be settled", func() bool {
		return r.Stats().Delivered > 0 || r.store.Stats().DLQDepth > 0
	})
	if s := r.store.Stats(); s.DLQDepth != 0 || r.store.Pending("a@n1") != 0 {
		t.Fatalf("a message the receiver ran, whose Ack had failed once: %d dead letters, %d queued; want none", s.DLQDepth, r.store.Pending("a@n1"))
	}
	if got := r.Stats().Delivered; got != 1 {
		t.Fatalf("Delivered = %d, want 1", got)
	}
	if n := d.runs("ran"); n != 1 {
		t.Fatalf("the receiver got the message %d times, want 1", n)
	}
}

// While Acks fail (a full disk), the messages the receiver already ran are
// not sent to it again and again: each resend would only come back
// DUPLICATE and fail to commit once more. They wait in memory and the Ack
// is retried, backing off, until the disk takes it.
func TestFailingAcksDoNotResendProcessedMessages(t *testing.T) {
	d := &countingDeliverer{ran: map[string]int{}}
	r := newTestRelay(t, d)
	failing, failures := failingAcks(r)
	r.Start()
	storeMsgs(t, r, message("a@n1", "ran", 0))
	testutil.WaitFor(t, 10*time.Second, "four failed Acks", func() bool { return failures.Load() >= 4 })
	if n := d.runs("ran"); n != 1 {
		t.Fatalf("the receiver got the message %d times while its Ack failed %d times, want once", n, failures.Load())
	}
	failing.Store(false)
	testutil.WaitFor(t, 10*time.Second, "the Ack to commit once the disk takes it", func() bool { return r.Stats().Delivered > 0 })
	if n := r.store.Pending("a@n1"); n != 0 {
		t.Fatalf("%d messages still queued after their Ack committed", n)
	}
	if got := r.Stats().Delivered; got != 1 {
		t.Fatalf("Delivered = %d, want 1", got)
	}
	if s := r.store.Stats(); s.DLQDepth != 0 {
		t.Fatalf("%d dead letters, want none", s.DLQDepth)
	}
}

// coalescedVersion is an OVERWRITE message of coalesce key "state" for a@n1.
func coalescedVersion(typ string, ttlMs int64) *pb.StoredMessage {
	return coalescedVersionTo("a@n1", typ, ttlMs)
}

// coalescedVersionTo is coalescedVersion for rcpt.
func coalescedVersionTo(rcpt, typ string, ttlMs int64) *pb.StoredMessage {
	sm := message(rcpt, typ, ttlMs)
	sm.Envelope.Conflict, sm.Envelope.CoalesceKey = pb.Envelope_OVERWRITE, "state"
	return sm
}

// The receiver ran version 1 of a coalesced state; its Ack failed (the
// disk refuses deletes for a while) and the sweeper retries it. Version 2
// of the same key is stored meanwhile and replaces version 1 in the queue
// (which is right: version 1 ran). The stream has one failed Ack batch
// waiting, below MaxAckPending (4): it sends version 2. Counting version
// 1, which waits in st.acking, as still queued would leave nothing to send
// (Pending 1 minus 1).
func TestNewerVersionOfAMessageWhoseAckFailedIsSent(t *testing.T) {
	d := &countingDeliverer{ran: map[string]int{}}
	r := newTestRelay(t, d)
	_, failures := failingAcks(r) // the disk refuses every Ack until the test ends
	r.Start()
	storeMsgs(t, r, coalescedVersion("v1", 0))
	testutil.WaitFor(t, 10*time.Second, "the Ack of v1 to fail", func() bool { return failures.Load() > 0 })
	storeMsgs(t, r, coalescedVersion("v2", 0))
	if n := r.store.Pending("a@n1"); n != 1 {
		t.Fatalf("Pending = %d after v2 replaced v1, want 1", n)
	}
	st := r.part("a@n1").lookup("a@n1")
	st.mu.Lock()
	batches := st.ackBatches
	st.mu.Unlock()
	if batches >= r.cfg.MaxAckPending {
		t.Fatalf("the stream has %d failed Ack batches, MaxAckPending %d: the test needs fewer", batches, r.cfg.MaxAckPending)
	}
	testutil.WaitFor(t, 5*time.Second, "v2 to reach the receiver (the stream has 1 failed Ack batch, MaxAckPending is 4)",
		func() bool { return d.runs("v2") == 1 })
}

// The same with a TTL on version 2: were it held back, the sweeper would
// dead-letter it as "expired", though the receiver was reachable and the
// stream free to send it the whole time.
func TestNewerVersionOfAMessageWhoseAckFailedIsNotExpired(t *testing.T) {
	clk := outbox.NewManualClock(time.Now())
	d := &countingDeliverer{ran: map[string]int{}}
	r := newTestRelayWith(t, d, func(c *outbox.Config) { c.Clock = clk })
	_, failures := failingAcks(r)
	r.Start()
	storeMsgs(t, r, coalescedVersion("v1", 0))
	testutil.WaitFor(t, 10*time.Second, "the Ack of v1 to fail", func() bool { return failures.Load() > 0 })
	v2 := coalescedVersion("v2", 60_000)
	storeMsgs(t, r, v2)
	// Give the relay every chance to send v2: wait until a loop iteration
	// that began after the store has ended (the next one began) with the
	// stream not sending, or until v2 ran.
	st := r.part("a@n1").lookup("a@n1")
	it := r.Stats().Iterations
	testutil.WaitFor(t, 10*time.Second, "v2 sent, or a loop iteration to decline it", func() bool {
		if d.runs("v2") > 0 {
			return true
		}
		r.wakeAll()
		st.mu.Lock()
		busy := st.sending || st.direct
		st.mu.Unlock()
		return r.Stats().Iterations > it+2 && !busy
	})
	clk.Advance(time.Minute + time.Millisecond) // v2's TTL is over
	r.wake()
	testutil.WaitFor(t, 10*time.Second, "v2 to be settled", func() bool { return d.runs("v2") > 0 || r.store.Stats().DLQDepth > 0 })
	if dl := r.store.Stats().DLQDepth; dl != 0 {
		dls, err := r.store.DeadLetters(outbox.DLQFilter{Recipient: "a@n1"})
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range dls {
			t.Errorf("dead letter %s: %q", l.Message.GetEnvelope().GetType(), l.Reason)
		}
		t.Fatalf("v2, a healthy message to a reachable receiver, was dead-lettered (%d dead letters; the receiver ran v2 %d times)", dl, d.runs("v2"))
	}
}

// One recipient's Ack keeps failing (a commit that fails for what it
// writes, not for the disk as a whole) while another's fails only for a
// moment. The second recipient's Ack is retried all the same, and its
// receipted message leaves the queue; stopping each round at the first
// failure would keep it (and its stream) waiting behind the first for
// good.
func TestOneFailingAckDoesNotHoldBackOthers(t *testing.T) {
	d := &countingDeliverer{ran: map[string]int{}}
	r := newTestRelay(t, d)
	var bFailing atomic.Bool
	bFailing.Store(true)
	var aFailures, bFailures atomic.Int64
	ack := r.ack
	r.ack = func(rcpt string, seqs []uint64) error {
		switch {
		case rcpt == "a@n1":
			aFailures.Add(1)
			return errDiskFull
		case rcpt == "b@n2" && bFailing.Load():
			bFailures.Add(1)
			return errDiskFull
		}
		return ack(rcpt, seqs)
	}
	r.Start()
	storeMsgs(t, r, message("a@n1", "a1", 0))
	testutil.WaitFor(t, 10*time.Second, "a's Ack to fail", func() bool { return aFailures.Load() > 0 })
	storeMsgs(t, r, message("b@n2", "b1", 0))
	testutil.WaitFor(t, 10*time.Second, "b's Ack to fail", func() bool { return bFailures.Load() > 0 })
	bFailing.Store(false) // b's Acks commit from now on
	testutil.WaitFor(t, 25*time.Second, "b's receipted message to leave the queue (its Ack commits now)",
		func() bool { return r.store.Pending("b@n2") == 0 })
}

// A verdict the sender's store cannot record (its disk refuses the
// commit) leaves the message at the head of its queue. The stream is
// deferred, backing off while it lasts; sending the message again at once
// would run its handler as fast as the peer answers (about 900 runs a
// second), for as long as the disk refuses, and never count an attempt.
func TestUnrecordedVerdictDefersTheStream(t *testing.T) {
	for _, code := range []pb.Receipt_Code{pb.Receipt_TRANSIENT, pb.Receipt_REJECTED, pb.Receipt_EXPIRED} {
		t.Run(code.String(), func(t *testing.T) {
			d := &countingDeliverer{ran: map[string]int{}, answer: code}
			r := newTestRelay(t, d)
			storeMsgs(t, r, message("a@n1", "m", 0))
			restore, hits := faults.FailCommits(r.store.Config().Path, errDiskFull)
			defer restore()
			r.Start()
			testutil.WaitFor(t, 10*time.Second, "the stream deferred after its verdict could not be recorded", func() bool {
				return hits() > 0 && r.Stats().Deferred > 0
			})
			if n := d.runs("m"); n > 2 {
				t.Fatalf("the message was sent %d times before the stream was deferred", n)
			}
			if s := r.store.Stats(); s.DLQDepth != 0 || r.store.Pending("a@n1") != 1 {
				t.Fatalf("%d dead letters, %d queued while the disk refused writes; want 0 and 1", s.DLQDepth, r.store.Pending("a@n1"))
			}
		})
	}
}

// A message whose TTL ran out while the disk refuses writes sits at the
// head of the queue of a reachable peer. Each emission's Head gives it up,
// which is a write: refused, Head fails. The stream is deferred, backing
// off; due again at once, the partition loop would spin (about 14,000
// iterations and refused commits a second) for as long as the disk
// refuses.
func TestExpiredHeadOnAFullDiskDefersTheStream(t *testing.T) {
	r, hits := expiredOnAFullDisk(t, &countingDeliverer{ran: map[string]int{}})
	r.Start()
	testutil.WaitFor(t, 10*time.Second, "the stream deferred after its Head was refused", func() bool {
		return hits() > 0 && r.Stats().Deferred > 0
	})
}

// The sweeper's give-up of an expired message, refused by the disk, is
// tried again after a wait that doubles from 100 ms (up to 10 s), not at
// its next look 10 ms later, which would be a hundred refused commits and
// logged errors a second.
func TestSweeperBacksOffWhenTheDiskRefusesAGiveUp(t *testing.T) {
	r, _ := expiredOnAFullDisk(t, nopDeliverer{})
	first := r.sweepOnce()
	if first < minWriteRetry {
		t.Fatalf("after a refused give-up the sweeper looks again in %v, want at least %v", first, minWriteRetry)
	}
	if second := r.sweepOnce(); second <= first {
		t.Fatalf("after a second refused give-up it waits %v, want more than %v", second, first)
	}
}

// expiredOnAFullDisk stores a message with a 1 s TTL for a@n1, makes the
// disk refuse every write and lets the TTL run out, so that giving the
// message up is a write the disk refuses. It returns the relay (not
// started) and the count of refused commits.
func expiredOnAFullDisk(t *testing.T, d Deliverer) (*Relay, func() int) {
	t.Helper()
	clk := outbox.NewManualClock(time.Now())
	r := newTestRelayWith(t, d, func(c *outbox.Config) { c.Clock = clk })
	storeMsgs(t, r, message("a@n1", "m", 1000))
	restore, hits := faults.FailCommits(r.store.Config().Path, errDiskFull)
	t.Cleanup(restore)
	clk.Advance(2 * time.Second) // never sent, so plainly expired
	return r, hits
}

// restoredPeer answers every message DUPLICATE with a watermark far above
// anything this sender sent in epoch 0 (this sender's state went back: a
// restored backup), and PROCESSED in any other epoch.
type restoredPeer struct{ sends atomic.Int64 }

func (*restoredPeer) Alive(string) bool { return true }

func (p *restoredPeer) Deliver(_ context.Context, _ string, envs []*pb.Envelope) ([]*pb.Receipt, error) {
	p.sends.Add(1)
	rcs := make([]*pb.Receipt, len(envs))
	for i, e := range envs {
		rcs[i] = &pb.Receipt{MsgId: e.GetMsgId(), Code: pb.Receipt_PROCESSED, Watermark: e.GetSequence()}
		if e.GetStreamEpoch() == 0 {
			rcs[i] = &pb.Receipt{MsgId: e.GetMsgId(), Code: pb.Receipt_DUPLICATE, Watermark: 1 << 60}
		}
	}
	return rcs, nil
}

// The receiver's watermark shows this sender's state went back, so the
// stream starts a new epoch, which is a write. While the disk refuses it,
// the stream resends in the old epoch after a backoff; at once, the same
// DUPLICATE would come back and the stream would spin, one emission per
// round trip (about 10,000 a second).
func TestUnstoredNewEpochDefersTheStream(t *testing.T) {
	d := &restoredPeer{}
	r := newTestRelay(t, d)
	storeMsgs(t, r, message("a@n1", "m", 0))
	restore, hits := faults.FailCommits(r.store.Config().Path, errDiskFull)
	defer restore()
	r.Start()
	testutil.WaitFor(t, 10*time.Second, "the stream deferred after its new epoch was refused", func() bool {
		return hits() > 0 && r.Stats().Deferred > 0
	})
	restore()
	testutil.WaitFor(t, 20*time.Second, "the message delivered in a new epoch once the disk takes writes", func() bool {
		return r.Stats().Delivered == 1
	})
}

// orderDeliverer answers every message with answer and records the types
// it answered PROCESSED, in order.
type orderDeliverer struct {
	mu     sync.Mutex
	answer pb.Receipt_Code
	ran    []string
}

func (d *orderDeliverer) Alive(string) bool { return true }

func (d *orderDeliverer) Deliver(_ context.Context, _ string, envs []*pb.Envelope) ([]*pb.Receipt, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	rcs := make([]*pb.Receipt, len(envs))
	for i, e := range envs {
		rcs[i] = &pb.Receipt{MsgId: e.GetMsgId(), Code: d.answer, Message: "no", Watermark: e.GetSequence()}
		if d.answer == pb.Receipt_PROCESSED {
			d.ran = append(d.ran, e.GetType())
		}
	}
	return rcs, nil
}

func (d *orderDeliverer) set(c pb.Receipt_Code) {
	d.mu.Lock()
	d.answer = c
	d.mu.Unlock()
}

func (d *orderDeliverer) order() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.ran...)
}

// Version 1 of a coalesced state was refused (poison) and sits in the
// dead-letter queue. The disk then refuses writes for a moment, and
// version 2 of the same key is sent with a direct attempt: its version
// must be noted before the receiver can run it (what keeps an older
// version from being replayed over a newer one, also after a crash), and
// the disk refuses the note, so nothing is sent and the send fails, as
// one that must be stored does. Once the disk takes writes again, version
// 2 goes, and an operator's replay of the dead letters leaves version 1
// in the dead-letter queue as superseded: had it run, it would have put
// the receiver's state back to version 1.
func TestVersionNotedOnAFullDiskStillSupersedesAReplay(t *testing.T) {
	d := &orderDeliverer{answer: pb.Receipt_REJECTED}
	r := newTestRelay(t, d)
	r.Start()
	ctx := context.Background()
	v1 := coalescedVersion("v1", 0)
	if sent, err := r.Send(ctx, v1, true); err != nil || sent.Outcome != DeadLettered {
		t.Fatalf("Send(v1) = %+v, %v; want DeadLettered", sent, err)
	}
	d.set(pb.Receipt_PROCESSED)

	restore, _ := faults.FailCommits(r.store.Config().Path, errDiskFull)
	sent, err := r.Send(ctx, coalescedVersion("v2", 0), true)
	restore()
	if err == nil || len(d.order()) != 0 {
		t.Fatalf("Send(v2) with the disk full = %+v, %v, the receiver ran %q; want an error and nothing sent", sent, err, d.order())
	}
	if sent, err := r.Send(ctx, coalescedVersion("v2", 0), true); err != nil || sent.Outcome != Delivered {
		t.Fatalf("Send(v2) = %+v, %v; want Delivered", sent, err)
	}

	n, err := r.store.Replay(outbox.DLQFilter{All: true})
	if err != nil && !errors.Is(err, outbox.ErrSuperseded) {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "the outbox to drain", func() bool { return r.store.Pending("a@n1") == 0 })
	if got := d.order(); n != 0 || len(got) != 1 {
		t.Fatalf("replay after the disk recovered re-queued %d dead letters; the receiver ran %q in that order: v1 ran over the newer v2", n, got)
	}
}

// message is a stored message of type typ for rcpt from app@n0, with a
// TTL of ttlMs (0: none).
func message(rcpt, typ string, ttlMs int64) *pb.StoredMessage {
	return &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: rcpt, Sender: "app@n0", Type: typ, TtlMs: ttlMs}}
}

// storeMsgs stores sms through r (no direct attempt) and fails tb on an
// error.
func storeMsgs(tb testing.TB, r *Relay, sms ...*pb.StoredMessage) {
	tb.Helper()
	for i, err := range r.Store(context.Background(), sms) {
		if err != nil {
			tb.Fatalf("store %s: %v", sms[i].GetEnvelope().GetType(), err)
		}
	}
}
