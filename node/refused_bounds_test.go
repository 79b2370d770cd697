package node_test

import (
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/outbox"
)

// blockingReply is a receipt callback that records its receipt, signals
// called and then waits for release: the goroutine that answers it (for a
// message evicted from a DropOldest mailbox, the one that posted the newer
// message) is held between the eviction and the end of its drop, as a
// preempted goroutine would be.
type blockingReply struct {
	called, release chan struct{}
	once, freed     sync.Once
	mu              sync.Mutex
	got             *pb.Receipt
}

func newBlockingReply() *blockingReply {
	return &blockingReply{called: make(chan struct{}), release: make(chan struct{})}
}

// free lets the held callback (and any later one) return; once is enough.
func (b *blockingReply) free() { b.freed.Do(func() { close(b.release) }) }

func (b *blockingReply) reply(rc *pb.Receipt) {
	b.mu.Lock()
	b.got = rc
	b.mu.Unlock()
	b.once.Do(func() { close(b.called) })
	<-b.release
}

// The old sender's c (3) runs slowly, so the old sender sends a copy c'
// (3), which waits in a three-place DropOldest mailbox; the sender is then
// restored from a backup and its emission [x y] (x under 3 with other
// contents, y 4 chained to x) arrives, with another stream's o between
// them: y's post evicts c'. While that drop is being answered (its stream
// has an eviction pending) c ends, the watermark moves to 3, and the actor
// takes x, which it refuses for room until the drop is answered. What
// must hold: that refusal compares x with the watermark's message (c's)
// as any refusal for room does, so y, chained to 3, does not run after c
// in the old history, and x sent again is not answered as a copy.
func TestRestoredMessageTakenWhileAnEarlierDropIsAnsweredIsNotLost(t *testing.T) {
	n := newNode(t, "n1", t.TempDir(), func(c *node.Config) {})
	h := newHoldSink("c", "o")
	defer h.freeAll()
	var rs receipts
	spawnHoldSinkRunAB(t, n, h, &rs, node.WithMailbox(3, mailbox.DropOldest))
	n.DeliverIncoming(peerP, stringEnv(t, 3, 2, "c"), rs.reply("c"))
	waitStarted(t, h, "c")
	// The old sender's copy of c (its emission timed out while c ran).
	cc := stringEnv(t, 3, 2, "c")
	cc.MsgId = "c-copy"
	br := newBlockingReply()
	defer br.free()
	n.DeliverIncoming(peerP, cc, br.reply)
	// The restored sender's x under 3, another stream's o, then y, whose
	// post evicts c' (the oldest); y's poster answers the drop.
	n.DeliverIncoming(peerP, stringEnv(t, 3, 2, "x"), rs.reply("x"))
	o := stringEnv(t, 1, 0, "o")
	o.StreamEpoch = 7
	n.DeliverIncoming(peerP, o, rs.reply("o"))
	posted := make(chan struct{})
	go func() {
		defer close(posted)
		n.DeliverIncoming(peerP, stringEnv(t, 4, 3, "y"), rs.reply("y"))
	}()
	waitClosed(t, br.called, "the drop of c'")
	h.free("c")
	testutil.WaitFor(t, 10*time.Second, "c and x answered", func() bool { return rs.code("c") != 0 && rs.code("x") != 0 })
	waitStarted(t, h, "o") // the actor took x, and holds o
	rs.mu.Lock()
	t.Logf("c: %v; x: %v", rs.got["c"], rs.got["x"])
	rs.mu.Unlock()
	br.free()
	<-posted
	h.free("o")
	testutil.WaitFor(t, 10*time.Second, "y answered", func() bool { return rs.code("y") != 0 })
	t.Logf("y: %v", rs.code("y"))
	checkRefusedNotLost(t, n, h, &rs, stringEnv(t, 3, 2, "x"), "x", "y")
}

