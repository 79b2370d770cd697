package node_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/outbox"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// replyScenario: n0 sends a reliable request to n1's "svc" (replies to
// n0's "rx"); n1's disk refuses writes, so the reply the handler made
// cannot be stored. The request is resent several times while the disk
// stays full; then the disk takes writes again. svc's handler returns
// handlerErr (nil for a reply, a permanent error for an error reply).
// It returns the handler's runs and what rx received.
func replyScenario(t *testing.T, handlerErr error) (runs int64, got []string) {
	dirs := [2]string{filepath.Join(t.TempDir(), "n0"), filepath.Join(t.TempDir(), "n1")}
	n0 := startNode(t, "n0", dirs[0])
	n1 := startNode(t, "n1", dirs[1], n0.GossipAddr())
	waitAlive(t, []*node.Node{n0, n1}, 2)
	var ran atomic.Int64
	svc, err := n1.Spawn("svc", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		ran.Add(1)
		return wrapperspb.String("charged"), handlerErr
	})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var replies []string
	if _, err := n0.Spawn("rx", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		mu.Lock()
		defer mu.Unlock()
		if m.ReplyError() != nil {
			replies = append(replies, "error")
			return nil, nil
		}
		var v wrapperspb.StringValue
		if err := m.Decode(&v); err != nil {
			return nil, node.Permanent(err)
		}
		replies = append(replies, v.GetValue())
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	restore, hits := faults.FailCommits(filepath.Join(dirs[1], "outbox.db"), errors.New("write outbox.db: no space left on device"))
	defer restore()

	if _, err := n0.TellReliable(ctxT(t), svc, wrapperspb.String("charge 7"), node.WithReplyTo(node.Addr("rx", "n0"))); err != nil {
		t.Fatal(err)
	}
	// The first copy runs the handler and meets the full disk; each resend
	// (about a second apart) meets it again.
	testutil.WaitFor(t, 30*time.Second, "three copies of the request to meet the full disk", func() bool { return hits() >= 3 })
	if r := ran.Load(); r != 1 {
		t.Errorf("while the responder's disk refused its reply, the handler ran %d times, want once", r)
	}
	restore()
	testutil.WaitFor(t, 30*time.Second, "the reply at the requester and both outboxes empty", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(replies) > 0 && n0.Outbox().Stats().Depth == 0 && n1.Outbox().Stats().Depth == 0
	})
	mu.Lock()
	defer mu.Unlock()
	return ran.Load(), append([]string(nil), replies...)
}

// A reliable request's handler ran, but the responder's disk refused to
// store its reply. Running the handler again on every resend until the
// disk takes a reply repeats its effects (a charge made once per second);
// the reply it made is kept and stored when the disk allows.
func TestReplyTheDiskRefusedIsNotMadeAgain(t *testing.T) {
	t.Parallel() // mostly waits on real time: runs beside the other such tests
	runs, got := replyScenario(t, nil)
	if runs != 1 || len(got) != 1 || got[0] != "charged" {
		t.Fatalf("handler ran %d times, requester got %q; want once and [charged]", runs, got)
	}
}

// The same for a handler's permanent error, which comes back as an error
// reply.
func TestErrorReplyTheDiskRefusedIsNotMadeAgain(t *testing.T) {
	t.Parallel() // mostly waits on real time: runs beside the other such tests
	runs, got := replyScenario(t, node.Permanent(errors.New("card declined")))
	if runs != 1 || len(got) != 1 || got[0] != "error" {
		t.Fatalf("handler ran %d times, requester got %q; want once and [error]", runs, got)
	}
}

// heldLog records what a responder ran and what a requester's reply-to
// actor received.
type heldLog struct {
	mu      sync.Mutex
	ran     []string
	replies []string
}

func (l *heldLog) add(to *[]string, v string) {
	l.mu.Lock()
	*to = append(*to, v)
	l.mu.Unlock()
}

func (l *heldLog) snapshot() (ran, replies []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.ran...), append([]string(nil), l.replies...)
}

func (l *heldLog) svc(_ context.Context, m *node.Message) (proto.Message, error) {
	var v wrapperspb.StringValue
	if err := m.Decode(&v); err != nil {
		return nil, node.Permanent(err)
	}
	l.add(&l.ran, v.GetValue())
	return wrapperspb.String("reply to " + v.GetValue()), nil
}

func (l *heldLog) rx(_ context.Context, m *node.Message) (proto.Message, error) {
	var v wrapperspb.StringValue
	if err := m.Decode(&v); err != nil {
		return nil, node.Permanent(err)
	}
	l.add(&l.replies, m.CorrelationID()+"="+v.GetValue())
	return nil, nil
}

