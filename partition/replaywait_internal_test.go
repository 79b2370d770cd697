package partition

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
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
	f := newSlowFanout(t)
	replayed := make(chan int, 1)
	go func() { n, _ := f.r.store.Replay(outbox.DLQFilter{Recipient: "a@n1"}); replayed <- n }()
	testutil.WaitFor(t, 5*time.Second, "Replay reserved its sequence for a@n1", func() bool {
		sta := f.r.part("a@n1").lookup("a@n1")
		if sta == nil {
			return false
		}
		sta.mu.Lock()
		defer sta.mu.Unlock()
		return len(sta.storing) == 2 // v2's (fan-out) and the replay's
	})
	f.finish(t)
	n := <-replayed
	testutil.WaitFor(t, 10*time.Second, "queues drained", func() bool { return f.r.store.Pending("a@n1") == 0 && f.r.store.Pending("x@n1") == 0 })
	testutil.WaitFor(t, 10*time.Second, "a@n1 ran something", func() bool { return len(f.ran("a@n1")) > 0 })
	if got := f.ran("a@n1"); got[len(got)-1] != "v2" {
		t.Fatalf("a@n1 ran %q (replayed %d): version 2, stored by a fan-out under a lower sequence before the Replay reserved one, never ran; the replayed older version 1 superseded it while the fan-out waited for x@n1's lock, held by a direct Send noting its version on a slow disk", got, n)
	}
}

// As TestReplayWaitsForANewerVersionAFanOutIsStoring, but the relay is
// closed while the Replay waits for version 2's commit: Reserve refuses
// the sequence (ErrClosed) rather than hand it out without the wait, so
// the fan-out, already past its own check for a closed relay, stores
// version 2 and nothing older is queued above it. When Reserve handed the
// sequence out anyway, the replay committed version 1 above version 2,
// which was then dropped as superseded while Store reported it stored.
func TestCloseDuringAReplaysWaitRefusesItsSequence(t *testing.T) {
	f := newSlowFanout(t)
	replayed := make(chan int, 1)
	go func() { n, _ := f.r.store.Replay(outbox.DLQFilter{Recipient: "a@n1"}); replayed <- n }()
	testutil.WaitFor(t, 5*time.Second, "Replay waiting in Reserve", func() bool { return f.r.reserveWaiting.Load() > 0 })
	closed := make(chan struct{})
	go func() { _ = f.r.Close(); close(closed) }()
	testutil.WaitFor(t, 10*time.Second, "Reserve released from waitStored by Close", func() bool { return f.r.reserveWaiting.Load() == 0 })
	f.unblock() // the slow note commits; the Replay's op would be queued before the fan-out's
	var n int
	select {
	case n = <-replayed:
	case <-time.After(10 * time.Second):
		t.Fatal("Replay did not return after Close")
	}
	f.finish(t)
	<-closed
	f.checkV2Stored(t, fmt.Sprintf("the Replay (replayed %d), released from waitStored by Close, requeued the older version 1 above it", n))
}

// As TestCloseDuringAReplaysWaitRefusesItsSequence, but the Replay starts
// after the relay closed while the fan-out that stores version 2 is still
// in flight: the closed relay stays the store's sequencer and refuses it.
// When Close uninstalled the sequencer, the Replay took a plain sequence
// without waiting, above version 2's, and version 2 was then dropped as
// superseded though Store reported it stored.
func TestReplayAfterTheRelayClosedIsRefused(t *testing.T) {
	f := newSlowFanout(t)
	closed := make(chan struct{})
	go func() { _ = f.r.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return while a note commits slowly")
	}
	type replayed struct {
		n   int
		err error
	}
	done := make(chan replayed, 1)
	go func() { n, err := f.r.store.Replay(outbox.DLQFilter{Recipient: "a@n1"}); done <- replayed{n, err} }()
	select {
	case got := <-done:
		if got.n != 0 || !errors.Is(got.err, ErrClosed) {
			f.unblock()
			t.Fatalf("Replay after Close: %d, %v; want 0 and ErrClosed", got.n, got.err)
		}
	case <-time.After(5 * time.Second):
		f.unblock()
		got := <-done
		t.Fatalf("Replay after Close went ahead (%d, %v): its op waited behind the slow commit instead of being refused", got.n, got.err)
	}
	f.finish(t)
	f.checkV2Stored(t, "a Replay after Close took version 1 above it without waiting")
}

