package node_test

import (
	"context"
	"errors"
	"fmt"
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

// failOnce is a handler (and a BatchHandler) that holds "hold" until
// freed, fails the values in fail the first time it meets them with err,
// and records the values that ran.
type failOnce struct {
	mu      sync.Mutex
	ran     []string
	fail    map[string]bool
	err     error
	started chan struct{}
	release chan struct{}
	once    sync.Once
	freed   sync.Once
}

func newFailOnce(err error, fail ...string) *failOnce {
	f := &failOnce{fail: map[string]bool{}, err: err, started: make(chan struct{}), release: make(chan struct{})}
	for _, v := range fail {
		f.fail[v] = true
	}
	return f
}

func (f *failOnce) free() { f.freed.Do(func() { close(f.release) }) }

func (f *failOnce) values() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.ran...)
}

// run runs v: false when it fails.
func (f *failOnce) run(v string) bool {
	if v == "hold" {
		f.once.Do(func() { close(f.started) })
		<-f.release
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail[v] {
		delete(f.fail, v)
		return false
	}
	f.ran = append(f.ran, v)
	return true
}

func (f *failOnce) handler(_ context.Context, m *node.Message) (proto.Message, error) {
	var v wrapperspb.StringValue
	if err := m.Decode(&v); err != nil {
		return nil, err
	}
	if !f.run(v.GetValue()) {
		return nil, f.err
	}
	return nil, nil
}

func (f *failOnce) batch(_ context.Context, msgs []*node.Message) (int, error) {
	for i, m := range msgs {
		var v wrapperspb.StringValue
		if err := m.Decode(&v); err != nil {
			return i, err
		}
		if !f.run(v.GetValue()) {
			return i, f.err
		}
	}
	return len(msgs), nil
}

// A sender restored from a backup sends x under the sequence (3) of c,
// which its old self sent just before it was lost; the old c reaches the
// actor's mailbox (from a forwarder, or an earlier emission's copy) just
// behind x, and the restored sender's y (4, chained to x) behind c. x is
// taken first and does not run: its handler fails transiently (a timeout
// of its store), its handler says it is itself full (CapacityError), or,
// in a batch, a message of another stream before it fails, so x is "not
// run". What must hold: x's digest is kept as a refusal for room's is,
// so c, moving the watermark to 3, is compared with it; y does not run
// after c in the old history, and x, sent again, is not answered as a
// copy without having run.
func TestRestoredMessageNotRunBeforeTheOldOneRanIsNotLost(t *testing.T) {
	for _, tc := range []struct {
		name  string
		batch bool
		err   error
		fail  string // the value whose run fails
	}{
		{"handler fails transiently", false, errors.New("store timeout"), "x"},
		{"handler full", false, &node.CapacityError{RetryAfter: 10 * time.Millisecond}, "x"},
		{"batch handler fails transiently", true, errors.New("store timeout"), "x"},
		{"batch: not run after another stream's failure", true, errors.New("store timeout"), "o"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t, "n1", t.TempDir(), func(c *node.Config) {})
			f := newFailOnce(tc.err, tc.fail)
			defer f.free()
			opts := []node.SpawnOption{}
			if tc.batch {
				opts = append(opts, node.WithBatch(f.batch, 16))
			}
			if _, err := n.Spawn("sink", f.handler, opts...); err != nil {
				t.Fatal(err)
			}
			var rs receipts
			runAB(t, n, &rs)
			// Another stream's slow message, so that what follows is
			// queued before any of it is taken.
			hold := stringEnv(t, 1, 0, "hold")
			hold.StreamEpoch = 7
			n.DeliverIncoming(peerP, hold, rs.reply("hold"))
			waitClosed(t, f.started, "hold")
			if tc.fail == "o" {
				o := stringEnv(t, 1, 0, "o")
				o.StreamEpoch = 9
				n.DeliverIncoming(peerP, o, rs.reply("o"))
			}
			n.DeliverIncoming(peerP, stringEnv(t, 3, 2, "x"), rs.reply("x")) // restored
			n.DeliverIncoming(peerP, stringEnv(t, 3, 2, "c"), rs.reply("c")) // old
			n.DeliverIncoming(peerP, stringEnv(t, 4, 3, "y"), rs.reply("y")) // restored, chained to x
			f.free()
			testutil.WaitFor(t, 10*time.Second, "x, c and y answered", func() bool {
				return rs.code("x") != 0 && rs.code("c") != 0 && rs.code("y") != 0
			})
			t.Logf("x: %v; c: %v; y: %v", rs.code("x"), rs.code("c"), rs.code("y"))
			if got := rs.code("x"); got == pb.Receipt_PROCESSED || got == pb.Receipt_DUPLICATE {
				t.Fatalf("x answered %v on its first delivery", got)
			}
			checkRefusedNotLost(t, n, f, &rs, stringEnv(t, 3, 2, "x"), "x", "y")
		})
	}
}