// A requester restored from a backup reuses the sequences it had used
// after the backup (TestRestoredSenderStartsANewEpoch): request A at
// sequence s ran on the responder, whose full disk refused A's reply (kept
// in memory, A unacknowledged); the requester is then restored and its new
// request B gets the same sequence s of the same stream and epoch. The
// responder's watermark is below s, so nothing tells the requester its
// state went back, and B must run as any new request does. Looked up by
// (stream, sequence) alone, the kept reply was A's: B's copy stored it and
// B was acknowledged PROCESSED without its handler running (B lost, and a
// reply to a request the restored requester never sent in its place).
func TestKeptReplyIsNotGivenToAnotherRequestAtItsSequence(t *testing.T) {
	dir := t.TempDir()
	clk := clockNotSet() // with a clock, no sequence would go back
	edit := func(c *node.Config) { fastRetries(c); c.Outbox.SequenceBlock = 4; c.Outbox.Clock = clk }
	var l heldLog
	n2 := startNode(t, "n2", filepath.Join(dir, "n2"))
	if _, err := n2.Spawn("svc", l.svc); err != nil {
		t.Fatal(err)
	}
	start1 := func() *node.Node {
		t.Helper()
		n1 := newNode(t, "n1", filepath.Join(dir, "n1"), edit, n2.GossipAddr())
		if _, err := n1.Spawn("rx", l.rx); err != nil {
			t.Fatal(err)
		}
		waitAlive(t, []*node.Node{n1, n2}, 2)
		return n1
	}
	n1 := start1()
	if err := n1.Close(); err != nil {
		t.Fatal(err)
	}
	copyDir(t, filepath.Join(dir, "n1"), filepath.Join(dir, "backup"))
	n1 = start1()

	restore, hits := faults.FailCommits(filepath.Join(dir, "n2", "outbox.db"), errors.New("write outbox.db: no space left on device"))
	defer restore()
	if _, err := n1.TellReliable(ctxT(t), node.Addr("svc", "n2"), wrapperspb.String("A"),
		node.WithReplyTo(node.Addr("rx", "n1")), node.WithCorrelationID("A")); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 15*time.Second, "A to run on n2 and its reply to meet the full disk", func() bool {
		ran, _ := l.snapshot()
		return len(ran) == 1 && hits() >= 1
	})
	if err := n1.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, "n1")); err != nil {
		t.Fatal(err)
	}
	copyDir(t, filepath.Join(dir, "backup"), filepath.Join(dir, "n1"))
	restore()

	n1 = start1()
	if _, err := n1.TellReliable(ctxT(t), node.Addr("svc", "n2"), wrapperspb.String("B"),
		node.WithReplyTo(node.Addr("rx", "n1")), node.WithCorrelationID("B")); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 15*time.Second, "a reply at n1 and both outboxes empty", func() bool {
		_, replies := l.snapshot()
		return len(replies) >= 1 && n1.Outbox().Stats().Depth == 0 && n2.Outbox().Stats().Depth == 0
	})
	ran, replies := l.snapshot()
	if len(ran) != 2 || ran[1] != "B" || len(replies) != 1 || replies[0] != "B=reply to B" {
		t.Fatalf("responder ran %q, requester got %q; want [A B] and [B=reply to B]", ran, replies)
	}
}

// A kept reply is dropped when its request has not come back for an hour
// (its sender gave it up), not an hour after the handler ran: while the
// sender resends and the disk stays full, dropping it would run the
// handler again once an hour. The sender is played by the test: copies at
// 0, 59 and 61 minutes.
func TestKeptReplyOfASenderStillResendingOutlivesAnHour(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "n1")
	n := startNode(t, "n1", dir)
	var runs atomic.Int64
	if _, err := n.Spawn("svc", func(context.Context, *node.Message) (proto.Message, error) {
		runs.Add(1)
		return wrapperspb.String("charged"), nil
	}); err != nil {
		t.Fatal(err)
	}
	restore, _ := faults.FailCommits(filepath.Join(dir, "outbox.db"), errors.New("write outbox.db: no space left on device"))
	defer restore()
	var rs receipts
	copyOf := func(id string) {
		t.Helper()
		env := streamEnv("svc", "n1", 1, 0)
		env.MsgId = id
		env.Rpc = &pb.RpcMeta{Kind: pb.RpcMeta_REQUEST, ReplyTo: "rx@p", CorrelationId: "c1"}
		if c := rs.deliverWait(t, n, env).GetCode(); c != pb.Receipt_CAPACITY {
			t.Fatalf("%s: receipt %v, want CAPACITY (the disk refuses the reply)", id, c)
		}
	}
	copyOf("copy-0m")
	if node.HeldReplies(n) != 1 {
		t.Fatalf("%d replies kept after the first run, want 1", node.HeldReplies(n))
	}
	node.AgeHeldReplies(n, 59*time.Minute)
	copyOf("copy-59m") // the sender is alive
	node.AgeHeldReplies(n, 2*time.Minute)
	copyOf("copy-61m") // still alive, its last copy two minutes ago
	if r := runs.Load(); r != 1 {
		t.Fatalf("the handler ran %d times for one request whose sender resent it all along (last copy 2 min before), want once", r)
	}
}

