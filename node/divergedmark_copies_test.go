package node_test

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

	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/outbox"
	"github.com/meshnode/meshnode/partition"
	"github.com/meshnode/meshnode/transport"
)

// metaGate stalls every commit of a store at its meta page write (after
// the commit passed faults.CommitError and wrote its data) while armed,
// one commit at a time: each stalled commit is handed to the test as a
// channel to close.
type metaGate struct {
	armed   atomic.Bool
	stalled chan chan struct{}
}

func newMetaGate(t *testing.T, path string) *metaGate {
	g := &metaGate{stalled: make(chan chan struct{}, 64)}
	t.Cleanup(faults.FailWrites(path, errors.New("unused"), func(meta bool) bool {
		if meta && g.armed.Load() {
			rel := make(chan struct{})
			g.stalled <- rel
			<-rel
		}
		return false
	}))
	return g
}

func (g *metaGate) next(t *testing.T, what string) chan struct{} {
	t.Helper()
	rel := g.nextE(t, what)
	if rel == nil {
		t.FailNow()
	}
	return rel
}

// nextE is next for another goroutine than the test's: nil (and the test
// marked failed) when no commit stalled.
func (g *metaGate) nextE(t *testing.T, what string) chan struct{} {
	t.Helper()
	select {
	case rel := <-g.stalled:
		return rel
	case <-time.After(5 * time.Second):
		t.Errorf("no commit stalled: %s", what)
		return nil
	}
}

// releaseAll disarms g and lets every stalled commit go on: deferred by a
// test that arms it, since the node's Close waits for them.
func (g *metaGate) releaseAll() {
	g.armed.Store(false)
	for {
		select {
		case rel := <-g.stalled:
			close(rel)
		default:
			return
		}
	}
}

// gatedSink starts n1 with a sink actor and a metaGate on its outbox at
// path.
func gatedSink(t *testing.T) (n *node.Node, s *sink, path string, g *metaGate) {
	t.Helper()
	dir := t.TempDir()
	path = filepath.Join(dir, "outbox.db")
	g = newMetaGate(t, path)
	n = newNode(t, "n1", dir, func(c *node.Config) {})
	s = new(sink)
	if _, err := n.Spawn("sink", s.handler); err != nil {
		t.Fatal(err)
	}
	return n, s, path, g
}

// barrier waits until the sink's actor has handled everything posted to
// it before: a tell behind it in the same mailbox has run.
func barrier(t *testing.T, n *node.Node, s *sink, tag string) {
	t.Helper()
	if !barrierE(t, n, s, tag) {
		t.FailNow()
	}
}

// barrierE is barrier for another goroutine than the test's.
func barrierE(t *testing.T, n *node.Node, s *sink, tag string) bool {
	t.Helper()
	if err := n.Tell(context.Background(), node.Addr("sink", "n1"), wrapperspb.String(tag)); err != nil {
		t.Errorf("barrier %s: %v", tag, err)
		return false
	}
	if !testutil.Poll(5*time.Second, func() bool { return slices.Contains(s.values(), tag) }) {
		t.Errorf("barrier %s: the tell did not run", tag)
		return false
	}
	return true
}

