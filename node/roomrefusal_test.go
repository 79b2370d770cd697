package node_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// A stream message refused for room did not run, and its CAPACITY receipt
// says the stream's durable watermark (a DUPLICATE's does too): a sender
// restored from a backup learns from it that its sequences went back.
func TestRoomRefusalSaysTheStreamsWatermark(t *testing.T) {
	n := startNode(t, "n1", t.TempDir())
	started, release := make(chan struct{}), make(chan struct{})
	if _, err := n.Spawn("a", func(_ context.Context, m *node.Message) (proto.Message, error) {
		if m.Sequence() == 2 {
			close(started)
			<-release
		}
		return nil, nil
	}, node.WithMailbox(1, mailbox.Reject)); err != nil {
		t.Fatal(err)
	}
	defer close(release)
	var rs receipts
	if c := rs.deliverWait(t, n, streamEnv("a", "n1", 1, 0)).GetCode(); c != pb.Receipt_PROCESSED {
		t.Fatalf("m1: %v, want PROCESSED", c)
	}
	n.DeliverIncoming(peerP, streamEnv("a", "n1", 2, 1), rs.reply("m2"))
	<-started                                                            // m2 in the handler
	n.DeliverIncoming(peerP, streamEnv("a", "n1", 3, 2), rs.reply("m3")) // in the mailbox: full
	rc := rs.deliverWait(t, n, streamEnv("a", "n1", 4, 3))
	if rc.GetCode() != pb.Receipt_CAPACITY || rc.GetWatermark() != 1 {
		t.Fatalf("m4 refused for room: %v, watermark %d; want CAPACITY with the watermark 1", rc.GetCode(), rc.GetWatermark())
	}
}

// The receiver answers messages below its durable watermark as copies
// without looking at them and checks only the one at the watermark against
// what ran there. A sender restored from a backup sends new messages under
// those sequences; were the one at the watermark refused for room, it
// would take the others for copies and never send them again. So a
// message at the watermark's sequence with other contents is answered
// DIVERGED even while the mailbox is full, the stream is marked, and
// nothing more of it runs, then or after a restart. A copy of the message
// that ran there is answered DUPLICATE without a mailbox slot.
func TestMessageAtTheWatermarkRefusedForRoomStillShowsADivergedSender(t *testing.T) {
	dir := t.TempDir()
	var mu sync.Mutex
	var ran []string
	started, release := make(chan struct{}), make(chan struct{})
	handler := func(_ context.Context, m *node.Message) (proto.Message, error) {
		var v wrapperspb.StringValue
		if err := m.Decode(&v); err != nil {
			return nil, err
		}
		if v.GetValue() == "hold" {
			close(started)
			<-release
			return nil, nil
		}
		mu.Lock()
		ran = append(ran, v.GetValue())
		mu.Unlock()
		return nil, nil
	}
	n := startNode(t, "n1", dir)
	if _, err := n.Spawn("sink", handler, node.WithMailbox(1, mailbox.Reject)); err != nil {
		t.Fatal(err)
	}
	var rs receipts
	if c := rs.deliverWait(t, n, stringEnv(t, 1, 0, "a")).GetCode(); c != pb.Receipt_PROCESSED {
		t.Fatalf("a: %v, want PROCESSED", c)
	}
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	sink := node.Addr("sink", "n1")
	if err := n.Tell(ctxT(t), sink, wrapperspb.String("hold")); err != nil {
		t.Fatal(err)
	}
	<-started
	if err := n.Tell(ctxT(t), sink, wrapperspb.String("fill")); err != nil { // the mailbox is full
		t.Fatal(err)
	}

	cp := stringEnv(t, 1, 0, "a")
	cp.MsgId += "-copy"
	if rc := rs.deliverWait(t, n, cp); rc.GetCode() != pb.Receipt_DUPLICATE || rc.GetWatermark() != 1 {
		t.Fatalf("a copy of a, the message at the watermark, while the mailbox is full: %v, watermark %d; want DUPLICATE with the watermark 1 (it ran; no mailbox slot needed)", rc.GetCode(), rc.GetWatermark())
	}
	if c := rs.deliverWait(t, n, stringEnv(t, 1, 0, "b")).GetCode(); c != pb.Receipt_DIVERGED {
		t.Fatalf("b, another message under a's sequence, while the mailbox is full: %v, want DIVERGED", c)
	}
	if c := rs.deliverWait(t, n, stringEnv(t, 2, 1, "c")).GetCode(); c != pb.Receipt_DIVERGED {
		t.Fatalf("c, after b in its emission, while the mailbox is full: %v, want DIVERGED", c)
	}
	close(release)
	released = true
	// The tell that filled the mailbox runs once the handler is free; Close
	// does not wait for what is queued.
	testutil.WaitFor(t, 10*time.Second, "fill ran", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.Contains(ran, "fill")
	})
	later := stringEnv(t, 2, 1, "c")
	later.MsgId += "-again"
	if c := rs.deliverWait(t, n, later).GetCode(); c != pb.Receipt_DIVERGED {
		t.Fatalf("c with room: %v, want DIVERGED", c)
	}
	if got := n.Stats().Diverged; got != 3 {
		t.Fatalf("Stats.Diverged = %d, want 3", got)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}

	n = startNode(t, "n1", dir)
	if _, err := n.Spawn("sink", handler); err != nil {
		t.Fatal(err)
	}
	later.MsgId += "-restarted"
	if c := rs.deliverWait(t, n, later).GetCode(); c != pb.Receipt_DIVERGED {
		t.Fatalf("c after a restart: %v, want DIVERGED (the mark is on disk)", c)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"a", "fill"}; !slices.Equal(ran, want) {
		t.Fatalf("sink ran %v, want %v", ran, want)
	}
}

