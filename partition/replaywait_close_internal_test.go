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

// As TestReplayWaitsForANewerVersionAFanOutIsStoring, but the relay is
// closed while the Replay waits for version 2's commit: Reserve refuses
// the sequence (ErrClosed) rather than hand it out without the wait, so
// the fan-out, already past its own check for a closed relay, stores
// version 2 and nothing older is queued above it. When Reserve handed the
// sequence out anyway, the replay committed version 1 above version 2,
// which was then dropped as superseded while Store reported it stored.
func TestCloseDuringAReplaysWaitRefusesItsSequence(t *testing.T) {
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
	defer unblock() // never leave the committer stuck on the slow write
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
	<-entered // Send(x) holds x's stream lock while its note commits slowly
	v2 := v("a@n1", "v2")
	storeDone := make(chan []error, 1)
	go func() { storeDone <- r.Store(ctx, []*pb.StoredMessage{v2, message("x@n1", "m", 0)}) }()
	waitBlocked(t, "(*Relay).Store", nil)
	replayed := make(chan int, 1)
	go func() { n, _ := r.store.Replay(outbox.DLQFilter{Recipient: "a@n1"}); replayed <- n }()
	testutil.WaitFor(t, 5*time.Second, "Replay waiting in Reserve", func() bool {
		return r.reserveWaiting.Load() > 0
	})
	closed := make(chan struct{})
	go func() { _ = r.Close(); close(closed) }()
	testutil.WaitFor(t, 10*time.Second, "Reserve released from waitStored by Close", func() bool {
		return r.reserveWaiting.Load() == 0
	})
	unblock() // the slow note commits; the Replay's op is queued before the fan-out's
	var n int
	select {
	case n = <-replayed:
	case <-time.After(10 * time.Second):
		t.Fatal("Replay did not return after Close")
	}
	<-xDone
	<-closed
	errs := <-storeDone
	for i, e := range errs {
		if e != nil {
			t.Fatalf("Store[%d]: %v", i, e)
		}
	}
	v2seq := v2.GetEnvelope().GetSequence()
	got, err := r.store.Stored(v2seq)
	if err != nil {
		t.Fatal(err)
	}
	if got == nil || got.GetEnvelope().GetType() != "v2" {
		t.Fatalf("Store reported version 2 (#%d) stored, but it is not in the outbox (replayed %d, pending for a@n1: %d): the Replay, released from waitStored by Close, requeued the older version 1 above it and version 2 was dropped as superseded", v2seq, n, r.store.Pending("a@n1"))
	}
}