// The same with the requester played by the test: a restored sender's
// plain reliable tell M at the sequence of a request whose reply is kept
// must run, not be acknowledged with the other request's reply.
func TestKeptReplyIsNotGivenToATellAtItsSequence(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "n1")
	n := startNode(t, "n1", dir)
	var mu sync.Mutex
	var ran []string
	if _, err := n.Spawn("svc", func(_ context.Context, m *node.Message) (proto.Message, error) {
		mu.Lock()
		ran = append(ran, m.Envelope().GetMsgId())
		mu.Unlock()
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	restore, _ := faults.FailCommits(filepath.Join(dir, "outbox.db"), errors.New("write outbox.db: no space left on device"))
	defer restore()
	var rs receipts
	deliver := func(env *pb.Envelope) pb.Receipt_Code { t.Helper(); return rs.deliverWait(t, n, env).GetCode() }
	req := streamEnv("svc", "n1", 1, 0)
	req.MsgId = "request-A"
	req.Rpc = &pb.RpcMeta{Kind: pb.RpcMeta_REQUEST, ReplyTo: "rx@p", CorrelationId: "A"}
	if c := deliver(req); c != pb.Receipt_CAPACITY {
		t.Fatalf("request A: %v, want CAPACITY (reply refused by the disk)", c)
	}
	restore()
	tell := streamEnv("svc", "n1", 1, 0) // the restored sender's next message reuses sequence 1
	tell.MsgId = "tell-M"
	c := deliver(tell)
	mu.Lock()
	defer mu.Unlock()
	if c == pb.Receipt_PROCESSED && (len(ran) != 2 || ran[1] != "tell-M") {
		t.Fatalf("tell M acknowledged %v but the handler ran only %q: M is lost", c, ran)
	}
}

// A reliable request whose handler ran, but whose reply the responder's
// disk refused, is answered CAPACITY: it ran, and the sender waits. When
// its TTL runs out at the sender before a copy gets through, the sender
// must not give it up as "expired" (never sent, never run): its outcome
// is unknown, and the application must not be told it did not happen.
// (Answered NO_SUCH_ACTOR, as it once was, it counted as never run.)
func TestRequestWhoseReplyTheDiskRefusedIsNotGivenUpAsNeverSent(t *testing.T) {
	t.Parallel() // mostly waits on real time: runs beside the other such tests
	dirs := [2]string{filepath.Join(t.TempDir(), "n0"), filepath.Join(t.TempDir(), "n1")}
	n0 := startNodeWith(t, "n0", dirs[0], func(c *node.Config) { c.Outbox.MaxClockSkew = 2 * time.Second })
	n1 := startNode(t, "n1", dirs[1], n0.GossipAddr())
	waitAlive(t, []*node.Node{n0, n1}, 2)
	var ran atomic.Int64
	svc, err := n1.Spawn("svc", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		ran.Add(1)
		return wrapperspb.String("charged"), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n0.Spawn("rx", func(ctx context.Context, m *node.Message) (proto.Message, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	restore, _ := faults.FailCommits(filepath.Join(dirs[1], "outbox.db"), errors.New("write outbox.db: no space left on device"))
	defer restore()

	if _, err := n0.TellReliable(ctxT(t), svc, wrapperspb.String("charge 7"),
		node.WithReplyTo(node.Addr("rx", "n0")), node.WithTTL(1500*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	var dl []outbox.DeadLetter
	testutil.WaitFor(t, 30*time.Second, "the request in the sender's dead-letter queue", func() bool {
		dl, err = n0.Outbox().DeadLetters(outbox.DLQFilter{})
		return err == nil && len(dl) > 0
	})
	if ran.Load() == 0 {
		t.Fatalf("the handler never ran; dead letter %q", dl[0].Reason)
	}
	if dl[0].Reason == outbox.ReasonExpired {
		t.Fatalf("the handler ran %d time(s), but the sender gave the request up as %q (%q: never sent)",
			ran.Load(), dl[0].Reason, "the TTL ran out before the message was ever sent")
	}
}
