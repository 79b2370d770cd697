package node_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// batchRecorder is a BatchHandler that records each call's message ids and
// can be held on its first call and told how a call ends.
type batchRecorder struct {
	hold    chan struct{} // the first call waits for it to close (nil: no wait)
	started chan struct{} // closed when the first call starts
	outcome func(call int, ids []string) (int, error)

	mu    sync.Mutex
	calls [][]string
	ran   []string // ids that took effect, in order
}

func newBatchRecorder() *batchRecorder {
	return &batchRecorder{hold: make(chan struct{}), started: make(chan struct{})}
}

func (r *batchRecorder) handle(_ context.Context, msgs []*node.Message) (int, error) {
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.ID()
	}
	r.mu.Lock()
	call := len(r.calls)
	r.calls = append(r.calls, ids)
	r.mu.Unlock()
	if call == 0 {
		close(r.started)
		<-r.hold
	}
	done, err := len(msgs), error(nil)
	if r.outcome != nil {
		done, err = r.outcome(call, ids)
	}
	r.mu.Lock()
	r.ran = append(r.ran, ids[:done]...)
	r.mu.Unlock()
	return done, err
}

func (r *batchRecorder) snapshot() (calls [][]string, ran []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]string(nil), r.calls...), append([]string(nil), r.ran...)
}

func noHandler(context.Context, *node.Message) (proto.Message, error) {
	return nil, errors.New("the Handler must not run")
}

// The messages waiting behind a running batch form the next batch, in
// order, and a message that depends on the batch's outcome (a resend of one
// in it) waits for it and is then answered DUPLICATE.
func TestBatchHandlerTakesWhatWaits(t *testing.T) {
	n := startNode(t, "n1", t.TempDir())
	r := newBatchRecorder()
	if _, err := n.Spawn("a", noHandler, node.WithBatch(r.handle, 0)); err != nil {
		t.Fatal(err)
	}
	var rs receipts
	rel := func(seq, prev uint64, id string) {
		env := streamEnv("a", "n1", seq, prev)
		env.MsgId = id
		n.DeliverIncoming(peerP, env, rs.reply(id))
	}
	rel(1, 0, "m1")
	<-r.started
	for seq := uint64(2); seq <= 5; seq++ {
		rel(seq, seq-1, fmt.Sprint("m", seq))
	}
	rel(3, 2, "m3-again") // a resend of m3: decided only after m3's batch
	rel(6, 5, "m6")
	close(r.hold)
	testutil.WaitFor(t, 5*time.Second, "all receipts", func() bool { return rs.len() == 7 })
	calls, ran := r.snapshot()
	if got := fmt.Sprint(calls); got != "[[m1] [m2 m3 m4 m5] [m6]]" {
		t.Fatalf("batches %s, want [[m1] [m2 m3 m4 m5] [m6]]", got)
	}
	if got := fmt.Sprint(ran); got != "[m1 m2 m3 m4 m5 m6]" {
		t.Fatalf("ran %s", got)
	}
	for _, id := range []string{"m1", "m2", "m3", "m4", "m5", "m6"} {
		if c := rs.code(id); c != pb.Receipt_PROCESSED {
			t.Errorf("%s: receipt %v, want PROCESSED", id, c)
		}
	}
	if c := rs.code("m3-again"); c != pb.Receipt_DUPLICATE {
		t.Errorf("m3-again: receipt %v, want DUPLICATE", c)
	}
}

// A batch that stops part way: the messages before the failure are
// processed, the failed one gets its error's receipt and the ones after it
// were not run and are sent back as CAPACITY (no attempt counted).
func TestBatchHandlerPartialFailure(t *testing.T) {
	n := startNode(t, "n1", t.TempDir())
	r := newBatchRecorder()
	r.outcome = func(call int, ids []string) (int, error) {
		if call == 1 {
			return 1, errors.New("disk hiccup")
		}
		return len(ids), nil
	}
	rs := batchOfFour(t, n, r)
	wantCodes(t, rs, map[string]pb.Receipt_Code{"m1": pb.Receipt_PROCESSED, "m2": pb.Receipt_PROCESSED,
		"m3": pb.Receipt_TRANSIENT, "m4": pb.Receipt_CAPACITY})
	// m3 again: it runs now, since m2 is the watermark.
	var again receipts
	n.DeliverIncoming(peerP, streamEnv("a", "n1", 3, 2), again.reply("m3"))
	testutil.WaitFor(t, 5*time.Second, "receipt", func() bool { return again.len() == 1 })
	if c := again.code("m3"); c != pb.Receipt_PROCESSED {
		t.Fatalf("m3 resent: %v, want PROCESSED", c)
	}
}

