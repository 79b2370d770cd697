package node_test

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/outbox"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// slowWorker is two nodes where n1 sends to worker@n2, whose handler
// waits at a gate: longer than n1 waits for a receipt (300 ms), so a
// message runs after its sender gave up waiting for the verdict.
type slowWorker struct {
	dir     string // n1's data directory is dir/n1
	n1, n2  *node.Node
	to      node.Address
	started chan struct{}
	gate    chan struct{}
	open    sync.Once
	ran     atomic.Int32
}

func newSlowWorker(t *testing.T, n2cfg func(*node.Config)) *slowWorker {
	t.Helper()
	dir := t.TempDir()
	w := &slowWorker{dir: dir, started: make(chan struct{}, 1), gate: make(chan struct{})}
	w.n1 = newNode(t, "n1", filepath.Join(dir, "n1"), func(c *node.Config) {
		fastRetries(c)
		c.Relay.DirectTimeout = 300 * time.Millisecond
		c.Relay.DeliverTimeout = 300 * time.Millisecond
	})
	if n2cfg == nil {
		n2cfg = func(*node.Config) {}
	}
	w.n2 = newNode(t, "n2", filepath.Join(dir, "n2"), n2cfg, w.n1.GossipAddr())
	waitAlive(t, []*node.Node{w.n1, w.n2}, 2)
	t.Cleanup(w.release)
	if _, err := w.n2.Spawn("worker", func(context.Context, *node.Message) (proto.Message, error) {
		select {
		case w.started <- struct{}{}:
		default:
		}
		<-w.gate
		w.ran.Add(1)
		return nil, nil // the message took effect
	}); err != nil {
		t.Fatal(err)
	}
	w.to = node.Addr("worker", "n2")
	return w
}

func (w *slowWorker) release() { w.open.Do(func() { close(w.gate) }) }

func (w *slowWorker) waitStarted(t *testing.T) {
	t.Helper()
	select {
	case <-w.started:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler never started")
	}
}

// releaseAndWaitRun lets the handler finish and waits until it has.
func (w *slowWorker) releaseAndWaitRun(t *testing.T) {
	t.Helper()
	w.release()
	testutil.WaitFor(t, 10*time.Second, "the handler returned", func() bool { return w.ran.Load() == 1 })
}

