package node_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/node"
)

// holds holds a handler's run of each value in vals: it signals
// started[v] and waits for free(v); a later copy of v is not held. A test
// defers freeAll, so that its nodes, closed after it, find no handler held.
type holds struct {
	started, release map[string]chan struct{}
	freed            map[string]bool // used by the test's goroutine only
}

func newHolds(vals ...string) holds {
	h := holds{started: map[string]chan struct{}{}, release: map[string]chan struct{}{}, freed: map[string]bool{}}
	for _, v := range vals {
		h.started[v], h.release[v] = make(chan struct{}), make(chan struct{})
	}
	return h
}

// hold holds the run of v if v is held and this is its first run.
func (h *holds) hold(v string) {
	if ch, ok := h.started[v]; ok {
		select {
		case <-ch: // a later copy: the first ran
		default:
			close(ch)
			<-h.release[v]
		}
	}
}

// free lets the held run of v return; once is enough.
func (h *holds) free(v string) {
	if !h.freed[v] {
		h.freed[v] = true
		close(h.release[v])
	}
}

// freeAll frees every held value.
func (h *holds) freeAll() {
	for v := range h.release {
		h.free(v)
	}
}

// holdSink runs every value at once except those in vals (holds).
type holdSink struct {
	sink
	holds
}

func newHoldSink(vals ...string) *holdSink { return &holdSink{holds: newHolds(vals...)} }

func (h *holdSink) handler(ctx context.Context, m *node.Message) (proto.Message, error) {
	var v wrapperspb.StringValue
	if err := m.Decode(&v); err != nil {
		return nil, err
	}
	h.hold(v.GetValue())
	return h.sink.handler(ctx, m)
}

// m1 ran and its watermark is durable; m2 ran after it and the receiver's
// disk refuses m2's watermark commit (full). m1's receipt was lost (the
// sender's emission timed out while m1's handler was slow), so the sender
// sends m1 again. The receiver knows m1 ran durably and answers the copy
// DUPLICATE at once: were it to wait for the newest watermark to be
// durable, the disk would keep it from the sender until m1's TTL ran out,
// and m1 would be dead-lettered "outcome unknown", though it ran and the
// receiver has it on disk.
func TestCopyOfADurableMessageIsAckedWhileANewerWatermarkIsRefused(t *testing.T) {
	dir := t.TempDir()
	d1, d2 := filepath.Join(dir, "n1"), filepath.Join(dir, "n2")
	h := newHoldSink("m1", "m2")
	defer h.freeAll()
	n1 := newNode(t, "n1", d1, func(c *node.Config) {
		fastRetries(c)
		c.Relay.DeliverTimeout = 300 * time.Millisecond
		c.Outbox.MaxClockSkew = 100 * time.Millisecond
	})
	to := node.Addr("sink", "n2")
	// Both queued while n2 is not there: the first emission is [m1 m2].
	for _, v := range []string{"m1", "m2"} {
		if out, err := n1.TellReliable(ctxT(t), to, wrapperspb.String(v), node.WithTTL(4*time.Second)); err != nil || out != node.Queued {
			t.Fatalf("%s: %v, %v; want Queued", v, out, err)
		}
	}
	n2 := newNode(t, "n2", d2, func(*node.Config) {}, n1.GossipAddr())
	if _, err := n2.Spawn("sink", h.handler, node.WithMailbox(2, mailbox.Reject)); err != nil {
		t.Fatal(err)
	}
	<-h.started["m1"] // m1 in its handler, m2 in the mailbox behind it
	// The emission [m1 m2] times out (m1's receipt is lost); the next one
	// puts a copy of m1 in the mailbox, behind m2, and finds it full for
	// m2: the first emission was judged.
	testutil.WaitFor(t, 10*time.Second, "the emission of m1 judged without its receipt", func() bool { return n2.Stats().RefusedFull > 0 })
	h.free("m1") // m1 runs; its watermark (1) becomes durable
	<-h.started["m2"]
	testutil.WaitFor(t, 10*time.Second, "m1's watermark durable", func() bool { return n2.DurableWatermark() >= 1 })
	restore, hits := faults.FailCommits(filepath.Join(d2, "outbox.db"), errors.New("write outbox.db: no space left on device"))
	defer restore()
	h.free("m2") // m2 runs; its watermark (2) is refused by the disk
	testutil.WaitFor(t, 20*time.Second, "m1 acked or dead-lettered", func() bool {
		return n1.Outbox().Stats().Depth < 2 || n1.Outbox().Stats().DLQDepth > 0
	})
	for _, dl := range deadLetters(t, n1) {
		var v wrapperspb.StringValue
		if err := dl.Message.GetEnvelope().GetBody().UnmarshalTo(&v); err == nil && v.GetValue() == "m1" {
			t.Fatalf("m1, which ran and whose watermark (1) is durable at the receiver, was dead-lettered (%q) because a newer watermark's commit was refused (%d refused commits); the sink ran %v",
				dl.Reason, hits(), h.values())
		}
	}
}

