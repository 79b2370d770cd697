package partition

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/outbox"
)

// As TestCloseDuringAReplaysWaitRefusesItsSequence, but the Replay starts
// after the relay closed while the fan-out that stores version 2 is still
// in flight: the closed relay stays the store's sequencer and refuses it.
// When Close uninstalled the sequencer, the Replay took a plain sequence
// without waiting, above version 2's, and version 2 was then dropped as
// superseded though Store reported it stored.
func TestReplayAfterTheRelayClosedIsRefused(t *testing.T) {
	d := &versionsPeer{entered: make(chan struct{}), refused: map[string]bool{}, ran: map[string][]string{}}
	path := filepath.Join(t.TempDir(), "outbox.db")
	var slow atomic.Bool
	entered, release := make(chan struct{}), make(chan struct{})
	restore := faults.FailWrites(path, errDiskFull, func(meta bool) bool {
		if !meta && slow.CompareAndSwap(true, false) {
			close(entered)
			<-release
		}
		return false
	})
	defer restore()
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	defer unblock()
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
	if _, err := r.store.ReserveSequence(); err != nil {
		t.Fatal(err)
	}
	slow.Store(true)
	xDone := make(chan struct{})
	go func() {
		defer close(xDone)
		_, _ = r.Send(ctx, v("x@n1", "x1"), true)
	}()
	<-entered
	v2 := v("a@n1", "v2")
	storeDone := make(chan []error, 1)
	go func() { storeDone <- r.Store(ctx, []*pb.StoredMessage{v2, message("x@n1", "m", 0)}) }()
	waitBlocked(t, "(*Relay).Store", nil)
	closed := make(chan struct{})
	go func() { _ = r.Close(); close(closed) }()
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
	go func() { n, err := r.store.Replay(outbox.DLQFilter{Recipient: "a@n1"}); done <- replayed{n, err} }()
	select {
	case got := <-done:
		if got.n != 0 || !errors.Is(got.err, ErrClosed) {
			unblock()
			t.Fatalf("Replay after Close: %d, %v; want 0 and ErrClosed", got.n, got.err)
		}
	case <-time.After(5 * time.Second):
		unblock()
		got := <-done
		t.Fatalf("Replay after Close went ahead (%d, %v): its op waited behind the slow commit instead of being refused", got.n, got.err)
	}
	unblock()
	<-xDone
	errs := <-storeDone
	for i, e := range errs {
		if e != nil {
			t.Fatalf("Store[%d]: %v", i, e)
		}
	}
	got, err := r.store.Stored(v2.GetEnvelope().GetSequence())
	if err != nil {
		t.Fatal(err)
	}
	if got == nil || got.GetEnvelope().GetType() != "v2" {
		t.Fatalf("Store reported version 2 (#%d) stored, but it is not in the outbox (pending for a@n1: %d): a Replay after Close took version 1 above it without waiting", v2.GetEnvelope().GetSequence(), r.store.Pending("a@n1"))
	}
}
