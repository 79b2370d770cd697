package node_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
)

// A sender restored from a backup sends x under the sequence (3) of c,
// which its old self sent just before it was lost and which the actor is
// running. x is dropped from a full two-place DropOldest mailbox while c
// runs, when the watermark (2) says nothing about x. What must hold: y,
// chained to x, does not run after c in the old history, and x is never
// answered as a copy without having run. (c ends: the watermark is 3,
// another message than x's; y and z are answered DIVERGED, and the sender
// sends x, y and z again in a new epoch.)
func TestRestoredMessageDroppedWhileTheOneAtItsSequenceRunsIsNotLost(t *testing.T) {
	n := newNode(t, "n1", t.TempDir(), func(c *node.Config) {})
	h := newHoldSink("c")
	defer h.freeAll()
	var rs receipts
	spawnHoldSinkRunAB(t, n, h, &rs, node.WithMailbox(2, mailbox.DropOldest))
	n.DeliverIncoming(peerP, stringEnv(t, 3, 2, "c"), rs.reply("c"))
	waitStarted(t, h, "c")
	// The restored sender's emission [x y z] under 3, 4, 5; z evicts x.
	n.DeliverIncoming(peerP, stringEnv(t, 3, 2, "x"), rs.reply("x"))
	n.DeliverIncoming(peerP, stringEnv(t, 4, 3, "y"), rs.reply("y"))
	n.DeliverIncoming(peerP, stringEnv(t, 5, 4, "z"), rs.reply("z"))
	testutil.WaitFor(t, 5*time.Second, "x answered", func() bool { return rs.code("x") != 0 })
	h.free("c")
	testutil.WaitFor(t, 10*time.Second, "c, y, z answered", func() bool {
		return rs.code("c") != 0 && rs.code("y") != 0 && rs.code("z") != 0
	})
	checkRefusedNotLost(t, n, h, &rs, stringEnv(t, 3, 2, "x"), "x", "y", "z")
}

// The same with x refused at arrival because its sender's share of the
// node is full (c holds part of it while it runs), and y, small, taken
// into the mailbox behind c; and with x refused before the old c even
// arrived (a message of another stream holds the share), then c and y
// taken. Either way y must not run after c, and x must not be answered
// as a copy without having run.
func TestRestoredMessageRefusedForRoomBesideTheOneAtItsSequenceIsNotLost(t *testing.T) {
	big := strings.Repeat("x", 2000)
	for _, tc := range []struct {
		name     string
		oldFirst bool // c arrives (and runs) before x is refused
	}{{"old one running", true}, {"old one arriving after", false}} {
		t.Run(tc.name, func(t *testing.T) {
			x := stringEnv(t, 3, 2, big)
			budget := int64(proto.Size(x)) + 10 // x alone fits; beside anything else, not
			n := newNode(t, "n1", t.TempDir(), func(c *node.Config) { c.PeerQueuedBytes = budget })
			h := newHoldSink("c", "hold")
			defer h.freeAll()
			var rs receipts
			spawnHoldSinkRunAB(t, n, h, &rs)
			if tc.oldFirst {
				n.DeliverIncoming(peerP, stringEnv(t, 3, 2, "c"), rs.reply("c"))
				waitStarted(t, h, "c")
			} else {
				// Another stream of the same sender holds part of its share.
				other := stringEnv(t, 1, 0, "hold")
				other.StreamEpoch = 7
				n.DeliverIncoming(peerP, other, rs.reply("hold"))
				waitStarted(t, h, "hold")
			}
			n.DeliverIncoming(peerP, x, rs.reply(big))
			testutil.WaitFor(t, 5*time.Second, "x answered", func() bool { return rs.code(big) != 0 })
			if got := rs.code(big); got != pb.Receipt_CAPACITY {
				t.Fatalf("x answered %v, want CAPACITY (refused for room)", got)
			}
			if !tc.oldFirst {
				n.DeliverIncoming(peerP, stringEnv(t, 3, 2, "c"), rs.reply("c"))
			}
			n.DeliverIncoming(peerP, stringEnv(t, 4, 3, "y"), rs.reply("y"))
			h.free("hold")
			h.free("c")
			testutil.WaitFor(t, 10*time.Second, "c and y answered", func() bool {
				return rs.code("c") != 0 && rs.code("y") != 0
			})
			checkRefusedNotLost(t, n, h, &rs, stringEnv(t, 3, 2, big), big, "y")
		})
	}
}