// A healthy flood of one stream to a batch actor (a BatchHandler exists
// for handlers with a fixed cost per call, an fsync): the sender's
// emission is larger than the mailbox, so its tail is refused for room,
// as a flood's is, and sent again once room frees. Every message of the
// tail was refused once above the watermark, so each is kept until the
// watermark passes it. What must hold: the tail, all queued at once,
// still runs in one or two batch calls, as the same messages never
// refused do: a batch waits for a comparison only when the message kept
// under its predecessor's sequence is another. Nothing here was
// restored; the copies are the same messages.
func TestRefusedTailOfAHealthyFloodStillRunsInBatches(t *testing.T) {
	const room, tail = 32, 32
	h := newHoldBatch("hold1", "hold2")
	h.counted = func(v string) bool { return len(v) > 0 && v[0] == 'm' }
	n := newNode(t, "n1", t.TempDir(), func(c *node.Config) {})
	defer h.freeAll()
	if _, err := n.Spawn("sink", (&sink{}).handler, node.WithBatch(h.handle, 256), node.WithMailbox(room, mailbox.Reject)); err != nil {
		t.Fatal(err)
	}
	var rs receipts
	val := func(seq uint64) string { return fmt.Sprintf("m%03d", seq) }
	env := func(seq uint64) *pb.Envelope {
		e := stringEnv(t, seq, seq-1, val(seq))
		if seq == 1 {
			e.PrevSequence = 0
		}
		return e
	}
	holdOn := func(v string, epoch uint64) {
		e := stringEnv(t, 1, 0, v)
		e.StreamEpoch = epoch
		n.DeliverIncoming(peerP, e, rs.reply(v))
		waitClosed(t, h.started[v], v)
	}
	// The first emission: 1..room+tail while the actor is busy; the
	// tail is refused for room.
	holdOn("hold1", 7)
	for seq := uint64(1); seq <= room+tail; seq++ {
		n.DeliverIncoming(peerP, env(seq), rs.reply(val(seq)))
	}
	for seq := uint64(room + 1); seq <= room+tail; seq++ {
		if got := rs.code(val(seq)); got != pb.Receipt_CAPACITY {
			t.Fatalf("%s answered %v, want CAPACITY (refused for room)", val(seq), got)
		}
	}
	h.free("hold1")
	testutil.WaitFor(t, 10*time.Second, "the queued messages ran", func() bool { return rs.code(val(room)) == pb.Receipt_PROCESSED })
	first := h.calls()
	// The sender sends the tail again, all of it queued while the actor
	// is busy again.
	holdOn("hold2", 8)
	for seq := uint64(room + 1); seq <= room+tail; seq++ {
		e := env(seq)
		e.MsgId += "-again"
		n.DeliverIncoming(peerP, e, rs.reply(e.MsgId))
	}
	h.free("hold2")
	last := fmt.Sprintf("%s-%d-again", val(room+tail), room+tail)
	testutil.WaitFor(t, 10*time.Second, "the tail ran", func() bool { return rs.code(last) == pb.Receipt_PROCESSED })
	second := h.calls()[len(first):]
	t.Logf("never refused: %d messages in %d calls %v; refused once, then queued together: %d messages in %d calls", room, len(first), first, tail, len(second))
	if len(second) > 2 {
		t.Errorf("the refused tail of a healthy stream, queued at once, ran in %d calls of %v (the same number never refused ran in %d): each refused message is run alone", len(second), second, len(first))
	}
}