// A panic finds its message by running the batch one by one: only that
// message is dead-lettered (REJECTED); the one after it is not run.
func TestBatchHandlerPanicRejectsOnlyItsMessage(t *testing.T) {
	n := startNode(t, "n1", t.TempDir())
	r := newBatchRecorder()
	r.outcome = func(_ int, ids []string) (int, error) {
		for _, id := range ids {
			if id == "m3" {
				panic("poison")
			}
		}
		return len(ids), nil
	}
	rs := batchOfFour(t, n, r)
	wantCodes(t, rs, map[string]pb.Receipt_Code{"m1": pb.Receipt_PROCESSED, "m2": pb.Receipt_PROCESSED,
		"m3": pb.Receipt_REJECTED, "m4": pb.Receipt_CAPACITY})
}

// End to end: a backlog drained into a batch actor arrives complete, in
// order, once each; tell and ask still reach the Handler.
func TestBatchHandlerDrainsBacklog(t *testing.T) {
	nodes := cluster(t, 2)
	ctx := ctxT(t)
	peer := stopPeer(t, nodes[0], nodes[1])
	to := node.Addr("inbox", peer)
	const total = 300
	for i := range total {
		if _, err := nodes[0].TellReliable(ctx, to, wrapperspb.String(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	var got []string
	maxBatch := 0
	n2 := startNode(t, peer, t.TempDir(), nodes[0].GossipAddr())
	if _, err := n2.Spawn("inbox", echo, node.WithBatch(func(_ context.Context, msgs []*node.Message) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		maxBatch = max(maxBatch, len(msgs))
		for _, m := range msgs {
			var v wrapperspb.StringValue
			if err := m.Decode(&v); err != nil {
				return 0, node.Permanent(err)
			}
			got = append(got, v.GetValue())
		}
		return len(msgs), nil
	}, 64)); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, "backlog drained", func() bool { return nodes[0].Outbox().Stats().Depth == 0 })
	mu.Lock()
	if len(got) != total {
		t.Fatalf("handled %d, want %d", len(got), total)
	}
	for i, v := range got {
		if v != fmt.Sprint(i) {
			t.Fatalf("message %d is %s: order broken or repeated", i, v)
		}
	}
	t.Logf("largest batch %d", maxBatch)
	mu.Unlock()
	var reply wrapperspb.StringValue
	if err := nodes[0].Ask(ctx, to, wrapperspb.String("ping"), &reply); err != nil || reply.GetValue() != "echo:ping" {
		t.Fatalf("ask to a batch actor = %q, %v", reply.GetValue(), err)
	}
}

// batchOfFour spawns actor "a" with r as its batch handler, delivers m1..m4
// of one stream (m2..m4 queue while r holds the call of m1), lets r go and
// waits for the four receipts.
func batchOfFour(t *testing.T, n *node.Node, r *batchRecorder) *receipts {
	t.Helper()
	if _, err := n.Spawn("a", noHandler, node.WithBatch(r.handle, 0)); err != nil {
		t.Fatal(err)
	}
	rs := &receipts{}
	for seq := uint64(1); seq <= 4; seq++ {
		env := streamEnv("a", "n1", seq, seq-1)
		n.DeliverIncoming(peerP, env, rs.reply(env.GetMsgId()))
		if seq == 1 {
			<-r.started
		}
	}
	close(r.hold)
	testutil.WaitFor(t, 5*time.Second, "all receipts", func() bool { return rs.len() == 4 })
	return rs
}

// wantCodes checks the receipt code of each message id.
func wantCodes(t *testing.T, rs *receipts, want map[string]pb.Receipt_Code) {
	t.Helper()
	for id, c := range want {
		if got := rs.code(id); got != c {
			t.Errorf("%s: receipt %v, want %v", id, got, c)
		}
	}
}