// runAB runs a (1) and b (2) of peer p's stream to sink@n1.
func runAB(t *testing.T, n *node.Node, rs *receipts) {
	t.Helper()
	for _, m := range []struct {
		v         string
		seq, prev uint64
	}{{"a", 1, 0}, {"b", 2, 1}} {
		if rc := rs.deliverWait(t, n, stringEnv(t, m.seq, m.prev, m.v)); rc.GetCode() != pb.Receipt_PROCESSED {
			t.Fatalf("%s: %v", m.v, rc)
		}
	}
}

// spawnHoldSinkRunAB spawns h's handler as the actor "sink" of n (with
// opts) and runs a and b on its stream (runAB), their receipts in rs.
func spawnHoldSinkRunAB(t *testing.T, n *node.Node, h *holdSink, rs *receipts, opts ...node.SpawnOption) {
	t.Helper()
	if _, err := n.Spawn("sink", h.handler, opts...); err != nil {
		t.Fatal(err)
	}
	runAB(t, n, rs)
}

// waitStarted waits until h's handler holds v.
func waitStarted(t *testing.T, h *holdSink, v string) {
	t.Helper()
	waitClosed(t, h.started[v], v)
}

// waitClosed waits until started, closed by a handler when it holds v, is.
func waitClosed(t *testing.T, started <-chan struct{}, v string) {
	t.Helper()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not start", v)
	}
}

// checkRefusedNotLost sends the refused message again (its CAPACITY is
// not a verdict) as again, and fails if it is answered as delivered
// without having run, or if a message chained behind it (chained, by
// value) ran without it.
func checkRefusedNotLost(t *testing.T, n *node.Node, h interface{ values() []string }, rs *receipts, again *pb.Envelope, refused string, chained ...string) {
	t.Helper()
	again.MsgId = "again"
	rc := rs.deliverWait(t, n, again)
	ran := h.values()
	if slices.Contains(ran, refused) {
		return // it ran: nothing was taken for it
	}
	if code := rc.GetCode(); code == pb.Receipt_DUPLICATE || code == pb.Receipt_PROCESSED {
		t.Errorf("the refused message, sent again, was answered %v (its sender acks it) but never ran; ran %v", code, ran)
	}
	for _, v := range chained {
		if slices.Contains(ran, v) {
			t.Errorf("%s, chained behind the refused message, ran without it (answered %v); ran %v", v, rs.code(v), ran)
		}
	}
}

// holdBatch is a BatchHandler that records the values it ran and holds a
// call holding one of held until it is freed (holds); with counted set,
// it also records how many counted values each call ran (calls).
type holdBatch struct {
	holds
	mu      sync.Mutex
	ran     []string
	sizes   []int
	counted func(v string) bool
}

func newHoldBatch(vals ...string) *holdBatch { return &holdBatch{holds: newHolds(vals...)} }

func (h *holdBatch) handle(_ context.Context, msgs []*node.Message) (int, error) {
	vals := make([]string, len(msgs))
	for i, m := range msgs {
		var v wrapperspb.StringValue
		if err := m.Decode(&v); err != nil {
			return i, err
		}
		vals[i] = v.GetValue()
	}
	for _, v := range vals {
		h.hold(v)
	}
	h.mu.Lock()
	h.ran = append(h.ran, vals...)
	if h.counted != nil {
		if k := len(slices.DeleteFunc(vals, func(v string) bool { return !h.counted(v) })); k > 0 {
			h.sizes = append(h.sizes, k)
		}
	}
	h.mu.Unlock()
	return len(msgs), nil
}

func (h *holdBatch) values() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.ran...)
}

func (h *holdBatch) calls() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]int(nil), h.sizes...)
}

