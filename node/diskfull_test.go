package node_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnode/meshnode/internal/faults"
	"github.com/meshnode/meshnode/internal/testutil"
	"github.com/meshnode/meshnode/node"
	"github.com/meshnode/meshnode/outbox"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// A receiver whose disk refuses writes cannot make its watermark durable,
// so it cannot say PROCESSED. That is the receiver's trouble, not the
// message's: the sender must wait (uncounted) rather than count it toward
// MaxAttempts and dead-letter a healthy message whose handler succeeded.
// Once the disk takes writes again, the message is delivered and nothing
// is in the dead-letter queue.
func TestReceiverDiskFullDoesNotDeadLetterHealthyMessages(t *testing.T) {
	dirs := [2]string{filepath.Join(t.TempDir(), "n0"), filepath.Join(t.TempDir(), "n1")}
	n0 := startNodeWith(t, "n0", dirs[0], func(cfg *node.Config) {
		cfg.Outbox.MaxAttempts = 2 // two counted failures and the message is poison
	})
	n1 := startNode(t, "n1", dirs[1], n0.GossipAddr())
	waitAlive(t, []*node.Node{n0, n1}, 2)
	var ran atomic.Int64
	to, err := n1.Spawn("w", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		ran.Add(1)
		return nil, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	restore, hits := faults.FailCommits(filepath.Join(dirs[1], "outbox.db"), errors.New("write outbox.db: no space left on device"))
	defer restore()

	out, err := n0.TellReliable(context.Background(), to, wrapperspb.String("healthy"))
	if err != nil {
		t.Fatal(err)
	}
	if out == node.DeadLettered {
		t.Fatal("dead-lettered on the first attempt")
	}
	// Several attempts meet the full disk (the handler runs once; later
	// copies are recognised from the watermark in memory).
	testutil.WaitFor(t, 30*time.Second, "three refused watermark commits at the receiver (or a dead letter)", func() bool {
		return hits() >= 3 || n0.Outbox().Stats().DLQDepth > 0
	})
	if st := n0.Outbox().Stats(); st.DLQDepth != 0 {
		reason := ""
		if dl, err := n0.Outbox().DeadLetters(outbox.DLQFilter{}); err == nil && len(dl) > 0 {
			reason = dl[0].Reason
		}
		t.Fatalf("the receiver's full disk dead-lettered a healthy message: %d dead letters (%q)", st.DLQDepth, reason)
	}
	restore()
	testutil.WaitFor(t, 60*time.Second, "the message to be delivered once the disk takes writes", func() bool {
		return n0.Outbox().Stats().Depth == 0
	})
	if st := n0.Outbox().Stats(); st.DLQDepth != 0 || st.Delivered != 1 {
		t.Fatalf("after the disk recovered: %d dead letters, %d delivered; want 0 and 1", st.DLQDepth, st.Delivered)
	}
	if ran.Load() < 1 {
		t.Fatal("the handler never ran")
	}
}

// keyRuns counts a handler's runs per idempotency key.
type keyRuns struct {
	mu   sync.Mutex
	runs map[string]int
	vals []string
}

func (k *keyRuns) add(key, val string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.runs == nil {
		k.runs = map[string]int{}
	}
	k.runs[key]++
	k.vals = append(k.vals, val)
}

func (k *keyRuns) get(key string) (int, []string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.runs[key], append([]string(nil), k.vals...)
}

func (k *keyRuns) handler() node.Handler {
	return func(ctx context.Context, m *node.Message) (proto.Message, error) {
		var v wrapperspb.StringValue
		if err := m.Decode(&v); err != nil {
			return nil, node.Permanent(err)
		}
		k.add(m.IdempotencyKey(), v.GetValue())
		return nil, nil
	}
}

func (k *keyRuns) batchHandler() node.BatchHandler {
	return func(ctx context.Context, msgs []*node.Message) (int, error) {
		for _, m := range msgs {
			var v wrapperspb.StringValue
			if err := m.Decode(&v); err != nil {
				return 0, node.Permanent(err)
			}
			k.add(m.IdempotencyKey(), v.GetValue())
		}
		return len(msgs), nil
	}
}

// diskFullKeyScenario: the receiver's disk refuses the watermark commit of
// a message that ran under idempotency key K (its handler succeeded, the
// receiver answers CAPACITY and keeps the watermark in memory). The
// application then retries under the same key K (what the key window is
// for): while the disk still refuses writes, or (late) after the disk took
// writes again and the first message was acknowledged. A key runs once per
// (sender node, recipient) within the receiver's key window: the retry is
// answered DUPLICATE, not run. The failed commit's keys stay held and go
// with the stream's next commit; released, the retry would run, and the
// watermark would be made durable without K.
func diskFullKeyScenario(t *testing.T, late bool, spawn func(n *node.Node, k *keyRuns) (node.Address, error)) {
	dirs := [2]string{filepath.Join(t.TempDir(), "n0"), filepath.Join(t.TempDir(), "n1")}
	n0 := startNode(t, "n0", dirs[0])
	n1 := startNode(t, "n1", dirs[1], n0.GossipAddr())
	waitAlive(t, []*node.Node{n0, n1}, 2)
	var k keyRuns
	to, err := spawn(n1, &k)
	if err != nil {
		t.Fatal(err)
	}
	restore, hits := faults.FailCommits(filepath.Join(dirs[1], "outbox.db"), errors.New("write outbox.db: no space left on device"))
	defer restore()

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if out, err := n0.TellReliable(ctx, to, wrapperspb.String("first"), node.WithIdempotencyKey("order-1")); err != nil || out == node.DeadLettered {
		t.Fatalf("TellReliable(first) = %v, %v", out, err)
	}
	testutil.WaitFor(t, 20*time.Second, "the first message to run and its watermark commit to be refused", func() bool {
		n, _ := k.get("order-1")
		return n >= 1 && hits() >= 1
	})
	if late {
		// The disk takes writes again; the first message is acknowledged
		// (its watermark durable, the sender's outbox empty).
		restore()
		testutil.WaitFor(t, 60*time.Second, "the first message to be acknowledged once the disk takes writes", func() bool {
			return n0.Outbox().Stats().Depth == 0
		})
	}
	// The application's own retry of the same thing, under the same key.
	if out, err := n0.TellReliable(ctx, to, wrapperspb.String("retry"), node.WithIdempotencyKey("order-1")); err != nil || out == node.DeadLettered {
		t.Fatalf("TellReliable(retry) = %v, %v", out, err)
	}
	if !late {
		// Let the sender resend both while the disk still refuses writes.
		before := hits()
		testutil.WaitFor(t, 30*time.Second, "the receiver to refuse more watermark commits", func() bool {
			return hits() >= before+2
		})
		restore()
	}
	testutil.WaitFor(t, 60*time.Second, "the sender's outbox to drain", func() bool {
		return n0.Outbox().Stats().Depth == 0
	})
	if n, vals := k.get("order-1"); n != 1 {
		t.Fatalf("idempotency key order-1 ran %d times (values %q), want once: a watermark commit the disk refused lost the key", n, vals)
	}
}

// The retry arrives while the receiver's disk still refuses writes.
func TestKeyOfAnUnrecordedMessageRunsOnce(t *testing.T) {
	diskFullKeyScenario(t, false, func(n *node.Node, k *keyRuns) (node.Address, error) {
		return n.Spawn("w", k.handler())
	})
}

// The same through a WithBatch actor (answerBatch's advance).
func TestKeyOfAnUnrecordedBatchMessageRunsOnce(t *testing.T) {
	diskFullKeyScenario(t, false, func(n *node.Node, k *keyRuns) (node.Address, error) {
		return n.Spawn("w", k.handler(), node.WithBatch(k.batchHandler(), 16))
	})
}

// The retry arrives after the disk recovered and the first message was
// acknowledged: its watermark is on disk, its key is not.
func TestKeyOfAnUnrecordedMessageIsRecordedWhenTheDiskRecovers(t *testing.T) {
	diskFullKeyScenario(t, true, func(n *node.Node, k *keyRuns) (node.Address, error) {
		return n.Spawn("w", k.handler())
	})
}

// The receiver's disk refuses the watermark commit of a message that ran
// under key K; its sender keeps getting CAPACITY until the message's TTL
// runs out and gives it up ("outcome unknown", which is honest). The disk
// then takes writes again, but nothing more comes on that stream. The
// receiver commits again by itself (backing off while the disk refuses):
// its watermark and K become durable and the idle stream can be evicted.
// Past the key window, K is a new request and runs; held in memory for
// good, it would be answered DUPLICATE and lost.
func TestRefusedCommitIsRetriedWithoutACopy(t *testing.T) {
	dirs := [2]string{filepath.Join(t.TempDir(), "n0"), filepath.Join(t.TempDir(), "n1")}
	clk := outbox.NewManualClock(time.Now())
	n0 := startNodeWith(t, "n0", dirs[0], func(cfg *node.Config) { cfg.Outbox.MaxClockSkew = 0 })
	n1 := startNodeWith(t, "n1", dirs[1], func(cfg *node.Config) { cfg.Outbox.Clock = clk }, n0.GossipAddr())
	waitAlive(t, []*node.Node{n0, n1}, 2)
	var k keyRuns
	to, err := n1.Spawn("w", k.handler())
	if err != nil {
		t.Fatal(err)
	}
	restore, hits := faults.FailCommits(filepath.Join(dirs[1], "outbox.db"), errors.New("write outbox.db: no space left on device"))
	defer restore()

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if out, err := n0.TellReliable(ctx, to, wrapperspb.String("first"), node.WithIdempotencyKey("order-1"), node.WithTTL(time.Second)); err != nil || out == node.DeadLettered {
		t.Fatalf("TellReliable(first) = %v, %v", out, err)
	}
	testutil.WaitFor(t, 20*time.Second, "the first message to run, its watermark commit refused, and its sender to give it up at its TTL", func() bool {
		n, _ := k.get("order-1")
		return n == 1 && hits() >= 1 && n0.Outbox().Stats().DLQDepth == 1
	})
	restore()
	clk.Advance(2 * time.Second)
	testutil.WaitFor(t, 20*time.Second, "the idle stream to be evicted once its state is durable", func() bool {
		return n1.EvictIdleStreams(time.Second) > 0
	})
	clk.Advance(25 * time.Hour) // past the receiver's key window (24 h)
	if out, err := n0.TellReliable(ctx, to, wrapperspb.String("a day later"), node.WithIdempotencyKey("order-1")); err != nil || out == node.DeadLettered {
		t.Fatalf("TellReliable(a day later) = %v, %v", out, err)
	}
	testutil.WaitFor(t, 30*time.Second, "the second message to be settled", func() bool {
		return n0.Outbox().Stats().Depth == 0
	})
	if n, vals := k.get("order-1"); n != 2 {
		t.Fatalf("key order-1 sent again 25 h after it ran (window 24 h) ran %d times in all (%q), want 2", n, vals)
	}
}

// With both disks refusing writes, a direct attempt whose handler ran (the
// receiver answers CAPACITY: it could not record the outcome) cannot be
// stored at the sender either. The call fails, and its error must not read
// as if nothing happened: the recipient may have run the message, so an
// application retrying without an idempotency key could run it twice.
func TestUnstoredAfterADirectAttemptSaysTheRecipientMayHaveRunIt(t *testing.T) {
	dirs := [2]string{filepath.Join(t.TempDir(), "n0"), filepath.Join(t.TempDir(), "n1")}
	n0 := startNode(t, "n0", dirs[0])
	n1 := startNode(t, "n1", dirs[1], n0.GossipAddr())
	waitAlive(t, []*node.Node{n0, n1}, 2)
	var ran atomic.Int64
	to, err := n1.Spawn("w", func(ctx context.Context, m *node.Message) (proto.Message, error) {
		ran.Add(1)
		return nil, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The first send reserves a block of sequences on disk; the next ones
	// take theirs from memory.
	if out, err := n0.TellReliable(context.Background(), to, wrapperspb.String("first")); err != nil || out != node.Delivered {
		t.Fatalf("first send: %v, %v; want Delivered", out, err)
	}
	ran.Store(0)
	full := errors.New("no space left on device")
	restore1, _ := faults.FailCommits(filepath.Join(dirs[1], "outbox.db"), full)
	defer restore1()
	restore0, _ := faults.FailCommits(filepath.Join(dirs[0], "outbox.db"), full)
	defer restore0()

	_, err = n0.TellReliable(context.Background(), to, wrapperspb.String("ran, unrecorded"))
	if err == nil {
		t.Fatal("TellReliable succeeded though neither disk takes writes")
	}
	if ran.Load() != 1 {
		t.Fatalf("the handler ran %d times, want once (the direct attempt); err %v", ran.Load(), err)
	}
	if !strings.Contains(err.Error(), "may have run") {
		t.Fatalf("error %q does not say the recipient may have run the message", err)
	}
	t.Logf("error: %v", err)
}