// A TellReliable whose direct attempt gets no verdict in time (the
// handler is slow) and whose TTL runs out meanwhile cannot be stored: it
// is dead-lettered "outcome unknown", and the caller is told
// ErrOutcomeUnknown, not DeadLettered, which says the message will not
// run. Here it did run.
func TestTellReliableExpiredDuringAnUnansweredAttemptIsOutcomeUnknown(t *testing.T) {
	w := newSlowWorker(t, nil)
	out, err := w.n1.TellReliable(ctxT(t), w.to, wrapperspb.String("pay"), node.WithTTL(100*time.Millisecond))
	if !errors.Is(err, node.ErrOutcomeUnknown) {
		t.Errorf("TellReliable = %v, %v; want ErrOutcomeUnknown (the recipient may have run it)", out, err)
	}
	w.waitStarted(t)
	w.releaseAndWaitRun(t)
	dl, err := w.n1.Outbox().DeadLetters(outbox.DLQFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(dl) != 1 || dl[0].Reason != outbox.ReasonExpiredUnknown {
		t.Fatalf("dead letters %v; want the message, %q", dl, outbox.ReasonExpiredUnknown)
	}
}

// The same when the dead letter cannot be written (a full disk): nothing
// is stored, and the error still says the recipient may have run the
// message. A plain store error reads as "nothing stored, nothing ran", and
// a caller that retries on it runs the message twice.
func TestTellReliableExpiredDuringAnUnansweredAttemptOnAFullDiskIsOutcomeUnknown(t *testing.T) {
	w := newSlowWorker(t, nil)
	restore, hits := faults.FailCommits(filepath.Join(w.dir, "n1", "outbox.db"), errors.New("write outbox.db: no space left on device"))
	_, err := w.n1.TellReliable(ctxT(t), w.to, wrapperspb.String("pay"), node.WithTTL(100*time.Millisecond))
	restore()
	w.waitStarted(t)
	w.releaseAndWaitRun(t)
	if err == nil || hits() == 0 {
		t.Fatalf("TellReliable = %v with %d failed commits; the test wants the dead letter refused by the disk", err, hits())
	}
	if !errors.Is(err, node.ErrOutcomeUnknown) {
		t.Fatalf("TellReliable = %v: want ErrOutcomeUnknown, since the direct attempt got no verdict and the recipient ran it (dead letters: %d)", err, len(deadLetters(t, w.n1)))
	}
}

// A message runs, but its receipt is lost (the handler is slower than its
// sender waits); then its actor is stopped. The next copy finds no actor,
// but the stream's watermark on the receiver's disk says it ran: it is
// answered as a copy (DUPLICATE) and its sender takes it as delivered.
// Answered NO_SUCH_ACTOR, it was counted failed and dead-lettered "max
// attempts: no such actor", a reason that says it never ran, and a
// replay, once the actor was back, ran it twice.
func TestCopyOfAMessageThatRanBeforeItsActorStoppedIsADuplicate(t *testing.T) {
	w := newSlowWorker(t, func(c *node.Config) { c.SpawnGrace = 0 })
	if _, err := w.n1.TellReliable(ctxT(t), w.to, wrapperspb.String("pay")); err != nil {
		t.Fatal(err)
	}
	w.waitStarted(t)
	// Stop waits for the handler; the mailbox closes first, which a local
	// tell finds out.
	stopped := make(chan error, 1)
	go func() { stopped <- w.n2.Stop("worker") }()
	testutil.WaitFor(t, 10*time.Second, "worker's mailbox closed", func() bool {
		return errors.Is(w.n2.Tell(ctxT(t), w.to, wrapperspb.String("probe")), mailbox.ErrClosed)
	})
	w.releaseAndWaitRun(t)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 20*time.Second, "n1's outbox empty", func() bool { return w.n1.Outbox().Stats().Depth == 0 })
	dl, err := w.n1.Outbox().DeadLetters(outbox.DLQFilter{Recipient: w.to.String()})
	if err != nil {
		t.Fatal(err)
	}
	if len(dl) != 0 {
		t.Fatalf("dead-lettered %q although the handler ran it (its watermark is on the receiver's disk); replayed, it would run again", dl[0].Reason)
	}
	if got := w.ran.Load(); got != 1 {
		t.Fatalf("the handler ran %d times, want 1", got)
	}
}

// An operator drops the queue of a recipient whose handler is slow (what
// DropQueue is for) while a message of it is on the wire without a
// receipt; the recipient runs it. Its dead letter says its outcome is
// unknown: "dropped: …" alone read as one that never ran, and a replay
// ran it twice.
func TestDropQueueSaysTheOutcomeIsUnknown(t *testing.T) {
	w := newSlowWorker(t, nil)
	if out, err := w.n1.TellReliable(ctxT(t), w.to, wrapperspb.String("pay")); err != nil || out != node.Queued {
		t.Fatalf("TellReliable = %v, %v; want Queued after the direct attempt timed out", out, err)
	}
	w.waitStarted(t)
	if n, err := w.n1.Outbox().DropQueue(w.to.String(), "operator gave up on a slow worker"); err != nil || n != 1 {
		t.Fatalf("DropQueue = %d, %v; want 1", n, err)
	}
	w.releaseAndWaitRun(t)
	dl, err := w.n1.Outbox().DeadLetters(outbox.DLQFilter{Recipient: w.to.String()})
	if err != nil || len(dl) != 1 {
		t.Fatalf("dead letters %v, %v", dl, err)
	}
	if want := "dropped: operator gave up on a slow worker" + outbox.OutcomeUnknownDropped; dl[0].Reason != want {
		t.Fatalf("dead-lettered %q although a copy was on the wire with no receipt and ran; want %q", dl[0].Reason, want)
	}
}