// A batch actor: the restored sender's x (3) is refused for room (its
// sender's share is full: another stream's message holds part of it in a
// batch that runs), then the old sender's c (3) and the restored sender's
// y (4, chained to x) are taken into the mailbox together. What must
// hold: the next batch does not run y beside c (y would be decided
// against the watermark c leaves, before c was compared with x), so y
// does not run in the old history, and x, sent again, is not answered as
// a copy without having run.
func TestRestoredMessageRefusedBeforeABatchTakesTheOldOneIsNotLost(t *testing.T) {
	big := strings.Repeat("x", 2000)
	x := stringEnv(t, 3, 2, big)
	budget := int64(proto.Size(x)) + 10
	n := newNode(t, "n1", t.TempDir(), func(c *node.Config) { c.PeerQueuedBytes = budget })
	h := newHoldBatch("hold")
	defer h.freeAll()
	if _, err := n.Spawn("sink", (&sink{}).handler, node.WithBatch(h.handle, 16)); err != nil {
		t.Fatal(err)
	}
	var rs receipts
	runAB(t, n, &rs)
	other := stringEnv(t, 1, 0, "hold")
	other.StreamEpoch = 7
	n.DeliverIncoming(peerP, other, rs.reply("hold"))
	waitClosed(t, h.started["hold"], "hold")
	n.DeliverIncoming(peerP, x, rs.reply(big))
	testutil.WaitFor(t, 5*time.Second, "x answered", func() bool { return rs.code(big) != 0 })
	if got := rs.code(big); got != pb.Receipt_CAPACITY {
		t.Fatalf("x answered %v, want CAPACITY", got)
	}
	n.DeliverIncoming(peerP, stringEnv(t, 3, 2, "c"), rs.reply("c"))
	n.DeliverIncoming(peerP, stringEnv(t, 4, 3, "y"), rs.reply("y"))
	h.free("hold")
	testutil.WaitFor(t, 10*time.Second, "c and y answered", func() bool {
		return rs.code("c") != 0 && rs.code("y") != 0
	})
	checkRefusedNotLost(t, n, h, &rs, stringEnv(t, 3, 2, big), big, "y")
}

// The refused x is remembered apart from the stream's cached state: a
// stream whose messages wait in a mailbox is not in use, and may leave
// the cache once idle (10 minutes by default, at once here) while the old
// c (3) and the chained y (4) wait behind a slow message of another
// stream. What must hold: c is still compared with x when it runs, so y
// does not run after it in the old history, and x is not lost.
func TestRefusedMessageIsComparedAfterItsStreamLeftTheCache(t *testing.T) {
	for _, evict := range []bool{false, true} {
		t.Run(fmt.Sprintf("evicted=%v", evict), func(t *testing.T) { refusedComparedAfterEviction(t, evict) })
	}
}

func refusedComparedAfterEviction(t *testing.T, evict bool) {
	big := strings.Repeat("x", 2000)
	x := stringEnv(t, 3, 2, big)
	budget := int64(proto.Size(x)) + 10
	n := newNode(t, "n1", t.TempDir(), func(c *node.Config) { c.PeerQueuedBytes = budget })
	h := newHoldSink("hold")
	defer h.freeAll()
	var rs receipts
	queueCBehindAHoldRefuseX(t, n, h, &rs, x, big)
	// c and y wait behind hold past the cache's idle time.
	if evict {
		testutil.WaitFor(t, 5*time.Second, "the stream evicted", func() bool { return n.EvictIdleStreams(0) > 0 })
	}
	h.free("hold")
	testutil.WaitFor(t, 10*time.Second, "c and y answered", func() bool {
		return rs.code("c") != 0 && rs.code("y") != 0
	})
	checkRefusedNotLost(t, n, h, &rs, stringEnv(t, 3, 2, big), big, "y")
}

// A sender restored from a backup whose history gives sequences 3..10 to
// this stream, where the old history gave them to other recipients and
// gave 11 to c: its messages 3..10 are refused for room, then x (11) too;
// y (12, chained to x) is taken. c runs, moving the watermark from 2 to
// 11. What must hold: x is remembered beside the messages refused before
// it, so c is compared with it, y does not run after c in the old
// history, and neither x nor those before it are answered as copies.
func TestRestoredMessageRefusedAfterOthersOfItsHistoryIsNotLost(t *testing.T) {
	for _, first := range []int{10, 3} { // x with one before it, with eight
		t.Run(fmt.Sprintf("first=%d", first), func(t *testing.T) { restoredRefusedAfterOthers(t, first) })
	}
}

func restoredRefusedAfterOthers(t *testing.T, first int) {
	big := func(i int) string { return fmt.Sprintf("%02d", i) + strings.Repeat("x", 2000) }
	x := stringEnv(t, 11, 10, big(11))
	budget := int64(proto.Size(x)) + 10
	n := newNode(t, "n1", t.TempDir(), func(c *node.Config) { c.PeerQueuedBytes = budget })
	h := newHoldSink("c")
	defer h.freeAll()
	var rs receipts
	spawnHoldSinkRunAB(t, n, h, &rs)
	// The old history: c (11), chained to b (2), runs.
	n.DeliverIncoming(peerP, stringEnv(t, 11, 2, "c"), rs.reply("c"))
	waitStarted(t, h, "c")
	// The restored sender's emission: 3..11 big (refused), 12 small.
	for i := first; i <= 11; i++ {
		prev := uint64(i - 1)
		if i == first {
			prev = 0
		}
		n.DeliverIncoming(peerP, stringEnv(t, uint64(i), prev, big(i)), rs.reply(big(i)))
	}
	testutil.WaitFor(t, 5*time.Second, "3..11 answered", func() bool {
		for i := first; i <= 11; i++ {
			if rs.code(big(i)) == 0 {
				return false
			}
		}
		return true
	})
	for i := first; i <= 11; i++ {
		if got := rs.code(big(i)); got != pb.Receipt_CAPACITY {
			t.Fatalf("%d answered %v, want CAPACITY", i, got)
		}
	}
	n.DeliverIncoming(peerP, stringEnv(t, 12, 11, "y"), rs.reply("y"))
	h.free("c")
	testutil.WaitFor(t, 10*time.Second, "c and y answered", func() bool {
		return rs.code("c") != 0 && rs.code("y") != 0
	})
	checkRefusedNotLost(t, n, h, &rs, stringEnv(t, 11, 10, big(11)), big(11), "y")
}