// A restored sender's emission [b4, x5] reaches a receiver that ran a1..a5
// of the same stream (a4's watermark commit still under way): b4 is new
// contents under the old sequence 4, x5 other contents under the
// watermark's sequence 5. The owner decides b4 a copy (4 <= w 5): its
// DUPLICATE waits for the next commit, which starts (w 5, digest of a5)
// just before the owner marks the stream on x5. That commit succeeds; the
// disk refuses the next one, the mark's, so x5 is answered CAPACITY. b4's
// receipt is made once the stream is marked, when the mark has taken the
// place of the watermark's digest: as a DUPLICATE it would give the
// watermark 5 with no digest, and with x5's CAPACITY beside it nothing in
// the emission would tell the sender that b4 never ran here. It must be
// answered as a message of a marked stream (DIVERGED once the mark is on
// disk), or say a digest other than x5's.
func TestCopyDecidedBeforeAMarkOfDivergenceIsNotAckedAsOne(t *testing.T) {
	n, s, path, g := gatedSink(t)
	var rs receipts
	for i := uint64(1); i <= 3; i++ {
		if c := rs.deliverWait(t, n, stringEnv(t, i, i-1, "a")).GetCode(); c != pb.Receipt_PROCESSED {
			t.Fatalf("a%d: %v", i, c)
		}
	}
	g.armed.Store(true)
	defer g.releaseAll()
	n.DeliverIncoming(peerP, stringEnv(t, 4, 3, "a"), rs.reply("a-4"))
	rel0 := g.next(t, "a4's watermark commit")
	n.DeliverIncoming(peerP, stringEnv(t, 5, 4, "a"), rs.reply("a-5"))
	b4 := stringEnv(t, 4, 0, "b") // the restored sender's first emission: prev 0
	n.DeliverIncoming(peerP, b4, rs.reply("b-4"))
	barrier(t, n, s, "t1") // b4 decided: a copy, waiting for a durable watermark of 4
	close(rel0)
	rel1 := g.next(t, "the commit of watermark 5 (a5's digest), carrying b4's DUPLICATE")
	x5 := stringEnv(t, 5, 4, "x")
	n.DeliverIncoming(peerP, x5, rs.reply("x-5"))
	barrier(t, n, s, "t2") // x5 decided: the stream is marked
	restore, hits := faults.FailCommits(path, errors.New("write outbox.db: no space left on device"))
	defer restore()
	g.armed.Store(false)
	close(rel1)
	testutil.WaitFor(t, 5*time.Second, "b4's and x5's receipts", func() bool {
		rs.mu.Lock()
		defer rs.mu.Unlock()
		return rs.got["b-4"] != nil && rs.got["x-5"] != nil
	})
	rs.mu.Lock()
	rb, rx := rs.got["b-4"], rs.got["x-5"]
	rs.mu.Unlock()
	t.Logf("b4: %v w=%d wd=%d %q; x5: %v w=%d %q; commits refused %d; sink ran %v",
		rb.GetCode(), rb.GetWatermark(), rb.GetWatermarkDigest(), rb.GetMessage(), rx.GetCode(), rx.GetWatermark(), rx.GetMessage(), hits(), s.values())
	if slices.Contains(s.values(), "b") {
		t.Fatalf("b4 ran")
	}
	// What a sender can tell b4 from a copy by: a DIVERGED in its
	// emission, or a watermark digest that is not its own message's at 5.
	revealed := rx.GetCode() == pb.Receipt_DIVERGED ||
		rb.GetCode() != pb.Receipt_DUPLICATE && rb.GetCode() != pb.Receipt_PROCESSED ||
		rb.GetWatermarkDigest() != 0 && rb.GetWatermarkDigest() != pb.StreamDigest(x5)
	if !revealed {
		t.Fatalf("emission [b4, x5] answered [%v (watermark %d, digest %d), %v %q]: b4, which never ran, is acknowledged as a copy (DUPLICATE whose watermark digest gives nothing away) and no DIVERGED in its emission says otherwise",
			rb.GetCode(), rb.GetWatermark(), rb.GetWatermarkDigest(), rx.GetCode(), rx.GetMessage())
	}
}

// toNode is a partition.Deliverer that hands each emission to the
// receiver node n as peer's (DeliverIncoming), in order, and returns its
// receipts; hook, when set, delivers an emission instead.
type toNode struct {
	n     *node.Node
	peer  transport.PeerInfo
	hook  atomic.Pointer[func(envs []*pb.Envelope, deliver func(int)) (after func())] // taken once
	mu    sync.Mutex
	epoch uint64
	top   uint64
	log   []string
}

func (d *toNode) Alive(peer string) bool { return peer == "n1" }

