package partition

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

// Version 1 of a@n1's "state" is dead-lettered. A fan-out (Relay.Store)
// takes version 2's sequence for a@n1 and then waits for the lock of its
// next recipient, x@n1, held by a direct OVERWRITE Send to x noting its
// version on a slow disk. A Replay of a@n1 reserves a sequence above
// version 2's meanwhile. It waits for version 2's commit before its own
// (Relay.Reserve, waitStored), finds it in the coalesce index and leaves
// version 1: the receiver ends on version 2. When it did not wait, it
// requeued version 1 above version 2, which was then dropped as
// superseded, though Store had reported it stored.
func TestReplayWaitsForANewerVersionAFanOutIsStoring(t *testing.T) {
	d := &versionsPeer{entered: make(chan struct{}), refused: map[string]bool{}, ran: map[string][]string{}}
	path := filepath.Join(t.TempDir(), "outbox.db")
	var slow atomic.Bool
	entered, release := make(chan struct{}), make(chan struct{})
	restore := faults.FailWrites(path, errDiskFull, func(meta bool) bool {
		if !meta && slow.CompareAndSwap(true, false) {
			close(entered)
			<-release // a slow disk: this commit's write takes a while
		}
		return false
	})
	defer restore()
	r := newTestRelayWith(t, d, func(c *outbox.Config) { c.Path = path })
	r.Start()
	ctx := context.Background()
	v := func(rcpt, typ string) *pb.StoredMessage {
		sm := message(rcpt, typ, 0)
		sm.Envelope.Conflict, sm.Envelope.CoalesceKey = pb.Envelope_OVERWRITE, "state"
		return sm
	}
	if sent, err := r.Send(ctx, v("a@n1", "v1"), true); err != nil || sent.Outcome != DeadLettered {
		t.Fatalf("Send(v1) = %+v, %v; want DeadLettered", sent, err)
	}
	if _, err := r.store.ReserveSequence(); err != nil { // the sequence block is on disk before the slow commit
		t.Fatal(err)
	}
	slow.Store(true)
	xDone := make(chan struct{})
	go func() {
		defer close(xDone)
		if _, err := r.Send(ctx, v("x@n1", "x1"), true); err != nil {
			t.Errorf("Send(x1): %v", err)
		}
	}()
	<-entered // x's note is committing; Send(x) holds x's stream lock
	storeDone := make(chan []error, 1)
	go func() { storeDone <- r.Store(ctx, []*pb.StoredMessage{v("a@n1", "v2"), message("x@n1", "m", 0)}) }()
	waitBlocked(t, "(*Relay).Store", nil)
	replayed := make(chan int, 1)
	go func() { n, _ := r.store.Replay(outbox.DLQFilter{Recipient: "a@n1"}); replayed <- n }()
	testutil.WaitFor(t, 5*time.Second, "Replay reserved its sequence for a@n1", func() bool {
		sta := r.part("a@n1").lookup("a@n1")
		if sta == nil {
			return false
		}
		sta.mu.Lock()
		defer sta.mu.Unlock()
		return len(sta.storing) == 2 // v2's (fan-out) and the replay's
	})
	close(release)
	<-xDone
	errs := <-storeDone
	for i, e := range errs {
		if e != nil {
			t.Fatalf("Store[%d]: %v", i, e)
		}
	}
	n := <-replayed
	testutil.WaitFor(t, 10*time.Second, "queues drained", func() bool { return r.store.Pending("a@n1") == 0 && r.store.Pending("x@n1") == 0 })
	testutil.WaitFor(t, 10*time.Second, "a@n1 ran something", func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		return len(d.ran["a@n1"]) > 0
	})
	d.mu.Lock()
	got := slices.Clone(d.ran["a@n1"])
	d.mu.Unlock()
	if got[len(got)-1] != "v2" {
		t.Fatalf("a@n1 ran %q (replayed %d): version 2, stored by a fan-out under a lower sequence before the Replay reserved one, never ran; the replayed older version 1 superseded it while the fan-out waited for x@n1's lock, held by a direct Send noting its version on a slow disk", got, n)
	}
}

// A plain stored Send of version 2 races a Replay of the dead-lettered
// version 1, nothing held by the test. Whichever reserves its sequence
// first, version 2 must be the last state run: if the Replay reserved
// first, version 2 (above it) replaces it; if version 2 reserved first,
// the Replay must find it. The receiver ending on version 1 with version
// 2 never run means the Replay requeued the older version above a newer
// one that was reserved but not yet committed, and version 2 was dropped
// as superseded.
func TestReplayWaitsForANewerVersionASendIsStoring(t *testing.T) {
	d := &versionsPeer{entered: make(chan struct{}), refused: map[string]bool{}, ran: map[string][]string{}}
	r := newTestRelay(t, d)
	r.Start()
	ctx := context.Background()
	const rounds = 300
	for i := range rounds {
		rcpt := fmt.Sprintf("a%d@n1", i)
		v := func(typ string) *pb.StoredMessage {
			sm := message(rcpt, typ, 0)
			sm.Envelope.Conflict, sm.Envelope.CoalesceKey = pb.Envelope_OVERWRITE, "state"
			return sm
		}
		if sent, err := r.Send(ctx, v("v1"), true); err != nil || sent.Outcome != DeadLettered {
			t.Fatalf("Send(v1) = %+v, %v", sent, err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = r.store.Replay(outbox.DLQFilter{Recipient: rcpt})
		}()
		if _, err := r.Send(ctx, v("v2"), false); err != nil {
			t.Fatalf("Send(v2): %v", err)
		}
		<-done
		testutil.WaitFor(t, 10*time.Second, "drained", func() bool { return r.store.Pending(rcpt) == 0 })
		testutil.WaitFor(t, 10*time.Second, "ran", func() bool {
			d.mu.Lock()
			defer d.mu.Unlock()
			return len(d.ran[rcpt]) > 0
		})
		d.mu.Lock()
		got := slices.Clone(d.ran[rcpt])
		d.mu.Unlock()
		if got[len(got)-1] != "v2" {
			t.Fatalf("round %d: %s ran %q: the stored version 2 never ran; the replayed older version 1 was the last state", i, rcpt, got)
		}
	}
}