// What the receiver keeps of refused messages is bounded in time: it is
// forgotten once the watermark passes them (the refused message sent
// again and run), and, for a sender that never sends them again, once
// they are older than what it keeps.
func TestRefusedMessagesAreForgottenOncePassedOrOld(t *testing.T) {
	for _, tc := range []struct {
		name   string
		passed bool // x sent again and run; else left to expire
	}{{"passed by the watermark", true}, {"expired", false}} {
		t.Run(tc.name, func(t *testing.T) {
			big := strings.Repeat("x", 2000)
			x := stringEnv(t, 3, 2, big)
			n := newNode(t, "n1", t.TempDir(), func(c *node.Config) { c.PeerQueuedBytes = int64(proto.Size(x)) + 10 })
			h := newHoldSink("c")
			defer h.freeAll()
			var rs receipts
			spawnHoldSinkRunAB(t, n, h, &rs)
			other := stringEnv(t, 1, 0, "c") // another stream's, holding the share
			other.StreamEpoch = 7
			n.DeliverIncoming(peerP, other, rs.reply("c"))
			waitStarted(t, h, "c")
			n.DeliverIncoming(peerP, x, rs.reply(big))
			testutil.WaitFor(t, 5*time.Second, "x refused", func() bool { return rs.code(big) != 0 })
			if got, k := rs.code(big), n.RefusedStreams(); got != pb.Receipt_CAPACITY || k != 1 {
				t.Fatalf("x answered %v, streams with refused messages kept %d; want CAPACITY and 1", got, k)
			}
			n.ExpireRefused(time.Hour)
			if k := n.RefusedStreams(); k != 1 {
				t.Fatalf("a refusal of now forgotten under an hour's keep: %d streams kept", k)
			}
			if !tc.passed {
				testutil.WaitFor(t, 5*time.Second, "the refusal forgotten", func() bool {
					n.ExpireRefused(0)
					return n.RefusedStreams() == 0
				})
				return
			}
			h.free("c")
			again := stringEnv(t, 3, 2, big)
			again.MsgId = "again"
			if rc := rs.deliverWait(t, n, again); rc.GetCode() != pb.Receipt_PROCESSED {
				t.Fatalf("x sent again: %v, want PROCESSED (the same message as the refused one)", rc)
			}
			if k := n.RefusedStreams(); k != 0 {
				t.Fatalf("x ran, yet %d streams' refused messages are kept", k)
			}
		})
	}
}

// queueCBehindAHoldRefuseX spawns h's handler as sink on n and brings
// its stream to where the eviction and expiry tests start: a and b ran;
// another stream's "hold" runs, held, its bytes filling the sender's
// share of the node; the old sender's c (3) waits behind it; the
// restored sender's x (3, of big) is refused for room; y (4, chained to
// x) waits behind c.
func queueCBehindAHoldRefuseX(t *testing.T, n *node.Node, h *holdSink, rs *receipts, x *pb.Envelope, big string) {
	t.Helper()
	spawnHoldSinkRunAB(t, n, h, rs)
	other := stringEnv(t, 1, 0, "hold")
	other.StreamEpoch = 7
	n.DeliverIncoming(peerP, other, rs.reply("hold"))
	waitStarted(t, h, "hold")
	n.DeliverIncoming(peerP, stringEnv(t, 3, 2, "c"), rs.reply("c"))
	n.DeliverIncoming(peerP, x, rs.reply(big))
	testutil.WaitFor(t, 5*time.Second, "x answered", func() bool { return rs.code(big) != 0 })
	if got := rs.code(big); got != pb.Receipt_CAPACITY {
		t.Fatalf("x answered %v, want CAPACITY", got)
	}
	n.DeliverIncoming(peerP, stringEnv(t, 4, 3, "y"), rs.reply("y"))
}
