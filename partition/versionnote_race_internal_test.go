package partition

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

// versionsPeer refuses the first copy of type v1 to each recipient as
// poison and processes everything else, recording per recipient the
// types it ran in order. Alive blocks while hold is set, so a test can
// keep Send inside its stream's lock.
type versionsPeer struct {
	hold    atomic.Bool
	entered chan struct{}
	release chan struct{}
	mu      sync.Mutex
	refused map[string]bool
	ran     map[string][]string
}

func (d *versionsPeer) Alive(string) bool {
	if d.hold.CompareAndSwap(true, false) {
		d.entered <- struct{}{}
		<-d.release
	}
	return true
}

func (d *versionsPeer) Deliver(_ context.Context, _ string, envs []*pb.Envelope) ([]*pb.Receipt, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	rcs := make([]*pb.Receipt, len(envs))
	for i, e := range envs {
		r := e.GetRecipient()
		if e.GetType() == "v1" && !d.refused[r] {
			d.refused[r] = true
			rcs[i] = &pb.Receipt{MsgId: e.GetMsgId(), Code: pb.Receipt_REJECTED, Message: "no"}
			continue
		}
		d.ran[r] = append(d.ran[r], e.GetType())
		rcs[i] = &pb.Receipt{MsgId: e.GetMsgId(), Code: pb.Receipt_PROCESSED, Watermark: e.GetSequence()}
	}
	return rcs, nil
}

// Version 1 is dead-lettered; version 2 is sent with a direct attempt
// while an operator replays the dead letters. Send notes version 2 in the
// coalesce index under the stream's lock, and Replay reserves its
// sequence under the same lock, so the replay either comes first (and
// version 2, stored behind it, replaces it) or finds version 2 noted and
// leaves version 1: never does version 1 run after 2. When the note was
// made after the lock was released, a replay in between took version 1
// back above version 2, and the receiver ran it last.
func TestReplayWaitsForADirectAttemptsVersionNote(t *testing.T) {
	d := &versionsPeer{entered: make(chan struct{}), refused: map[string]bool{}, ran: map[string][]string{}}
	r := newTestRelay(t, d)
	r.Start()
	ctx := context.Background()
	const rounds = 300 // before the note was taken under the lock, a round in tens to a hundred or two hit the window
	for i := range rounds {
		rcpt := fmt.Sprintf("a%d@n1", i)
		v := func(typ string) *pb.StoredMessage { return coalescedVersionTo(rcpt, typ, 0) }
		if sent, err := r.Send(ctx, v("v1"), true); err != nil || sent.Outcome != DeadLettered {
			t.Fatalf("Send(v1) = %+v, %v", sent, err)
		}
		d.release = make(chan struct{})
		d.hold.Store(true)
		sendDone := make(chan struct{})
		go func() {
			defer close(sendDone)
			if _, err := r.Send(ctx, v("v2"), true); err != nil {
				t.Errorf("Send(v2): %v", err)
			}
		}()
		<-d.entered // Send holds the stream's lock
		replayDone := make(chan struct{})
		go func() {
			defer close(replayDone)
			_, _ = r.store.Replay(outbox.DLQFilter{Recipient: rcpt})
		}()
		waitBlocked(t, "Reserve", replayDone)
		close(d.release)
		<-sendDone
		<-replayDone
		testutil.WaitFor(t, 10*time.Second, "the stream drained", func() bool { return r.store.Pending(rcpt) == 0 })
		d.mu.Lock()
		got := slices.Clone(d.ran[rcpt])
		d.mu.Unlock()
		if i2, i1 := slices.Index(got, "v2"), slices.Index(got, "v1"); i2 >= 0 && i1 > i2 {
			t.Fatalf("round %d: the receiver ran %q: the replayed older version 1 ran after version 2", i, got)
		}
	}
}