func (d *toNode) Deliver(ctx context.Context, peer string, envs []*pb.Envelope) ([]*pb.Receipt, error) {
	out := make([]*pb.Receipt, len(envs))
	var mu sync.Mutex
	got := 0
	deliver := func(i int) {
		d.n.DeliverIncoming(d.peer, envs[i], func(rc *pb.Receipt) {
			mu.Lock()
			out[i] = rc
			got++
			mu.Unlock()
		})
	}
	d.mu.Lock()
	d.epoch, d.top = envs[0].GetStreamEpoch(), envs[len(envs)-1].GetSequence()
	d.mu.Unlock()
	for _, e := range envs {
		d.log = append(d.log, fmt.Sprintf("%s seq %d prev %d epoch %d", e.GetMsgId(), e.GetSequence(), e.GetPrevSequence(), e.GetStreamEpoch()))
	}
	var after func()
	if h := d.hook.Swap(nil); h != nil {
		after = (*h)(envs, deliver)
	} else {
		for i := range envs {
			deliver(i)
		}
	}
	for {
		mu.Lock()
		done := got == len(envs)
		mu.Unlock()
		if done {
			if after != nil {
				after()
			}
			return out, nil
		}
		select {
		case <-ctx.Done():
			return out, ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

// The same interleaving end to end: the restored sender is a real relay
// over a real outbox whose sequences 4 and 5 went back (it handed out 1..3
// before its backup; the receiver ran 4 and 5 of the lost history). Were
// its emission [b4, x5] answered [DUPLICATE (watermark 5, no digest),
// CAPACITY (mark not durable)], the relay would ack b4, which never ran,
// and x5, told DIVERGED once the disk is back, would run in a new epoch
// without it: b4 lost, neither run, queued nor dead-lettered.
func TestRestoredSendersNewMessageBesideAnUndurableMarkIsNotLost(t *testing.T) {
	n, s, path, g := gatedSink(t)

	scfg := outbox.DefaultConfig(filepath.Join(t.TempDir(), "sender.db"))
	store, err := outbox.Open(scfg)
	if err != nil {
		t.Fatal(err)
	}
	d := &toNode{n: n, peer: transport.PeerInfo{Name: "p", BootID: "b", OutboxID: store.OutboxID()}}
	rcfg := partition.DefaultConfig()
	rcfg.Backoff = partition.BackoffConfig{Base: 5 * time.Millisecond, Cap: 50 * time.Millisecond}
	relay, err := partition.New(rcfg, store, d)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = relay.Close(); _ = store.Close() })
	msg := func(v string) *pb.StoredMessage {
		body, err := anypb.New(wrapperspb.String(v))
		if err != nil {
			t.Fatal(err)
		}
		return &pb.StoredMessage{Envelope: &pb.Envelope{ProtocolVersion: pb.ProtocolVersion, MsgId: v, Sender: "app@p", Recipient: "sink@n1",
			Receipt: pb.Envelope_RECEIPT_PROCESSED, Body: body, CreatedAtUnixMs: 1000}, CreatedElapsedMs: store.ElapsedMs()}
	}
	storeAll := func(vs ...string) {
		var sms []*pb.StoredMessage
		for _, v := range vs {
			sms = append(sms, msg(v))
		}
		for i, err := range relay.Store(context.Background(), sms) {
			if err != nil {
				t.Fatalf("store %s: %v", vs[i], err)
			}
		}
	}
	// The history both sides share: a1..a3, delivered by the relay.
	storeAll("a1", "a2", "a3")
	relay.Start()
	testutil.WaitFor(t, 10*time.Second, "a1..a3 delivered", func() bool { return store.Stats().Depth == 0 })
	if got := s.values(); !slices.Equal(got, []string{"a1", "a2", "a3"}) {
		t.Fatalf("sink ran %v", got)
	}
	d.mu.Lock()
	epoch, s3 := d.epoch, d.top // a3's sequence
	d.mu.Unlock()

	// The lost history: a4 and a5 ran at the receiver (the sender's outbox
	// was then restored from a backup taken after a3). a4's watermark
	// commit is under way (stalled) while a5 runs.
	g.armed.Store(true)
	defer g.releaseAll()
	var rs receipts
	lost := func(seq uint64, v string) *pb.Envelope {
		e := msg(v).GetEnvelope()
		e.Sequence, e.PrevSequence, e.StreamEpoch = s3+seq-3, s3+seq-4, epoch
		return e
	}
	n.DeliverIncoming(d.peer, lost(4, "a4"), rs.reply("a4"))
	rel0 := g.next(t, "a4's watermark commit")
	n.DeliverIncoming(d.peer, lost(5, "a5"), rs.reply("a5"))

	answered := make(chan struct{})
	hook := func(envs []*pb.Envelope, deliver func(int)) func() {
		if len(envs) != 2 || envs[0].GetSequence() != s3+1 || envs[1].GetSequence() != s3+2 {
			t.Errorf("emission %v, want b4 and x5 at 4 and 5", envs)
			for i := range envs {
				deliver(i)
			}
			return func() { close(answered) }
		}
		deliver(0)                    // b4
		ok := barrierE(t, n, s, "t1") // decided: a copy, waiting for a durable watermark of 4
		close(rel0)
		var rel1 chan struct{}
		if ok {
			rel1 = g.nextE(t, "the commit of watermark 5 carrying b4's DUPLICATE")
		}
		deliver(1)                                   // x5
		if rel1 == nil || !barrierE(t, n, s, "t2") { // decided: the stream is marked
			g.armed.Store(false)
			if rel1 != nil {
				close(rel1)
			}
			return func() { close(answered) }
		}
		restore, _ := faults.FailCommits(path, errors.New("write outbox.db: no space left on device"))
		g.armed.Store(false)
		close(rel1)
		// Once both receipts are in: the disk takes commits again.
		return func() { restore(); close(answered) }
	}
	d.hook.Store(&hook)
	storeAll("b4", "x5")
	<-answered
	testutil.WaitFor(t, 10*time.Second, "sender's queue empty", func() bool { return store.Stats().Depth == 0 })
	dl, err := store.DeadLetters(outbox.DLQFilter{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	ran := s.values()
	t.Logf("sink ran %v; relay %+v; dead letters %d; emissions %v", ran, relay.Stats(), len(dl), d.log)
	if !slices.Contains(ran, "b4") && len(dl) == 0 {
		t.Fatalf("b4 is lost: the relay acked it (its emission's receipts: DUPLICATE with watermark 5 and no digest, and CAPACITY for x5 while the disk refused the mark of divergence), yet the receiver never ran it; sink ran %v", ran)
	}
}
