package node_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/mailbox"
	"github.com/meshnode/meshnode/mailbox/pb"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/outbox"
	"github.com/meshnode/meshnode/partition"
	"github.com/meshnode/meshnode/transport"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// peerP is a fake verified sender with its own outbox id.
var peerP = transport.PeerInfo{Name: "p", BootID: "b", OutboxID: [16]byte{'p', 1}}

// receipts collects the receipts of envelopes handed to DeliverIncoming.
type receipts struct {
	mu  sync.Mutex
	got map[string]*pb.Receipt
}

func (r *receipts) reply(id string) func(*pb.Receipt) {
	return func(rc *pb.Receipt) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.got == nil {
			r.got = map[string]*pb.Receipt{}
		}
		r.got[id] = rc
	}
}

func (r *receipts) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.got)
}

// deliverWait hands env to n as peer p's and waits for its receipt.
func (r *receipts) deliverWait(tb testing.TB, n *node.Node, env *pb.Envelope) *pb.Receipt {
	tb.Helper()
	id := env.GetMsgId()
	n.DeliverIncoming(peerP, env, r.reply(id))
	testutil.WaitFor(tb, 5*time.Second, "receipt of "+id, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.got[id] != nil
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.got[id]
}

func (r *receipts) code(id string) pb.Receipt_Code {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.got[id].GetCode()
}

// streamEnv is message seq of peer p's stream to actor@node, chained to prev.
func streamEnv(actor, nodeName string, seq, prev uint64) *pb.Envelope {
	return &pb.Envelope{ProtocolVersion: pb.ProtocolVersion, MsgId: fmt.Sprintf("m%d", seq), Sender: "@p",
		Recipient: actor + "@" + nodeName, Sequence: seq, PrevSequence: prev, Receipt: pb.Envelope_RECEIPT_PROCESSED}
}

// The failure mark that two goroutines overwrote is gone: m1's handler fails,
// m5 is refused at post time while m2 waits, and m2 must still not run
// before m1 has (it is refused OUT_OF_ORDER by the watermark check).
func TestStreamOrderHoldsWhenFailureAndFullMailboxInterleave(t *testing.T) {
	n := startNode(t, "n1", t.TempDir())
	var mu sync.Mutex
	var handled []string
	blockB, blockX := make(chan struct{}), make(chan struct{})
	startedB, startedX := make(chan struct{}), make(chan struct{})
	if _, err := n.Spawn("a", func(_ context.Context, m *node.Message) (proto.Message, error) {
		id := m.Envelope().GetMsgId()
		switch id {
		case "b":
			close(startedB)
			<-blockB
			return nil, nil
		case "x":
			close(startedX)
			<-blockX
			return nil, nil
		}
		mu.Lock()
		handled = append(handled, id)
		mu.Unlock()
		if id == "m1" {
			return nil, errors.New("m1 fails (transient)")
		}
		return nil, nil
	}, node.WithMailbox(3, mailbox.Reject)); err != nil {
		t.Fatal(err)
	}
	var rs receipts
	rel := func(seq, prev uint64) {
		env := streamEnv("a", "n1", seq, prev)
		n.DeliverIncoming(peerP, env, rs.reply(env.GetMsgId()))
	}
	q := transport.PeerInfo{Name: "q", OutboxID: [16]byte{'q'}}
	tell := func(id string) { n.DeliverIncoming(q, &pb.Envelope{MsgId: id, Sender: "@q", Recipient: "a@n1"}, nil) }
	tell("b")
	<-startedB
	rel(1, 0) // mailbox [m1]
	tell("x") // [m1 x]
	rel(2, 1) // [m1 x m2] full
	close(blockB)
	<-startedX // m1 ran and failed; x is in the handler; [m2]
	rel(3, 2)  // [m2 m3]
	rel(4, 3)  // [m2 m3 m4] full
	rel(5, 4)  // refused: CAPACITY
	close(blockX)
	testutil.WaitFor(t, 5*time.Second, "all receipts", func() bool { return rs.len() == 5 })
	mu.Lock()
	defer mu.Unlock()
	for _, h := range handled {
		if h != "m1" {
			t.Fatalf("handler ran %v: a successor of the failed m1 ran before m1 succeeded", handled)
		}
	}
	for id, want := range map[string]pb.Receipt_Code{"m1": pb.Receipt_TRANSIENT, "m2": pb.Receipt_OUT_OF_ORDER,
		"m3": pb.Receipt_OUT_OF_ORDER, "m4": pb.Receipt_OUT_OF_ORDER, "m5": pb.Receipt_CAPACITY} {
		if got := rs.code(id); got != want {
			t.Errorf("%s: receipt %v, want %v", id, got, want)
		}
	}
}

// Under DropOldest, an evicted message's successor may be popped by the
// actor before the eviction is answered; the watermark check, taken when
// the actor takes a message, keeps the order. The test plays the relay for
// sender p: emissions chained by prev_sequence from the first unacked
// message, the next one after all receipts came back.
func TestStreamOrderHoldsUnderDropOldestEvictions(t *testing.T) {
	n := startNode(t, "n1", t.TempDir())
	total := uint64(1000)
	if testing.Short() {
		total = 300
	}
	var mu sync.Mutex
	done := map[uint64]bool{}
	var violation string
	if _, err := n.Spawn("a", func(_ context.Context, m *node.Message) (proto.Message, error) {
		s := m.Sequence()
		mu.Lock()
		defer mu.Unlock()
		if done[s] && violation == "" {
			violation = fmt.Sprintf("seq %d ran twice", s)
		}
		if s > 1 && !done[s-1] && violation == "" {
			violation = fmt.Sprintf("seq %d processed before seq %d", s, s-1)
		}
		done[s] = true
		return nil, nil
	}, node.WithMailbox(2, mailbox.DropOldest)); err != nil {
		t.Fatal(err)
	}
	acked := make([]bool, total+1)
	next := uint64(1)
	deadline := time.Now().Add(60 * time.Second)
	for rounds := 1; next <= total && time.Now().Before(deadline); rounds++ {
		var seqs []uint64
		for s := next; s <= total && len(seqs) < 8; s++ {
			seqs = append(seqs, s)
		}
		type res struct {
			i  int
			rc *pb.Receipt
		}
		ch := make(chan res, len(seqs))
		var prev uint64
		for i, s := range seqs {
			env := streamEnv("a", "n1", s, prev)
			env.MsgId = fmt.Sprintf("m%d-%d", s, rounds)
			prev = s
			n.DeliverIncoming(peerP, env, func(rc *pb.Receipt) { ch <- res{i, rc} })
		}
		for range seqs {
			r := <-ch
			if c := r.rc.GetCode(); c == pb.Receipt_PROCESSED || c == pb.Receipt_DUPLICATE {
				acked[seqs[r.i]] = true
			}
		}
		for next <= total && acked[next] {
			next++
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if violation != "" {
		t.Fatal(violation)
	}
	if next <= total {
		t.Fatalf("only %d of %d acknowledged in time", next-1, total)
	}
}

// End to end through QUIC and the relay: a backlog drained into a small
// mailbox (Reject or DropOldest) whose handler fails some messages once.
// Every value must run successfully for the first time in send order, once.
func TestStreamOrderEndToEnd(t *testing.T) {
	for _, ov := range []mailbox.Overflow{mailbox.Reject, mailbox.DropOldest} {
		t.Run(ov.String(), func(t *testing.T) {
			dir := t.TempDir()
			n1 := startNodeWith(t, "n1", filepath.Join(dir, "n1"), func(c *node.Config) {
				// Failures are frequent here by design; retries need not wait long.
				c.Relay.Backoff = partition.BackoffConfig{Base: 5 * time.Millisecond, Cap: 50 * time.Millisecond}
			})
			// 600 durable sends one after another: generous on a loaded machine.
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			to := node.Addr("sink", "n2")
			total := 600
			if testing.Short() {
				total = 300
			}
			for i := range total {
				if out, err := n1.TellReliable(ctx, to, wrapperspb.String(strconv.Itoa(i))); err != nil || out != node.Queued {
					t.Fatalf("TellReliable = %v, %v", out, err)
				}
			}
			var mu sync.Mutex
			ok := map[int]bool{}
			failedOnce := map[int]bool{}
			var violation string
			n2 := startNode(t, "n2", filepath.Join(dir, "n2"), n1.GossipAddr())
			if _, err := n2.Spawn("sink", func(_ context.Context, m *node.Message) (proto.Message, error) {
				var v wrapperspb.StringValue
				if err := m.Decode(&v); err != nil {
					return nil, err
				}
				i, _ := strconv.Atoi(v.GetValue())
				mu.Lock()
				defer mu.Unlock()
				if ok[i] && violation == "" {
					violation = fmt.Sprintf("value %d ran twice", i)
				}
				if i%7 == 3 && !failedOnce[i] {
					failedOnce[i] = true
					return nil, errors.New("transient")
				}
				if i > 0 && !ok[i-1] && violation == "" {
					violation = fmt.Sprintf("value %d processed before value %d", i, i-1)
				}
				ok[i] = true
				return nil, nil
			}, node.WithMailbox(4, ov)); err != nil {
				t.Fatal(err)
			}
			testutil.WaitFor(t, 90*time.Second, "outbox drained", func() bool { return n1.Outbox().Stats().Depth == 0 })
			mu.Lock()
			defer mu.Unlock()
			if violation != "" {
				t.Fatal(violation)
			}
			if len(ok) != total || n1.Outbox().Stats().DLQDepth != 0 {
				t.Fatalf("processed %d of %d, %d dead letters", len(ok), total, n1.Outbox().Stats().DLQDepth)
			}
		})
	}
}

// Keys are scoped per (sender node, recipient actor) without ambiguity,
// whatever characters names contain: sender x to actor "y>z" and sender
// "x>y" to actor z with the same key are two messages, both run.
func TestIdempotencyKeyScopeIsUnambiguous(t *testing.T) {
	n := startNode(t, "r", t.TempDir())
	var mu sync.Mutex
	runs := map[string]int{}
	h := func(_ context.Context, m *node.Message) (proto.Message, error) {
		mu.Lock()
		runs[m.Recipient().Actor]++
		mu.Unlock()
		return nil, nil
	}
	for _, a := range []string{"y>z", "z"} {
		if _, err := n.Spawn(a, h); err != nil {
			t.Fatal(err)
		}
	}
	var rs receipts
	for _, c := range []struct{ sender, actor string }{{"x", "y>z"}, {"x>y", "z"}} {
		env := streamEnv(c.actor, "r", 1, 0)
		env.IdempotencyKey, env.MsgId, env.Sender = "order-1", c.sender+c.actor, "@"+c.sender
		n.DeliverIncoming(transport.PeerInfo{Name: c.sender, OutboxID: [16]byte{1}}, env, rs.reply(env.GetMsgId()))
		testutil.WaitFor(t, 5*time.Second, "receipt", func() bool { return rs.code(env.GetMsgId()) != 0 })
		if got := rs.code(env.GetMsgId()); got != pb.Receipt_PROCESSED {
			t.Fatalf("%s -> %s: %v, want PROCESSED", c.sender, c.actor, got)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if runs["y>z"] != 1 || runs["z"] != 1 {
		t.Fatalf("runs %v, want one each", runs)
	}
}

// A stream this node forgot (idle past its retention) leaves a horizon:
// a resend of a message that ran before the stream was forgotten (its
// receipt was lost, and its sender's clock undercounted its age) is
// answered FORGOTTEN and not run a second time; a newer message runs.
func TestForgottenStreamRefusesWhatMayHaveRun(t *testing.T) {
	clk := outbox.NewAdjustableClock()
	n := startNodeWith(t, "n1", t.TempDir(), func(c *node.Config) { c.Outbox.Clock = clk })
	var mu sync.Mutex
	runs := map[string]int{}
	if _, err := n.Spawn("a", func(_ context.Context, m *node.Message) (proto.Message, error) {
		mu.Lock()
		runs[fmt.Sprintf("%s#%d", m.Sender().Node, m.Sequence())]++
		mu.Unlock()
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	deliver := func(from transport.PeerInfo, seq, prev uint64) pb.Receipt_Code {
		t.Helper()
		var rs receipts
		env := streamEnv("a", "n1", seq, prev)
		env.Sender = "@" + from.Name
		n.DeliverIncoming(from, env, rs.reply(env.GetMsgId()))
		testutil.WaitFor(t, 5*time.Second, "receipt", func() bool { return rs.len() == 1 })
		return rs.code(env.GetMsgId())
	}
	for _, m := range []struct{ seq, prev uint64 }{{10, 0}, {11, 10}} {
		if c := deliver(peerP, m.seq, m.prev); c != pb.Receipt_PROCESSED {
			t.Fatalf("p#%d: %v", m.seq, c)
		}
	}
	// 31 days pass with nothing on p's stream; another stream's commit
	// prunes p's record, and the idle cache lets it go.
	clk.Advance(31 * 24 * time.Hour)
	q := transport.PeerInfo{Name: "q", OutboxID: [16]byte{'q'}}
	if c := deliver(q, 1, 0); c != pb.Receipt_PROCESSED {
		t.Fatalf("q#1: %v", c)
	}
	if n.EvictIdleStreams(time.Hour) == 0 {
		t.Fatal("p's stream stayed cached")
	}
	if c := deliver(peerP, 11, 0); c != pb.Receipt_FORGOTTEN {
		t.Fatalf("resend of p#11 after its stream was forgotten: %v, want FORGOTTEN", c)
	}
	if c := deliver(peerP, 12, 0); c != pb.Receipt_PROCESSED {
		t.Fatalf("p#12: %v", c)
	}
	mu.Lock()
	defer mu.Unlock()
	for k, want := range map[string]int{"p#10": 1, "p#11": 1, "p#12": 1, "q#1": 1} {
		if runs[k] != want {
			t.Errorf("%s ran %d times, want %d (all runs %v)", k, runs[k], want, runs)
		}
	}
	if s := n.Stats(); s.Forgotten != 1 {
		t.Errorf("Stats.Forgotten %d, want 1", s.Forgotten)
	}
}

// A key the application repeats (it sent the same message again, not
// knowing the first was queued) runs once even when the second copy comes
// right behind the first, while the stream's previous commit is still
// under way and the first copy's key waits for the next one.
func TestRepeatedKeyBehindItsFirstRunsOnce(t *testing.T) {
	n := startNode(t, "r", t.TempDir())
	var mu sync.Mutex
	runs := map[string]int{}
	if _, err := n.Spawn("a", func(_ context.Context, m *node.Message) (proto.Message, error) {
		mu.Lock()
		runs[m.IdempotencyKey()]++
		mu.Unlock()
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	const streams = 20
	var rs receipts
	for i := range streams {
		from := transport.PeerInfo{Name: "p", OutboxID: [16]byte{byte(i + 1)}}
		for seq, key := range []string{"first", "order", "order"} {
			env := streamEnv("a", "r", uint64(seq+1), uint64(seq))
			env.IdempotencyKey, env.MsgId = fmt.Sprintf("%s-%d", key, i), fmt.Sprintf("s%d-m%d", i, seq+1)
			n.DeliverIncoming(from, env, rs.reply(env.GetMsgId()))
		}
	}
	testutil.WaitFor(t, 10*time.Second, "every receipt", func() bool { return rs.len() == 3*streams })
	mu.Lock()
	defer mu.Unlock()
	for i := range streams {
		k := fmt.Sprintf("order-%d", i)
		if runs[k] != 1 {
			t.Errorf("key %s ran %d times", k, runs[k])
		}
		if c := rs.code(fmt.Sprintf("s%d-m3", i)); c != pb.Receipt_DUPLICATE {
			t.Errorf("the repeat of %s: %v, want DUPLICATE", k, c)
		}
	}
}

// The receiver's stream cache keeps a stream until it has been idle for
// the whole idle time (its last use is kept to the second, rounded down),
// and lets it go within a second after. The clock also runs at the real
// rate, so each try reads it around the use and the eviction: a try on
// which the real time that passed made the stream idle long enough after
// all proves nothing and the next try uses a stream of its own.
func TestIdleStreamEvictedNotBeforeItsTime(t *testing.T) {
	clk := outbox.NewAdjustableClock()
	n := startNodeWith(t, "n1", t.TempDir(), func(c *node.Config) { c.Outbox.Clock = clk })
	if _, err := n.Spawn("a", func(context.Context, *node.Message) (proto.Message, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	const idle = 10 * time.Second
	for try := range 5 {
		// the use falls late in a second, 900 ms in
		clk.Advance(time.Duration(1900-n.ElapsedMs()%1000) * time.Millisecond)
		from := transport.PeerInfo{Name: peerP.Name, BootID: peerP.BootID, OutboxID: [16]byte{0x5e, byte(try + 1)}}
		var rs receipts
		env := streamEnv("a", "n1", 1, 0)
		env.Sender = "@" + from.Name
		usedFrom := n.ElapsedMs()
		n.DeliverIncoming(from, env, rs.reply(env.GetMsgId()))
		testutil.WaitFor(t, 5*time.Second, "receipt", func() bool { return rs.len() == 1 })
		usedBy := n.ElapsedMs()
		if c := rs.code(env.GetMsgId()); c != pb.Receipt_PROCESSED {
			t.Fatalf("receipt %v", c)
		}
		clk.Advance(idle - 200*time.Millisecond)
		k := n.EvictIdleStreams(idle)
		if n.ElapsedMs()-usedFrom >= idle.Milliseconds() {
			t.Logf("try %d: the real clock made the stream idle for %v before the eviction ended", try, idle)
			continue
		}
		if k != 0 {
			t.Fatalf("evicted %d streams idle for less than %v", k, idle)
		}
		clk.Advance(1200 * time.Millisecond)
		if n.ElapsedMs()-usedBy < (idle + time.Second).Milliseconds() {
			t.Fatal("the clock went back")
		}
		if k := n.EvictIdleStreams(idle); k != 1 {
			t.Fatalf("evicted %d streams idle for %v + 1 s, want 1", k, idle)
		}
		return
	}
	t.Fatal("every try was too slow to tell")
}