// A WithApplied handler is ahead of the node's watermark after a crash
// (its own store says 10, outbox.db says 2). After the restart, before the
// application spawned the actor again, a copy of message 1 arrives and is
// answered DUPLICATE from the watermark on disk. The stream it was judged
// by stays cached, and the actor, once back, must still be asked what it
// applied (WithApplied) at its first message: otherwise the receipts
// report the watermark (3) instead of what the handler applied (10), a
// sender whose sequences went back never learns it, and its new message
// under a sequence the handler skips as applied is acked without taking
// effect.
func TestActorBackAfterACopyToItWasAnsweredIsAskedWhatItApplied(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "n1")
	n := startNode(t, "n1", dir)
	if _, err := n.Spawn("a", func(context.Context, *node.Message) (proto.Message, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	var rs receipts
	for seq := uint64(1); seq <= 2; seq++ {
		if rc := rs.deliverWait(t, n, streamEnv("a", "n1", seq, seq-1)); rc.GetCode() != pb.Receipt_PROCESSED {
			t.Fatalf("message %d: %v", seq, rc.GetCode())
		}
	}
	_ = n.Close()

	n = startNode(t, "n1", dir)
	var rs2 receipts
	cp := streamEnv("a", "n1", 1, 0)
	cp.MsgId += "-copy"
	if rc := rs2.deliverWait(t, n, cp); rc.GetCode() != pb.Receipt_DUPLICATE {
		t.Fatalf("a copy of message 1 before the actor is back: %v, want DUPLICATE", rc.GetCode())
	}
	var asked atomic.Int32
	if _, err := n.Spawn("a", func(context.Context, *node.Message) (proto.Message, error) { return nil, nil },
		node.WithApplied(func(node.StreamID) uint64 { asked.Add(1); return 10 })); err != nil {
		t.Fatal(err)
	}
	rc := rs2.deliverWait(t, n, streamEnv("a", "n1", 3, 2))
	if rc.GetCode() != pb.Receipt_PROCESSED || rc.GetWatermark() != 10 || asked.Load() != 1 {
		t.Fatalf("message 3 after the actor came back WithApplied(10): %v watermark %d, applied asked %d time(s); want PROCESSED reporting 10, applied asked once",
			rc.GetCode(), rc.GetWatermark(), asked.Load())
	}
}

// A direct attempt gets no verdict in time (the handler is slow, and it
// runs), and meanwhile the outbox stops (a failed fdatasync), so the
// message cannot be stored after it. TellReliable's error says both: the
// outbox failed (restart the node) and the recipient may have run the
// message (ErrOutcomeUnknown), so that nobody sends it again without an
// idempotency key.
func TestTellReliableNotStoredAfterAnUnansweredAttemptIsOutcomeUnknown(t *testing.T) {
	dir := t.TempDir()
	var failing atomic.Bool
	syncErr := errors.New("fdatasync outbox.db: input/output error")
	defer faults.FailWrites(filepath.Join(dir, "n1", "outbox.db"), syncErr, func(meta bool) bool { return meta && failing.Load() })()
	n1 := newNode(t, "n1", filepath.Join(dir, "n1"), func(c *node.Config) {
		fastRetries(c)
		c.Relay.DirectTimeout = 300 * time.Millisecond
		c.Relay.DeliverTimeout = 300 * time.Millisecond
	})
	n2 := newNode(t, "n2", filepath.Join(dir, "n2"), func(*node.Config) {}, n1.GossipAddr())
	waitAlive(t, []*node.Node{n1, n2}, 2)
	gate := make(chan struct{})
	var ran atomic.Int32
	t.Cleanup(func() {
		select {
		case <-gate:
		default:
			close(gate)
		}
	})
	if _, err := n2.Spawn("worker", func(context.Context, *node.Message) (proto.Message, error) {
		failing.Store(true) // the outbox stops while the attempt waits
		<-gate
		ran.Add(1)
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	_, err := n1.TellReliable(ctxT(t), node.Addr("worker", "n2"), wrapperspb.String("pay"))
	close(gate)
	testutil.WaitFor(t, 10*time.Second, "the handler ran", func() bool { return ran.Load() == 1 })
	if !errors.Is(err, node.ErrOutcomeUnknown) || !errors.Is(err, node.ErrStoreFailed) {
		t.Fatalf("TellReliable = %v: want both ErrOutcomeUnknown and ErrStoreFailed", err)
	}
}