// A receipt that answers a stream message without running it (a copy, out
// of order, refused for room) says the digest of the message that ran at
// the watermark it gives: a sender restored from a backup that holds
// another message under that sequence learns from it that its sequences
// went back, even when it sent nothing at or above the watermark.
func TestReceiptsSayTheDigestAtTheirWatermark(t *testing.T) {
	n := startNode(t, "n1", t.TempDir())
	started, release := make(chan struct{}), make(chan struct{})
	if _, err := n.Spawn("sink", func(_ context.Context, m *node.Message) (proto.Message, error) {
		var v wrapperspb.StringValue
		if err := m.Decode(&v); err == nil && v.GetValue() == "hold" {
			close(started)
			<-release
		}
		return nil, nil
	}, node.WithMailbox(1, mailbox.Reject)); err != nil {
		t.Fatal(err)
	}
	var rs receipts
	a, b := stringEnv(t, 1, 0, "a"), stringEnv(t, 2, 1, "b")
	for _, env := range []*pb.Envelope{a, b} {
		if c := rs.deliverWait(t, n, env).GetCode(); c != pb.Receipt_PROCESSED {
			t.Fatalf("%s: %v, want PROCESSED", env.GetMsgId(), c)
		}
	}
	want := pb.StreamDigest(b)
	check := func(env *pb.Envelope, code pb.Receipt_Code, digest uint64) {
		t.Helper()
		rc := rs.deliverWait(t, n, env)
		if rc.GetCode() != code || rc.GetWatermark() != 2 || rc.GetWatermarkDigest() != digest {
			t.Fatalf("%s: %v, watermark %d, digest %#x; want %v, 2, %#x", env.GetMsgId(), rc.GetCode(), rc.GetWatermark(), rc.GetWatermarkDigest(), code, digest)
		}
	}
	cp := stringEnv(t, 1, 0, "a")
	cp.MsgId += "-copy"
	check(cp, pb.Receipt_DUPLICATE, want)
	check(stringEnv(t, 4, 3, "d"), pb.Receipt_OUT_OF_ORDER, want) // decided by the actor
	atW := stringEnv(t, 2, 1, "b")
	atW.MsgId += "-copy"
	check(atW, pb.Receipt_DUPLICATE, want)

	if err := n.Tell(ctxT(t), node.Addr("sink", "n1"), wrapperspb.String("hold")); err != nil {
		t.Fatal(err)
	}
	<-started
	defer close(release)
	if err := n.Tell(ctxT(t), node.Addr("sink", "n1"), wrapperspb.String("fill")); err != nil {
		t.Fatal(err)
	}
	check(stringEnv(t, 3, 2, "c"), pb.Receipt_CAPACITY, want)
}
