package partition

import (
	"context"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

// notedPeer answers PROCESSED and records what it got; alive says whether
// membership holds it alive.
type notedPeer struct {
	alive atomic.Bool
	mu    sync.Mutex
	got   []uint64
}

func (d *notedPeer) Alive(string) bool { return d.alive.Load() }

func (d *notedPeer) Deliver(_ context.Context, _ string, envs []*pb.Envelope) ([]*pb.Receipt, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	rcs := make([]*pb.Receipt, len(envs))
	for i, e := range envs {
		d.got = append(d.got, e.GetSequence())
		rcs[i] = &pb.Receipt{MsgId: e.GetMsgId(), Code: pb.Receipt_PROCESSED, Watermark: e.GetSequence()}
	}
	return rcs, nil
}

func (d *notedPeer) received() []uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]uint64(nil), d.got...)
}

// A direct attempt of an OVERWRITE message whose version note the disk
// refuses sends nothing, and counts nothing as sent: the message is
// stored, and when it expires before it was ever sent (the peer went
// down), it is dead-lettered "expired" (never ran). When the stream's
// emitted high-water was raised to it as for an attempt, it was
// dead-lettered "outcome unknown: it was sent", a minute later.
func TestRefusedVersionNoteCountsNothingAsSent(t *testing.T) {
	d := &notedPeer{}
	d.alive.Store(true)
	path := filepath.Join(t.TempDir(), "outbox.db")
	var arm atomic.Bool
	restore := faults.FailWrites(path, errDiskFull, func(meta bool) bool {
		// The first data-page write once armed: the note's commit. The
		// peer is reported down meanwhile, so the message stays queued.
		if !meta && arm.CompareAndSwap(true, false) {
			d.alive.Store(false)
			return true
		}
		return false
	})
	defer restore()
	r := newTestRelayWith(t, d, func(c *outbox.Config) { c.Path, c.MaxClockSkew = path, time.Second })
	r.Start()
	ctx := context.Background()

	if _, err := r.store.ReserveSequence(); err != nil { // the block of sequences is on disk before the fault
		t.Fatal(err)
	}
	arm.Store(true)
	sent, err := r.Send(ctx, coalescedVersion("v1", 400), true)
	if err != nil || sent.Outcome != Queued {
		t.Fatalf("Send with the note refused = %+v, %v; want Queued (stored after the note failed)", sent, err)
	}
	if got := d.received(); len(got) != 0 {
		t.Fatalf("the peer received %v though the note failed", got)
	}
	var dl []outbox.DeadLetter
	testutil.WaitFor(t, 30*time.Second, "the message to expire", func() bool {
		dl, _ = r.store.DeadLetters(outbox.DLQFilter{Recipient: "a@n1"})
		return len(dl) > 0
	})
	if got := d.received(); len(got) != 0 {
		t.Fatalf("the peer received %v", got)
	}
	if dl[0].Reason != outbox.ReasonExpired {
		t.Fatalf("a message never put on the wire (its version note was refused, so no attempt was made) was dead-lettered %q, want %q", dl[0].Reason, outbox.ReasonExpired)
	}
}