// m1 ran and its watermark (1) is durable at the receiver; its receipt was
// lost (the sender's attempt timed out while m1's handler was slow). Then
// the receiver's store stops (another stream's commit failed a sync), and
// the sender sends m1 again: a copy at the durable watermark. The actor
// refuses everything while the store is stopped, so the copy is answered
// DUPLICATE by the goroutine that received it (its digest is that of the
// message that ran there), as a copy below the watermark is: otherwise the
// receiver would never say it ran, and the sender would dead-letter m1 at
// its TTL as "outcome unknown".
func TestCopyAtTheDurableWatermarkIsAnsweredWhileTheStoreIsStopped(t *testing.T) {
	dir := t.TempDir()
	d1, d2 := filepath.Join(dir, "n1"), filepath.Join(dir, "n2")
	syncErr := errors.New("fdatasync outbox.db: input/output error")
	var failing atomic.Bool
	defer faults.FailWrites(filepath.Join(d2, "outbox.db"), syncErr, func(meta bool) bool { return meta && failing.Load() })()

	h := newHoldSink("m1", "hold2")
	defer h.freeAll()
	n1 := newNode(t, "n1", d1, func(c *node.Config) {
		fastRetries(c)
		c.Relay.DeliverTimeout = 300 * time.Millisecond
		c.Relay.DirectTimeout = 100 * time.Millisecond
		c.Outbox.MaxClockSkew = 100 * time.Millisecond
	})
	n2 := newNode(t, "n2", d2, func(*node.Config) {}, n1.GossipAddr())
	waitAlive(t, []*node.Node{n1, n2}, 2)
	if _, err := n2.Spawn("sink", h.handler, node.WithMailbox(2, mailbox.Reject)); err != nil {
		t.Fatal(err)
	}
	var other sink
	if _, err := n2.Spawn("other", other.handler); err != nil {
		t.Fatal(err)
	}

	to := node.Addr("sink", "n2")
	if _, err := n1.TellReliable(ctxT(t), to, wrapperspb.String("m1"), node.WithTTL(4*time.Second)); err != nil {
		t.Fatal(err)
	}
	<-h.started["m1"] // m1 in its handler: its receipt will come after the sender gave up waiting
	// hold2 will keep the actor busy after m1, so that the copies of m1 the
	// sender sends meanwhile wait in the mailbox (or are refused for room).
	if err := n2.Tell(ctxT(t), to, wrapperspb.String("hold2")); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "a copy of m1 refused for room", func() bool { return n2.Stats().RefusedFull > 0 })
	h.free("m1")
	<-h.started["hold2"]
	testutil.WaitFor(t, 10*time.Second, "m1's watermark durable", func() bool { return n2.DurableWatermark() >= 1 })

	// Another stream's commit fails its sync: n2's store stops.
	failing.Store(true)
	if _, err := n1.TellReliable(ctxT(t), node.Addr("other", "n2"), wrapperspb.String("o1")); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 20*time.Second, "n2's store to fail", func() bool { return n2.Outbox().Err() != nil })
	failing.Store(false)
	h.free("hold2")

	// o1 stays queued (n2 refuses it while its store is failed): m1 is
	// settled, acked or dead-lettered, once one message is left.
	testutil.WaitFor(t, 20*time.Second, "m1 acked or dead-lettered", func() bool { return n1.Outbox().Stats().Depth < 2 })
	for _, dl := range deadLetters(t, n1) {
		var v wrapperspb.StringValue
		if err := dl.Message.GetEnvelope().GetBody().UnmarshalTo(&v); err == nil && v.GetValue() == "m1" {
			t.Fatalf("m1 ran (the sink ran %v) and its watermark (1) is durable at n2 (durable %d), yet it was dead-lettered %q: n2 did not answer its copy at the durable watermark DUPLICATE while its store was stopped",
				h.values(), n2.DurableWatermark(), dl.Reason)
		}
	}
	if !strings.Contains(strings.Join(h.values(), ","), "m1") {
		t.Fatalf("m1 did not run: %v", h.values())
	}
}