// The restored sender's x (3) is refused for room (its sender's share is
// full: a slow message of another stream holds it), while the old
// sender's c (3) and the restored sender's y (4, chained to x) wait in the
// mailbox behind the slow message for more than an hour, x's sender
// away meanwhile, and the node prunes as it does every few seconds. What
// must hold: the refusal is still kept when c runs (a day after the
// stream's last refusal), so y does not run after c in the old history,
// and x sent again is not answered as a copy.
func TestRefusalOutlivesAnHourLongWaitOfTheOldMessage(t *testing.T) {
	clk := outbox.NewManualClock(time.Now())
	big := strings.Repeat("x", 2000)
	x := stringEnv(t, 3, 2, big)
	budget := int64(proto.Size(x)) + 10
	n := newNode(t, "n1", t.TempDir(), func(c *node.Config) {
		c.PeerQueuedBytes = budget
		c.Outbox.Clock = clk
	})
	h := newHoldSink("hold")
	defer h.freeAll()
	var rs receipts
	queueCBehindAHoldRefuseX(t, n, h, &rs, x, big)
	// c and y still wait, an hour and a minute later; the node prunes as
	// its pruneLoop does.
	clk.Advance(time.Hour + time.Minute)
	n.EvictIdleStreams(10 * time.Minute)
	h.free("hold")
	testutil.WaitFor(t, 10*time.Second, "c and y answered", func() bool {
		return rs.code("c") != 0 && rs.code("y") != 0
	})
	checkRefusedNotLost(t, n, h, &rs, stringEnv(t, 3, 2, big), big, "y")
}

// A member chooses the epochs of its streams and their sequences: once
// its share of the node is full (one slow message of its own holds it),
// every further message is refused for room, and each refusal above its
// stream's watermark is kept, apart from the stream cache. What must
// hold: what one member makes the node keep so is bounded (the refusals
// of all its streams together, each stream's keeping counted), so the
// second half of the refusals, on as many new epochs, keeps nothing more
// once the first reached the bound, and the first did not keep all of
// its own, one to a stream (the dearest spread: the bytes this keeps at
// its bound are TestRefusalsOfOneSenderStayNearAMiB's).
func TestRefusedMessagesKeptForOneSenderAreBounded(t *testing.T) {
	const epochs = 8000
	big := stringEnv(t, 1, 0, strings.Repeat("h", 2000))
	big.StreamEpoch = 1 << 40
	n := newNode(t, "n1", t.TempDir(), func(c *node.Config) { c.PeerQueuedBytes = int64(proto.Size(big)) + 10 })
	h := newHoldSink(strings.Repeat("h", 2000))
	defer h.freeAll()
	if _, err := n.Spawn("sink", h.handler); err != nil {
		t.Fatal(err)
	}
	var rs receipts
	n.DeliverIncoming(peerP, big, rs.reply("hold"))
	waitStarted(t, h, strings.Repeat("h", 2000))
	var refused, other atomic.Int64
	reply := func(rc *pb.Receipt) {
		if rc.GetCode() == pb.Receipt_CAPACITY {
			refused.Add(1)
		} else {
			other.Add(1)
		}
	}
	env := stringEnv(t, 1, 0, "")
	send := func(firstEpoch uint64) (kept, streams int) {
		for e := firstEpoch; e < firstEpoch+epochs; e++ {
			m := proto.Clone(env).(*pb.Envelope)
			m.StreamEpoch, m.MsgId = e, "m"
			n.DeliverIncoming(peerP, m, reply)
		}
		n.EvictIdleStreams(0) // the node's own pruning, at once
		return n.RefusedKept(), n.RefusedStreams()
	}
	k1, s1 := send(100)
	k2, s2 := send(100 + epochs)
	testutil.WaitFor(t, 10*time.Second, "every message answered", func() bool { return refused.Load()+other.Load() >= 2*epochs })
	if other.Load() != 0 {
		t.Fatalf("%d messages answered other than CAPACITY", other.Load())
	}
	t.Logf("%d refusals on as many epochs: %d kept on %d streams; %d more: %d kept on %d streams", epochs, k1, s1, epochs, k2, s2)
	if s1 == 0 || s1 >= epochs || k2 != k1 || s2 != s1 {
		t.Errorf("what one member's refused messages make the node keep is not bounded: %d refusals kept %d on %d streams, %d more kept %d on %d", epochs, k1, s1, epochs, k2, s2)
	}
}