// slowFanout is the race the tests above close: version 1 of a@n1's
// "state" is dead-lettered; a direct OVERWRITE Send to x@n1 holds x's
// stream lock while its version note commits on a slow disk (until
// unblock); a fan-out (Relay.Store) of [a@n1 v2, x@n1 m] has taken version
// 2's sequence and waits for x's lock.
type slowFanout struct {
	r         *Relay
	d         *versionsPeer
	v2        *pb.StoredMessage
	unblock   func()
	xDone     chan struct{}
	storeDone chan []error
}

func newSlowFanout(t *testing.T) *slowFanout {
	t.Helper()
	f := &slowFanout{d: &versionsPeer{entered: make(chan struct{}), refused: map[string]bool{}, ran: map[string][]string{}},
		xDone: make(chan struct{}), storeDone: make(chan []error, 1)}
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
	t.Cleanup(restore)
	var once sync.Once
	f.unblock = func() { once.Do(func() { close(release) }) }
	t.Cleanup(f.unblock) // never leave the committer stuck on the slow write
	f.r = newTestRelayWith(t, f.d, func(c *outbox.Config) { c.Path = path })
	f.r.Start()
	ctx := context.Background()
	v := func(rcpt, typ string) *pb.StoredMessage { return coalescedVersionTo(rcpt, typ, 0) }
	if sent, err := f.r.Send(ctx, v("a@n1", "v1"), true); err != nil || sent.Outcome != DeadLettered {
		t.Fatalf("Send(v1) = %+v, %v; want DeadLettered", sent, err)
	}
	if _, err := f.r.store.ReserveSequence(); err != nil { // the sequence block is on disk before the slow commit
		t.Fatal(err)
	}
	slow.Store(true)
	go func() {
		defer close(f.xDone)
		_, _ = f.r.Send(ctx, v("x@n1", "x1"), true)
	}()
	<-entered // x's note is committing; Send(x) holds x's stream lock
	f.v2 = v("a@n1", "v2")
	go func() { f.storeDone <- f.r.Store(ctx, []*pb.StoredMessage{f.v2, message("x@n1", "m", 0)}) }()
	waitBlocked(t, "(*Relay).Store", nil)
	return f
}

// finish lets the slow commit end and checks that the fan-out stored both.
func (f *slowFanout) finish(t *testing.T) {
	t.Helper()
	f.unblock()
	<-f.xDone
	for i, e := range <-f.storeDone {
		if e != nil {
			t.Fatalf("Store[%d]: %v", i, e)
		}
	}
}

// checkV2Stored checks that version 2, which Store reported stored, is in
// the outbox; why says what happened when it is not.
func (f *slowFanout) checkV2Stored(t *testing.T, why string) {
	t.Helper()
	seq := f.v2.GetEnvelope().GetSequence()
	got, err := f.r.store.Stored(seq)
	if err != nil {
		t.Fatal(err)
	}
	if got == nil || got.GetEnvelope().GetType() != "v2" {
		t.Fatalf("Store reported version 2 (#%d) stored, but it is not in the outbox (pending for a@n1: %d): %s, and version 2 was dropped as superseded", seq, f.r.store.Pending("a@n1"), why)
	}
}

func (f *slowFanout) ran(rcpt string) []string {
	f.d.mu.Lock()
	defer f.d.mu.Unlock()
	return slices.Clone(f.d.ran[rcpt])
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
		v := func(typ string) *pb.StoredMessage { return coalescedVersionTo(rcpt, typ, 0) }
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
