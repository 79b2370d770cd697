package partition

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

// errDiskFull stands for a write the disk refused (ENOSPC, EIO).
var errDiskFull = errors.New("write outbox.db: no space left on device")

// countingDeliverer answers PROCESSED to every message while up, and
// fails every emission (as a lost connection does) while down. It counts
// the emissions of each message type it answered.
type countingDeliverer struct {
	mu   sync.Mutex
	down bool
	ran  map[string]int
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
	sm := &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "a@n1", Sender: "app@n0", Type: "ran", TtlMs: 1000}}
	if err := r.Store(context.Background(), []*pb.StoredMessage{sm})[0]; err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "the Ack of the receipted message to fail", func() bool { return failures.Load() > 0 })
	failing.Store(false)
	clk.Advance(time.Second + r.store.Config().MaxClockSkew + time.Millisecond) // TTL and skew both over
	r.sweepWake <- struct{}{}

	testutil.WaitFor(t, 10*time.Second, "the message to leave the queue", func() bool { return r.store.Pending("a@n1") == 0 })
	if s := r.store.Stats(); s.DLQDepth != 0 {
		t.Fatalf("a message the receiver ran was dead-lettered (%d dead letters): its Ack had failed once", s.DLQDepth)
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
	sm := &pb.StoredMessage{Envelope: &pb.Envelope{Recipient: "a@n1", Sender: "app@n0", Type: "ran"}}
	if err := r.Store(context.Background(), []*pb.StoredMessage{sm})[0]; err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "four failed Acks", func() bool { return failures.Load() >= 4 })
	if n := d.runs("ran"); n != 1 {
		t.Fatalf("the receiver got the message %d times while its Ack failed %d times, want once", n, failures.Load())
	}
	failing.Store(false)
	testutil.WaitFor(t, 10*time.Second, "the Ack to commit once the disk takes it", func() bool { return r.store.Pending("a@n1") == 0 })
	if got := r.Stats().Delivered; got != 1 {
		t.Fatalf("Delivered = %d, want 1", got)
	}
	if s := r.store.Stats(); s.DLQDepth != 0 {
		t.Fatalf("%d dead letters, want none", s.DLQDepth)
	}
}
